"""The rolling restart with real llama-server processes, a real Redis and real Celery workers."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from catalog import fleet
from catalog.choices import ChangeState, ReplicaState, StepState
from catalog.fleet import local
from catalog.models import Replica
from tests.fleet.helpers import complete, event_time, ppid, props, request_change, up, wait_change, wait_for

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("llama_server")]

OLD = ["--ctx-size", "1024", "--parallel", "2", "--threads", "1"]
NEW = ["--ctx-size", "4096", "--parallel", "4", "--threads", "1"]


class Observer(threading.Thread):
    """Samples the replicas' states every 20 ms while a rollout runs."""

    def __init__(self, model):
        super().__init__(daemon=True)
        self.model = model
        self.samples: list[dict[int, str]] = []
        self.halt = threading.Event()

    def run(self):
        try:
            while not self.halt.is_set():
                self.samples.append(dict(Replica.objects.filter(profile__model=self.model).values_list("id", "state")))
                time.sleep(0.02)
        finally:
            connection.close()

    def stop(self):
        self.halt.set()
        self.join(10)


def test_context_change_restarts_replicas_one_at_a_time_new_before_old(catalog_rows, start_worker):
    start_worker("rollout")
    model, profile = catalog_rows("tiny", OLD)
    olds = up(profile, catalog_rows.node(), 3)
    assert all(props(r) == {"n_ctx": 512, "slots": 2} for r in olds)

    observer = Observer(model)
    observer.start()
    change = wait_change(request_change(profile, NEW), 120)
    observer.stop()
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert change.started_at and change.finished_at

    steps = list(change.steps.order_by("position"))
    assert [s.state for s in steps] == [StepState.DONE] * 3
    assert [s.old_replica_id for s in steps] == [r.id for r in olds]
    for s in steps:
        old, new = s.old_replica, s.new_replica
        assert old.state == ReplicaState.STOPPED and new.state == ReplicaState.READY
        assert new.args == NEW and new.slot == old.slot
        # the new replica serves the new context: 4096 tokens over 4 slots
        assert props(new) == {"n_ctx": 1024, "slots": 4}
        assert complete(new)["tokens_predicted"] >= 1
        ready = event_time(s, f"new replica {new.id} ready")
        draining = event_time(s, f"old replica {old.id} draining")
        assert new.started_at < ready <= draining < old.stopped_at
        assert not local.pid_is_replica(old.pid, old.id)
    for a, b in zip(steps, steps[1:]):
        # one at a time: the next replica starts after the previous old one stopped
        assert a.finished_at <= b.started_at
        assert a.old_replica.stopped_at <= b.new_replica.started_at

    during = [s for s in observer.samples if any(v != ReplicaState.READY for v in s.values())]
    assert during, "the observer saw no rollout"
    assert min(sum(v == ReplicaState.READY for v in s.values()) for s in during) >= 3
    assert max(sum(v == ReplicaState.STARTING for v in s.values()) for s in observer.samples) <= 1

    # a second run of the same change is a no-op
    from catalog import rollout

    assert rollout.run(change.id) == "already succeeded"


def test_a_completion_in_flight_on_a_draining_replica_finishes(catalog_rows, start_worker):
    start_worker("rollout")
    args = ["--ctx-size", "4096", "--parallel", "1", "--threads", "1"]
    model, profile = catalog_rows("tiny", args)
    (old,) = up(profile, catalog_rows.node(), 1)
    rds = fleet.redis_client()
    key = fleet.inflight_key(old.id)
    result: dict = {}

    def long_request():  # as the router does it: count it in flight while it runs
        rds.incr(key)
        try:
            result["response"] = complete(old, n=2000, ignore_eos=True, cache_prompt=False)
            result["ended"] = timezone.now()
        finally:
            rds.decr(key)

    client = threading.Thread(target=long_request)
    client.start()
    wait_for(lambda: any(s.get("is_processing") for s in httpx.get(old.endpoint + "/slots").json()), 10, "a busy slot")
    change = request_change(profile, ["--ctx-size", "8192", "--parallel", "1", "--threads", "1"])
    client.join(120)
    change = wait_change(change, 120)
    assert change.state == ChangeState.SUCCEEDED, change.error

    response = result["response"]
    assert response["tokens_predicted"] == 2000 and response["stop_type"] == "limit"
    (step,) = change.steps.all()
    old.refresh_from_db()
    draining = event_time(step, f"old replica {old.id} draining")
    assert draining < result["ended"] < old.stopped_at, (draining, result["ended"], old.stopped_at)
    drained = float(step.detail.split(f"old replica {old.id} drained in ", 1)[1].split(" s", 1)[0])
    assert drained >= 0.2, step.detail  # the drain waited for the request


