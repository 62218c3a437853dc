"""Helpers for the fleet tests: replicas up, a change as the services helper would write it."""

from __future__ import annotations

import time
from datetime import datetime

import httpx

from catalog import fleet
from catalog.choices import ChangeState, ReplicaState
from catalog.models import Change, Replica


def up(profile, node, n: int) -> list[Replica]:
    replicas = [fleet.start_replica(profile, node, list(profile.args), slot=i) for i in range(n)]
    for r in replicas:
        fleet.wait_ready(r, 30)
        fleet.mark(r, ReplicaState.READY)
    return replicas


def request_change(profile, args: list[str], kind: str = "context", rollback_of=None) -> Change:
    """What services.request_change writes (profile args to the target, a queued Change),
    then the enqueue it does on commit."""
    from catalog import tasks

    before = list(profile.args)
    profile.args = list(args)
    profile.save(update_fields=["args"])
    change = Change.objects.create(model=profile.model, kind=kind, source="cli", state=ChangeState.QUEUED,
                                   message="test", request={"args": args}, rollback_of=rollback_of,
                                   before={"profiles": {profile.name: before}}, after={"profiles": {profile.name: args}})
    tasks.rollout.delay(change.id)
    return change


def wait_change(change: Change, timeout: float = 120.0) -> Change:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        change.refresh_from_db()
        if change.state not in (ChangeState.QUEUED, ChangeState.RUNNING):
            return change
        time.sleep(0.1)
    raise AssertionError(f"change {change.id} still {change.state} after {timeout} s: "
                         + "; ".join(f"{s.position}:{s.state}" for s in change.steps.all()))


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def props(replica: Replica) -> dict:
    """llama-server's /props: n_ctx is per slot."""
    body = httpx.get(replica.endpoint + "/props", timeout=5).json()
    return {"n_ctx": body["default_generation_settings"]["n_ctx"], "slots": body["total_slots"]}


def complete(replica: Replica, n: int = 4, **extra) -> dict:
    r = httpx.post(replica.endpoint + "/completion", json={"prompt": "Hello", "n_predict": n, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def event_time(step, text: str) -> datetime:
    """When the step's detail recorded an event (its lines start with an ISO timestamp)."""
    for line in step.detail.splitlines():
        stamp, _, rest = line.partition(" ")
        if text in rest:
            return datetime.fromisoformat(stamp)
    raise AssertionError(f"step {step.position} has no {text!r} in:\n{step.detail}")


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
