"""catalog.plan_inputs: what a preview plans from is kept between previews, and dropped as
soon as the catalog changes: in this process at once, in the others through Redis."""

import time
import uuid

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog import plan_inputs, services
from catalog.models import Profile
from tests.builders import make_model, use_shape

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(monkeypatch):
    use_shape(monkeypatch)
    return make_model()


@pytest.fixture
def listener():
    """A listener started for this test (with its settings), stopped after it."""
    plan_inputs.stop_listening()
    yield
    plan_inputs.stop_listening()


def wait_listening(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not plan_inputs._listening:
        assert time.monotonic() < deadline, "the listener did not subscribe"
        time.sleep(0.01)


def gguf_args(plan) -> list[str]:
    return list(next(p for p in plan.profiles if p.profile == "gguf").args_before)


def queries_of(fn) -> int:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return len(ctx.captured_queries)


def test_a_preview_plans_from_what_it_kept_while_nothing_changes(model, listener):
    services.preview(model.name, tokens=4096)
    wait_listening()
    assert queries_of(lambda: services.preview(model.name, tokens=4096)) > 0  # kept from now on
    assert queries_of(lambda: services.preview(model.name, tokens=16384)) == 0
    assert queries_of(lambda: services.preview(model.name, max_output=1024)) == 0


def test_a_save_in_this_process_is_previewed_at_once(model, listener):
    services.preview(model.name, tokens=4096)
    wait_listening()
    services.preview(model.name, tokens=4096)
    profile = Profile.objects.get(model=model, name="gguf")
    profile.args = ["-m", "/models/other.gguf", "--ctx-size", "4096", "--parallel", "1"]
    profile.save()
    assert gguf_args(services.preview(model.name, tokens=4096))[1] == "/models/other.gguf"


def test_a_change_another_process_announces_is_previewed_without_waiting_for_the_entry_to_expire(
    model, listener, settings
):
    settings.LLMGW_PLAN_INPUTS_SECONDS = 60.0
    services.preview(model.name, tokens=4096)
    wait_listening()
    services.preview(model.name, tokens=4096)
    # Another process's write: this process sees no signal of it, only its message on Redis.
    Profile.objects.filter(model=model, name="gguf").update(args=["-m", "/models/elsewhere.gguf"])
    assert gguf_args(services.preview(model.name, tokens=4096))[1] == f"/models/{model.name}.gguf"  # kept
    redis.Redis.from_url(settings.REDIS_URL).publish(plan_inputs.CHANNEL, b"")
    deadline = time.monotonic() + 5
    while gguf_args(services.preview(model.name, tokens=4096))[1] != "/models/elsewhere.gguf":
        assert time.monotonic() < deadline, "the message did not drop the kept inputs"
        time.sleep(0.01)


def test_a_write_nobody_announces_is_seen_once_the_entry_expires(model, listener, settings):
    settings.LLMGW_PLAN_INPUTS_SECONDS = 0.3
    services.preview(model.name, tokens=4096)
    wait_listening()
    services.preview(model.name, tokens=4096)
    Profile.objects.filter(model=model, name="gguf").update(args=["-m", "/models/quiet.gguf"])
    assert gguf_args(services.preview(model.name, tokens=4096))[1] == f"/models/{model.name}.gguf"
    time.sleep(0.35)
    assert gguf_args(services.preview(model.name, tokens=4096))[1] == "/models/quiet.gguf"


def test_a_save_tells_the_other_processes_at_the_save_and_at_the_commit(
    model, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(plan_inputs, "CHANNEL", f"{plan_inputs.CHANNEL}:{uuid.uuid4()}")  # this test's alone
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(plan_inputs.CHANNEL)
    assert pubsub.get_message(timeout=2) is None  # the subscription's confirmation, ignored
    with django_capture_on_commit_callbacks(execute=True):
        Profile.objects.filter(model=model, name="gguf").get().save()
        first = pubsub.get_message(timeout=2)
        assert first is not None and first["type"] == "message"
        assert pubsub.get_message(timeout=0.2) is None  # not committed yet
    second = pubsub.get_message(timeout=2)
    assert second is not None and second["type"] == "message"
    pubsub.close()


def test_without_redis_every_preview_reads_the_catalog_and_is_right(model, listener, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    for tokens in (4096, 8192):
        assert queries_of(lambda: services.preview(model.name, tokens=tokens)) > 0
    Profile.objects.filter(model=model, name="gguf").update(args=["-m", "/models/seen.gguf"])
    assert gguf_args(services.preview(model.name, tokens=4096))[1] == "/models/seen.gguf"
    assert not plan_inputs._listening


def test_zero_seconds_keeps_nothing(model, listener, settings):
    settings.LLMGW_PLAN_INPUTS_SECONDS = 0
    services.preview(model.name, tokens=4096)
    assert queries_of(lambda: services.preview(model.name, tokens=4096)) > 0


def test_a_forked_child_keeps_nothing_of_its_parent_and_will_listen_for_itself(model, listener):
    """A worker forked from a process that previewed (gunicorn's, Celery's prefork) has
    no listener thread: it must not trust the parent's entries, nor think it listens."""
    import os

    services.preview(model.name, tokens=4096)
    wait_listening()
    services.preview(model.name, tokens=4096)
    assert plan_inputs._entries and plan_inputs._listener is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave whatever happens, running nothing of pytest's
        try:
            state = (plan_inputs._listener is None, not plan_inputs._entries, not plan_inputs._listening)
            os.write(write, repr(state).encode())
        finally:
            os._exit(0)
    os.close(write)
    report = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    assert report == "(True, True, True)"
    assert plan_inputs._listening and plan_inputs._entries  # the parent's are untouched
