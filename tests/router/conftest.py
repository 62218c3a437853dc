"""The router under test runs for real: uvicorn serving llmgw_console.asgi in a thread of the
test process (so it reads the same test database), in front of real HTTP engines
(tests/router/upstream.py), counting in a real Redis (a database of its own, not the fleet tests' one:
LLMGW_TEST_ROUTER_REDIS_URL, default redis://127.0.0.1:6379/12)."""

from __future__ import annotations

import os
import socket
import threading
import time

import httpx
import pytest
import redis
import uvicorn
from django.utils import timezone

from .upstream import FakeEngine

TEST_REDIS_URL = os.environ.get("LLMGW_TEST_ROUTER_REDIS_URL", "redis://127.0.0.1:6379/12")

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def router_url():
    """The web process's ASGI app (router first, Django behind it) under uvicorn."""
    from llmgw_console.asgi import application

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True, name="router-uvicorn")
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def counts(settings):
    """The Redis the router counts in-flight requests in, emptied of the counts before and after."""
    settings.REDIS_URL = TEST_REDIS_URL
    settings.LLMGW_ROUTER_REDIS_URL = TEST_REDIS_URL
    client = redis.Redis.from_url(TEST_REDIS_URL, decode_responses=True)

    def clear():
        keys = list(client.scan_iter("llmgw:inflight:*"))
        if keys:
            client.delete(*keys)

    clear()
    yield client
    clear()
    client.close()


@pytest.fixture
def router(router_url, counts, transactional_db):
    """An httpx client to the running router, with the counts and the database in place."""
    with httpx.Client(base_url=router_url, timeout=30) as client:
        yield client


@pytest.fixture
def engines():
    """Start fake engines: engines("a", "b") -> [FakeEngine, FakeEngine]; all stopped afterwards."""
    started: list[FakeEngine] = []

    def start(*names, **kw):
        new = [FakeEngine(name, **kw).start() for name in names]
        started.extend(new)
        return new

    yield start
    for engine in started:
        engine.stop()


@pytest.fixture
def make_model(transactional_db, counts):  # counts first: saves bump the routes' version in its Redis
    """make_model("m", max_output=8, replicas=[(engine_or_url, "ready"), …]) -> (Model, [Replica, …])."""
    from catalog.models import Model, Node, Profile, Replica

    node = Node.objects.create(name="test-node")

    def make(name, *, max_output=0, context_length=4096, replicas=()):
        model = Model.objects.create(name=name, context_length=context_length, max_output=max_output)
        profile = Profile.objects.create(model=model, name="cpu", engine="llamacpp", cpu_only=True)
        rows = []
        for slot, (target, state) in enumerate(replicas):
            url = target if isinstance(target, str) else target.url
            rows.append(Replica.objects.create(profile=profile, node=node, slot=slot, endpoint=url, state=state,
                                               started_at=timezone.now()))
        return model, rows

    return make


@pytest.fixture
def api_key(transactional_db, counts):
    """A key for every model: (ApiKey, the key)."""
    from router.models import ApiKey

    return ApiKey.issue("tests")


@pytest.fixture
def auth(api_key):
    return {"authorization": f"Bearer {api_key[1]}"}


def chat(model="m", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def inflight(client: redis.Redis, replica) -> int:
    return int(client.get(f"llmgw:inflight:{replica.pk}") or 0)


def settled(client: redis.Redis, replica, expected: int = 0, timeout: float = 3.0) -> int:
    """The replica's in-flight count once it reaches `expected` (or the timeout passes). The
    router lowers it just after the answer has gone out, so a client may see it a moment later."""
    deadline = time.monotonic() + timeout
    while (value := inflight(client, replica)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return value
