import pytest
from django.test import Client

from tests.builders import make_model, use_shape


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
