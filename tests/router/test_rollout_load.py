"""A constant load of concurrent requests through the router while a context change restarts
the model's 3 real llama-server replicas one by one: not one request fails.

Real parts throughout: llama-server processes on a tiny GGUF (the fleet's local backend), the
fleet's rollout (catalog.rollout.run, here in a thread of the test process instead of a
Celery worker: same code, same database file, same Redis), the router under uvicorn, Redis.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .conftest import chat, settled

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

OLD = ["--ctx-size", "1024", "--parallel", "2", "--threads", "1"]
NEW = ["--ctx-size", "2048", "--parallel", "2", "--threads", "1"]
CLIENTS = 4  # 2 cores: a steady load, not a stress test


def _fleet_or_skip():
    try:
        from catalog import fleet, rollout  # noqa: F401
        from catalog.fleet import engines
        from catalog.fleet.tiny_gguf import write_tiny_llama  # noqa: F401

        binary = engines.llama_server_binary()
    except Exception as e:  # the fleet's work, or llama-server, is not there
        pytest.skip(f"needs the fleet and llama-server: {type(e).__name__}: {e}")
    if not binary:
        pytest.skip("no llama-server binary")


class Load:
    """CLIENTS threads sending chat completions through the router, streamed and not, until
    stopped; every answer is checked, every failure kept."""

    def __init__(self, base_url: str, headers: dict):
        self.base_url, self.headers = base_url, headers
        self.halt = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.replicas: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.halt.set()
        for t in self.threads:
            t.join(60)

    def run(self, i: int):
        with httpx.Client(base_url=self.base_url, headers=self.headers, timeout=60) as client:
            n = 0
            while not self.halt.is_set():
                n += 1
                stream = (n + i) % 2 == 0
                try:
                    with client.stream("POST", "/v1/chat/completions",
                                       json=chat("tiny", max_tokens=8, temperature=0, stream=stream)) as r:
                        body = r.read().decode(errors="replace")
                    good = r.status_code == 200 and (body.rstrip().endswith("data: [DONE]") if stream else '"choices"' in body)
                    problem = None if good else f"{r.status_code} stream={stream}: {body[:300]}"
                except httpx.HTTPError as e:
                    problem = f"{type(e).__name__}: {e} (stream={stream})"
                with self.lock:
                    if problem:
                        self.failures.append(problem)
                    else:
                        self.ok += 1
                        replica = r.headers.get("x-llmgw-replica", "?")
                        self.replicas[replica] = self.replicas.get(replica, 0) + 1


@pytest.fixture
def tiny_model(tmp_path_factory):
    from catalog.fleet.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", context_length=16384)


@pytest.fixture
def stop_engines_afterwards(transactional_db):
    yield
    from catalog.fleet import local

    for p in local.engine_processes():
        local.kill_group(p["pid"], 2.0)


def test_a_rollout_of_three_replicas_under_load_fails_no_request(router_url, auth, counts, tiny_model, settings,
                                                               stop_engines_afterwards):
    _fleet_or_skip()
    from catalog import fleet, rollout
    from catalog.choices import ChangeState, ReplicaState
    from catalog.models import Change, Model, Node, Profile, Replica

    settings.LLMGW_READY_TIMEOUT = 60.0
    settings.LLMGW_DRAIN_TIMEOUT = 60.0
    model = Model.objects.create(name="tiny", source=str(tiny_model), context_length=16384, max_output=8,
                                 shape={"trained_context": 16384})
    profile = Profile.objects.create(model=model, name="cpu", engine="llamacpp", args=OLD, cpu_only=True)
    node = Node.objects.create(name="local", backend="local", host="127.0.0.1")
    olds = [fleet.start_replica(profile, node, OLD, slot=i) for i in range(3)]
    for replica in olds:
        fleet.wait_ready(replica, 60)
        fleet.mark(replica, ReplicaState.READY)

    load = Load(router_url, auth).start()
    try:
        time.sleep(2)  # the load is running on the old replicas
        assert load.ok > 0 and not load.failures, load.failures[:5]
        # What services.request_change records (the profile's args, a queued change), then
        # the rollout the Celery task would run.
        profile.args = NEW
        profile.save(update_fields=["args"])
        change = Change.objects.create(model=model, kind="context", source="cli", state=ChangeState.QUEUED,
                                       message="router under load", request={"args": NEW})
        result: dict = {}

        def roll():
            from django.db import connection

            try:
                result["outcome"] = rollout.run(change.id)
            finally:
                connection.close()

        roller = threading.Thread(target=roll, daemon=True)
        roller.start()
        roller.join(240)
        assert not roller.is_alive(), "the rollout did not finish in 240 s"
        time.sleep(2)  # and the load goes on on the new replicas
    finally:
        load.stop()

    change.refresh_from_db()
    assert result.get("outcome") == "succeeded" and change.state == ChangeState.SUCCEEDED, change.error
    assert load.failures == [], f"{len(load.failures)} of {load.ok + len(load.failures)} failed: {load.failures[:5]}"
    news = list(Replica.objects.filter(profile=profile, state=ReplicaState.READY))
    assert len(news) == 3 and all(r.args[-len(NEW):] == NEW or r.args == NEW for r in news)
    assert {r.state for r in Replica.objects.filter(id__in=[o.id for o in olds])} == {ReplicaState.STOPPED}
    served_old = sum(load.replicas.get(str(o.id), 0) for o in olds)
    served_new = sum(load.replicas.get(str(n.id), 0) for n in news)
    assert served_old > 0 and served_new > 0, load.replicas
    print(f"router under a rollout: {load.ok} answers, {len(load.failures)} failures, by replica {load.replicas}")
    assert load.ok >= 40, load.ok
    for replica in news:
        assert settled(counts, replica) == 0
