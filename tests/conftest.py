import pytest
from django.contrib.auth.models import Permission, User


@pytest.fixture
def admin_user(db):
    return User.objects.create_superuser("root", "root@example.com", "pw-root-123")


@pytest.fixture
def operator(db):
    """A staff user with the permission to change contexts."""
    user = User.objects.create_user("operator", password="pw-operator-123", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_context"))
    return user


@pytest.fixture
def viewer(db):
    """A logged-in user who may read everything and change nothing."""
    return User.objects.create_user("viewer", password="pw-viewer-123")


def pytest_collection_modifyitems(config, items):
    """Browser tests last: Playwright keeps an event loop running in the main thread from its
    first test to the end of the session, and Django's async views (the router's) cannot be
    called through the test client while it runs."""
    items.sort(key=lambda item: "/tests/browser/" in str(item.path).replace("\\", "/"))
