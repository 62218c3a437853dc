"""The whole way in a browser: type a context, submit, and follow the rollout to its end,
with real llama-server replicas restarted one at a time by a real Celery worker."""

from __future__ import annotations

import os
import re

import httpx
import pytest
from django.conf import settings
from playwright.sync_api import expect

from catalog import fleet
from catalog.choices import ReplicaState
from catalog.fleet import local
from catalog.fleet.tiny_gguf import write_tiny_llama
from catalog.models import Change, Model, Node, Profile, Replica

# The fleet tests' real parts: a private Redis database and default queue for this process
# and its worker (their autouse fixture, so for these tests too), the worker subprocess, and
# the test database as a DATABASE_URL.
from tests.fleet.conftest import (  # noqa: F401 - _private_redis_and_queue is an autouse fixture
    FLEET_SETTINGS,
    TEST_QUEUE,
    TEST_REDIS_URL,
    Worker,
    _private_redis_and_queue,
    database_url,
)
from tests.fleet.helpers import up

from .conftest import DESKTOP, log_in

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]

OLD = ["--ctx-size", "2048", "--parallel", "2", "--threads", "1"]


def _redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(TEST_REDIS_URL, socket_timeout=2).ping())
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture
def mirror(settings, tmp_path):
    root = tmp_path / "mirror"
    root.mkdir()
    settings.LLMGW_MIRROR_ROOT = root
    write_tiny_llama(root / "tiny-llama.gguf", context_length=16384)
    return root


@pytest.fixture
def llama_server_bin():
    from catalog.fleet import engines

    try:
        return engines.llama_server_binary()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no llama-server: {e}")


@pytest.fixture
def worker(transactional_db, tmp_path, mirror, llama_server_bin):
    if not _redis_up():
        pytest.skip(f"no Redis at {TEST_REDIS_URL}")
    env = dict(
        os.environ, DJANGO_SETTINGS_MODULE="llmgw_console.settings", DATABASE_URL=database_url(),
        REDIS_URL=TEST_REDIS_URL, CELERY_RESULT_BACKEND=TEST_REDIS_URL, LLMGW_CELERY_QUEUE=TEST_QUEUE,
        LLMGW_DATA=str(settings.DATA_DIR), LLMGW_MIRROR_ROOT=str(mirror), PYTHONUNBUFFERED="1", **FLEET_SETTINGS,
    )
    w = Worker("console-rollout", [TEST_QUEUE], "solo", tmp_path / "worker.log", env).wait_ready()
    yield w
    w.stop()
    for p in local.engine_processes():  # nothing of this test left running
        local.kill_group(p["pid"], 2.0)


