import os

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User

from catalog import services


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    """A test database other processes can open (Celery workers, engines' reconcile, the
    router's threads, subprocesses): a file rather than SQLite's in-memory one, whose shared
    cache also answers "table is locked" to a reader while another connection writes; on
    PostgreSQL a name of this run's own, so two runs on one server never drop each other's."""
    db = settings.DATABASES["default"]
    test = db.setdefault("TEST", {})
    if test.get("NAME"):
        return
    if db["ENGINE"].endswith("sqlite3"):
        test["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")
    else:
        test["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


@pytest.fixture(autouse=True)
def _fresh_plan_inputs():
    """Each test starts with no kept planning inputs: the database a test rolls back sends no
    signal, so a model of the previous test could otherwise be kept under the same name."""
    from catalog import plan_inputs

    plan_inputs.clear()
    yield
    plan_inputs.clear()


@pytest.fixture
def enqueued(monkeypatch):
    """The rollouts handed to Celery, recorded instead (no broker, no worker: the rollout
    has its own tests in tests/fleet)."""
    calls = []
    monkeypatch.setattr(services, "_enqueue_rollout", calls.append)
    return calls


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
