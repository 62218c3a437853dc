import pytest
from django.test import Client

from catalog import services
from tests.browser.database import django_db_modify_db_settings  # noqa: F401 - same database as tests/browser
from tests.builders import make_model, use_shape


@pytest.fixture
def enqueued(monkeypatch):
    """Rollouts handed to Celery (no broker here: the rollout has its own tests)."""
    calls = []
    monkeypatch.setattr(services, "_enqueue_rollout", calls.append)
    return calls


@pytest.fixture
def model(monkeypatch, enqueued):
    """llama-8b served by llama.cpp on an A100-80G, vLLM on two, and llama.cpp on CPUs; its
    shape is a Llama-like 8B (no network)."""
    use_shape(monkeypatch)
    return make_model()


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator_client(operator):
    return login(operator)


@pytest.fixture
def viewer_client(viewer):
    return login(viewer)


HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """The users' fixtures hash passwords; PBKDF2's cost is not what these tests are about."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