def test_submit_follows_the_rollout_to_the_end(page, live_server, operator, worker, shot):
    node = Node.objects.create(name="local", backend="local", host="127.0.0.1")
    model = Model.objects.create(name="tiny", source="tiny-llama.gguf", context_length=1024, max_output=256)
    profile = Profile.objects.create(model=model, name="cpu", engine="llamacpp", args=list(OLD), cpu_only=True)
    olds = up(profile, node, 2)

    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    page.goto(f"{live_server.url}/models/tiny/")
    page.click("#context > summary")
    page.fill("#id_tokens", "2048")
    page.fill("#id_message", "longer prompts")
    plan = page.locator("#plan")
    expect(plan).to_contain_text("1024 → 2048")
    expect(plan.locator('[data-profile="cpu"] .arg.changed').first).to_contain_text("4096")
    expect(plan.locator('[data-profile="cpu"]')).to_contain_text("GB of RAM")  # read from the GGUF's header
    expect(page.locator("#context-submit")).to_be_enabled()
    shot(page, "rollout-plan", element="#context")
    page.click("#context-submit")

    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    expect(page.locator(".steps")).to_contain_text("Replica 1 of 2", timeout=30_000)
    shot(page, "rollout-running")
    expect(page.locator("#change-state")).to_have_text("Succeeded", timeout=180_000)
    expect(page.locator(".step.step-done")).to_have_count(2)
    expect(page.locator("#change-live")).to_contain_text("2 of 2 replicas done")
    shot(page, "rollout-done")

    change = Change.objects.get()
    assert (change.state, change.source, change.message) == ("succeeded", "console", "longer prompts")
    ready = list(Replica.objects.filter(profile=profile, state=ReplicaState.READY))
    assert len(ready) == 2 and not {r.pk for r in ready} & {r.pk for r in olds}
    for r in ready:
        assert r.args[-6:] == ["--ctx-size", "4096", "--parallel", "2", "--threads", "1"]
        props = httpx.get(r.endpoint + "/props", timeout=5).json()
        assert props["default_generation_settings"]["n_ctx"] == 2048  # per slot: the new context
    assert set(Replica.objects.filter(pk__in=[o.pk for o in olds]).values_list("state", flat=True)) == {"stopped"}

    # The model page shows the new replicas ready, each with its log.
    page.goto(f"{live_server.url}/models/tiny/")
    for r in ready:
        expect(page.locator(f'a[href="/replicas/{r.pk}/log/"]')).to_be_visible()
    page.click(f'a[href="/replicas/{ready[0].pk}/log/"]')
    expect(page.locator("pre.log")).not_to_be_empty()
    shot(page, "rollout-replica-log")
    for r in ready:
        fleet.stop(r)


def test_a_failed_rollout_shows_the_engine_log_and_rolls_back(page, live_server, operator, worker, mirror, shot):
    node = Node.objects.create(name="local", backend="local", host="127.0.0.1")
    model = Model.objects.create(name="tiny", source="tiny-llama.gguf", context_length=1024, max_output=256)
    profile = Profile.objects.create(model=model, name="cpu", engine="llamacpp", args=list(OLD), cpu_only=True)
    olds = up(profile, node, 2)
    # The running engines have the model in memory; a new one will not load this file.
    weights = mirror / "tiny-llama.gguf"
    good = weights.read_bytes()
    weights.write_bytes(b"GGUF" + b"\0" * 64)

    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    page.goto(f"{live_server.url}/models/tiny/")
    page.click("#context > summary")
    page.fill("#id_tokens", "2048")
    expect(page.locator("#plan")).to_contain_text("its header could not be read")  # said once, in words
    expect(page.locator("#context-submit")).to_be_enabled()
    page.click("#context-submit")
    page.wait_for_url(re.compile(r"/changes/\d+/$"))

    expect(page.locator("#change-state")).to_have_text("Failed", timeout=120_000)
    failed_step = page.locator(".step.step-failed")
    expect(failed_step).to_have_count(1)
    expect(failed_step.locator("pre.log")).not_to_be_empty()  # the engine's last log lines
    expect(page.locator(".step").nth(1)).to_contain_text("Pending")  # the rollout stopped there
    shot(page, "rollout-failed")
    assert set(Replica.objects.filter(pk__in=[o.pk for o in olds]).values_list("state", flat=True)) == {"ready"}

    weights.write_bytes(good)
    page.fill(".rollback input[name=message]", "the new replica did not load")
    page.click(".rollback button")
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    expect(page.locator("#change-state")).to_have_text("Succeeded", timeout=120_000)
    expect(page.locator("#change-live")).to_contain_text("Rolling back change")
    shot(page, "rollback-done")

    rollback = Change.objects.get(kind="rollback")
    assert rollback.rollback_of.state in ("failed", "rolled_back") and rollback.message == "the new replica did not load"
    model.refresh_from_db()
    assert model.context_length == 1024
    ready = Replica.objects.filter(profile=profile, state=ReplicaState.READY)
    assert ready.count() == 2 and all(r.args[-6:] == OLD for r in ready)
    for r in ready:
        fleet.stop(r)