def test_a_context_llama_cpp_refuses_fails_old_replicas_keep_serving_and_rollback_restores(catalog_rows, start_worker):
    start_worker("rollout")
    model, profile = catalog_rows("tiny", OLD)
    olds = up(profile, catalog_rows.node(), 2)
    bad = ["--ctx-size", "3000000000", "--parallel", "4", "--threads", "1"]  # llama.cpp: not an int it takes
    failed = wait_change(request_change(profile, bad), 120)

    assert failed.state == ChangeState.FAILED
    assert "replica 1 of 2" in failed.error and "exited" in failed.error
    assert 'error while handling argument "--ctx-size"' in failed.error  # llama-server's own last log lines
    steps = list(failed.steps.order_by("position"))
    assert [s.state for s in steps] == [StepState.FAILED, StepState.PENDING]
    assert steps[0].started_at and steps[0].finished_at and steps[1].started_at is None
    new = steps[0].new_replica
    assert new.state == ReplicaState.FAILED and 'error while handling argument "--ctx-size"' in new.error
    assert not local.pid_is_replica(new.pid, new.id)
    for r in olds:
        r.refresh_from_db()
        assert r.state == ReplicaState.READY and local.alive(r)
        assert props(r) == {"n_ctx": 512, "slots": 2}
        assert complete(r)["tokens_predicted"] >= 1

    rollback = wait_change(request_change(profile, OLD, kind="rollback", rollback_of=failed), 60)
    assert rollback.state == ChangeState.SUCCEEDED, rollback.error
    assert [s.state for s in rollback.steps.all()] == [StepState.SKIPPED, StepState.SKIPPED]
    assert set(Replica.objects.filter(state=ReplicaState.READY).values_list("id", flat=True)) == {r.id for r in olds}
    profile.refresh_from_db()
    assert profile.args == OLD


def test_worker_killed_mid_rollout_then_a_new_worker_completes_it_without_orphans(catalog_rows, start_worker):
    w1 = start_worker("w1")
    model, profile = catalog_rows("tiny", OLD)
    olds = up(profile, catalog_rows.node(), 3)
    rds = fleet.redis_client()
    rds.set(fleet.inflight_key(olds[1].id), 1)  # a request in flight on the 2nd replica holds its drain

    change = request_change(profile, NEW)
    step2 = wait_for(lambda: change.steps.filter(position=2, state=StepState.DRAINING).first(), 60, "step 2 draining")
    wait_for(lambda: Replica.objects.filter(id=olds[1].id, state=ReplicaState.DRAINING).exists(), 10, "old replica 2 draining")
    time.sleep(0.3)  # the worker is in its drain loop now
    w1.kill()
    time.sleep(0.5)
    new2 = step2.new_replica
    assert local.alive(new2), "the engine a dead worker started keeps running"
    olds[1].refresh_from_db()
    assert olds[1].state == ReplicaState.DRAINING and local.alive(olds[1])
    change.refresh_from_db()
    assert change.state == ChangeState.RUNNING

    rds.set(fleet.inflight_key(olds[1].id), 0)  # the request finished
    w2 = start_worker("w2")  # at start it sweeps: the dead worker's lock expires, the rollout resumes
    change = wait_change(change, 120)
    assert change.state == ChangeState.SUCCEEDED, change.error
    assert [s.state for s in change.steps.order_by("position")] == [StepState.DONE] * 3
    step2.refresh_from_db()
    assert step2.new_replica_id == new2.id  # resumed, not restarted
    assert "succeeded" in w2.log() and "'succeeded'" in w2.log()

    active = list(Replica.objects.filter(state__in=[ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING]))
    assert len(active) == 3 and all(r.state == ReplicaState.READY and r.args == NEW for r in active)
    assert Replica.objects.count() == 6  # no replica lost, none started twice
    running = {p["pid"] for p in local.engine_processes()}
    assert running == {r.pid for r in active}, "an engine runs that the database does not track"
    for r in Replica.objects.exclude(id__in=[a.id for a in active]):
        assert r.state == ReplicaState.STOPPED and not local.pid_is_replica(r.pid, r.id)
    assert all(props(r) == {"n_ctx": 1024, "slots": 4} for r in active)


def test_two_nodes_each_served_by_its_own_worker_and_queue(catalog_rows, start_worker):
    start_worker("rollout")
    wa = start_worker("node-a", ["node.a"], pool="threads")
    wb = start_worker("node-b", ["node.b"], pool="threads")
    model, profile = catalog_rows("tiny", OLD)
    na, nb = catalog_rows.node("a", "celery"), catalog_rows.node("b", "celery")
    (ra,) = up(profile, na, 1)
    (rb,) = up(profile, nb, 1)
    assert ppid(ra.pid) == wa.pid and ppid(rb.pid) == wb.pid  # each node's worker spawned its engine
    assert fleet.probe(ra) and fleet.probe(rb)

    change = wait_change(request_change(profile, NEW), 120)
    assert change.state == ChangeState.SUCCEEDED, change.error
    for step, worker, node in zip(change.steps.order_by("position"), (wa, wb), (na, nb)):
        new = step.new_replica
        assert step.node_id == node.id and new.node_id == node.id and new.state == ReplicaState.READY
        assert ppid(new.pid) == worker.pid
        assert props(new) == {"n_ctx": 1024, "slots": 4}
        step.old_replica.refresh_from_db()
        assert step.old_replica.state == ReplicaState.STOPPED
        assert not os.path.exists(f"/proc/{step.old_replica.pid}") or not local.pid_is_replica(step.old_replica.pid, step.old_replica.id)
    log = fleet.read_log(change.steps.first().new_replica, lines=10_000)  # read on the node, through its worker
    assert log.startswith("$ ") and "--ctx-size 4096" in log


def test_reconcile_marks_a_killed_replica_restarts_it_and_stops_untracked_engines(catalog_rows, monkeypatch):
    from catalog.fleet import core

    model, profile = catalog_rows("tiny", OLD)
    node = catalog_rows.node()
    r1, r2, r3 = up(profile, node, 3)
    os.kill(r1.pid, signal.SIGKILL)
    wait_for(lambda: not local.alive(r1), 10, "the engine to die")
    Replica.objects.filter(id=r3.id).delete()  # the database forgets r3; its engine still runs

    # an engine seconds old may be one whose starter has not committed its record yet: spared
    monkeypatch.setattr(core, "UNTRACKED_GRACE", 60.0)
    first = fleet.reconcile()
    assert not any("untracked" in m for m in first), first
    assert any(f"replica {r1.id}" in m and "restarted" in m for m in first), first
    assert local.pid_is_replica(r3.pid, r3.id)
    monkeypatch.setattr(core, "UNTRACKED_GRACE", 0.0)

    msgs = fleet.reconcile()

    r1.refresh_from_db()
    assert r1.state == ReplicaState.FAILED and "died" in r1.error and r1.stopped_at
    replacement = Replica.objects.get(state=ReplicaState.READY, slot=r1.slot)
    assert replacement.args == OLD and local.alive(replacement)
    assert complete(replacement)["tokens_predicted"] >= 1
    r2.refresh_from_db()
    assert r2.state == ReplicaState.READY and local.alive(r2)
    assert not local.pid_is_replica(r3.pid, r3.id)
    assert any(f"pid {r3.pid}" in m and "untracked" in m for m in msgs), msgs
    assert {p["pid"] for p in local.engine_processes()} == {r2.pid, replacement.pid}
    assert fleet.reconcile() == []  # nothing left to fix


def test_no_room_for_a_second_copy_restarts_in_place_old_first(catalog_rows, start_worker):
    start_worker("rollout")
    model, profile = catalog_rows("tiny", OLD)
    profile.min_memory_gb = 6
    profile.save()
    node = catalog_rows.node()
    node.ram_gb = 16  # two replicas of 6 GB fit, a third copy does not
    node.save()
    olds = up(profile, node, 2)
    assert fleet.surge_possible([profile]) == {profile.id: False}

    change = wait_change(request_change(profile, NEW), 120)
    assert change.state == ChangeState.SUCCEEDED, change.error
    steps = list(change.steps.order_by("position"))
    assert [s.policy for s in steps] == ["in_place", "in_place"]
    for s in steps:
        old, new = s.old_replica, s.new_replica
        assert old.state == ReplicaState.STOPPED and new.state == ReplicaState.READY
        assert old.stopped_at <= new.started_at  # in place: the old one goes first
        assert props(new) == {"n_ctx": 1024, "slots": 4}
    assert steps[0].new_replica.started_at < steps[1].old_replica.stopped_at  # one at a time
    assert Replica.objects.filter(state=ReplicaState.READY).count() == 2


def test_in_place_a_context_llama_cpp_refuses_fails_and_the_replica_comes_back_on_its_old_args(catalog_rows, start_worker):
    """In place the old replica is already stopped when the new one fails: the rollout starts
    it again on the args it had, so the model keeps a replica serving, and stops there."""
    start_worker("rollout")
    model, profile = catalog_rows("tiny", OLD)
    profile.min_memory_gb = 6
    profile.save()
    node = catalog_rows.node()
    node.ram_gb = 16  # two replicas of 6 GB fit, a third copy does not: in place
    node.save()
    olds = up(profile, node, 2)
    bad = ["--ctx-size", "3000000000", "--parallel", "4", "--threads", "1"]  # llama.cpp: not an int it takes
    failed = wait_change(request_change(profile, bad), 120)

    assert failed.state == ChangeState.FAILED
    assert "replica 1 of 2" in failed.error and 'error while handling argument "--ctx-size"' in failed.error
    first, second = failed.steps.order_by("position")
    assert first.policy == "in_place" and first.state == StepState.FAILED and second.state == StepState.PENDING
    assert first.new_replica.state == ReplicaState.FAILED
    assert "restored on the previous args" in first.detail
    olds[0].refresh_from_db()
    assert olds[0].state == ReplicaState.STOPPED  # it went first, as in place does
    restored = Replica.objects.get(state=ReplicaState.READY, slot=olds[0].slot)
    assert restored.id not in {r.id for r in olds} and restored.args == OLD
    assert props(restored) == {"n_ctx": 512, "slots": 2} and complete(restored)["tokens_predicted"] >= 1
    olds[1].refresh_from_db()
    assert olds[1].state == ReplicaState.READY and local.alive(olds[1])  # the second step never ran


@pytest.mark.parametrize("engine_alive", [True, False], ids=["live-new-replica-waited-on", "dead-new-replica-replaced"])
def test_resume_of_a_step_whose_new_replica_was_starting(catalog_rows, engine_alive):
    """The state a worker killed while a new replica was starting leaves behind, resumed."""
    from catalog import rollout
    from catalog.models import Change

    model, profile = catalog_rows("tiny", OLD)
    node = catalog_rows.node()
    (old,) = up(profile, node, 1)
    profile.args = NEW
    profile.save()
    change = Change.objects.create(model=model, kind="context", source="cli", state=ChangeState.RUNNING,
                                   started_at=timezone.now())
    (step,) = rollout.plan_steps(change)
    pending_new = fleet.start_replica(profile, node, NEW, slot=old.slot)
    step.state, step.started_at, step.new_replica = StepState.STARTING, timezone.now(), pending_new
    step.save()
    if not engine_alive:
        os.kill(pending_new.pid, signal.SIGKILL)
        wait_for(lambda: not local.alive(pending_new), 10, "the engine to die")

    assert rollout.run(change.id) == "succeeded"

    step.refresh_from_db()
    pending_new.refresh_from_db()
    old.refresh_from_db()
    assert step.state == StepState.DONE and old.state == ReplicaState.STOPPED
    if engine_alive:
        assert step.new_replica_id == pending_new.id and pending_new.state == ReplicaState.READY
        assert Replica.objects.count() == 2
    else:
        assert step.new_replica_id != pending_new.id and pending_new.state == ReplicaState.FAILED
        assert "gone" in pending_new.error
        assert step.new_replica.state == ReplicaState.READY and props(step.new_replica) == {"n_ctx": 1024, "slots": 4}
        assert Replica.objects.count() == 3
    assert {p["pid"] for p in local.engine_processes()} == {step.new_replica.pid}


def test_a_queued_change_whose_enqueue_was_lost_is_swept_and_run(catalog_rows, start_worker):
    from datetime import timedelta

    from catalog import rollout
    from catalog.models import Change

    start_worker("rollout")
    model, profile = catalog_rows("tiny", OLD)
    up(profile, catalog_rows.node(), 1)
    profile.args = NEW
    profile.save()
    change = Change.objects.create(model=model, kind="context", source="api", state=ChangeState.QUEUED)
    assert rollout.sweep() == []  # younger than the grace period: its enqueue may still arrive
    Change.objects.filter(id=change.id).update(created_at=timezone.now() - timedelta(seconds=30))
    assert rollout.sweep() == [change.id]
    assert rollout.sweep() == []  # at most once per grace period
    change = wait_change(change, 60)
    assert change.state == ChangeState.SUCCEEDED, change.error
