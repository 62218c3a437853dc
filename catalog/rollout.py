"""The rolling restart of a model's replicas after a change (SPEC §5).

`run(change_id)` is what the Celery task `catalog.tasks.rollout` calls. It is safe to run
twice and to resume after its worker was killed:

- a Redis lock per change (renewed while it runs, expiring soon after its worker dies)
  keeps two workers off the same rollout; `sweep()` re-enqueues a `running` change whose
  lock is gone, and a `queued` change no worker took;
- the change goes queued → running by compare-and-set; steps are created once;
- each step checks its state and its replicas' states first: a replica already on the
  profile's current args (same hash) is skipped, a new replica that is `starting` with a
  live process is waited on, a dead one is replaced.

Surge (the default): start the new replica → health + one real completion → `ready` →
the old one `draining` → its in-flight requests finish (router's count, llama.cpp's slots)
→ stopped. In place (no room for a second copy on the node): drain and stop the old one,
then start the new one. A new replica that fails is stopped (`failed`, its last log lines
in `error`), the old one keeps serving, and the change fails with those log lines."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from catalog import fleet
from catalog.choices import ChangeState, ReplicaState, RestartPolicy, StepState
from catalog.models import Change, ChangeStep, Profile, Replica

log = logging.getLogger(__name__)

ACTIVE = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)


def args_hash(args) -> str:
    """The identity of a replica's spec: replicas on the target hash need no restart."""
    return hashlib.sha256(json.dumps([str(a) for a in args or []]).encode()).hexdigest()[:16]


def lock_key(change_id: int) -> str:
    return f"llmgw:rollout:lock:{change_id}"


class ChangeLock:
    """A Redis lock on one change's rollout, renewed by a thread while held; it expires
    `LLMGW_ROLLOUT_LOCK_TTL` seconds after its holder died."""

    def __init__(self, change_id: int):
        self.ttl = float(settings.LLMGW_ROLLOUT_LOCK_TTL)
        self.lock = fleet.redis_client().lock(lock_key(change_id), timeout=self.ttl, thread_local=False)
        self.lost = threading.Event()
        self._stop = threading.Event()

    def acquire(self) -> bool:
        if not self.lock.acquire(blocking=False):
            return False
        threading.Thread(target=self._renew, daemon=True, name="rollout-lock").start()
        return True

    def _renew(self):
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.lock.extend(self.ttl, replace_ttl=True):
                    self.lost.set()
                    return
            except Exception:
                log.warning("cannot renew %s", self.lock.name, exc_info=True)
                self.lost.set()
                return

    def release(self):
        self._stop.set()
        try:
            self.lock.release()
        except Exception:
            pass


@dataclass
class Outcome:
    ok: bool
    error: str = ""


def _note(step: ChangeStep, text: str, save: bool = True) -> None:
    """Add a timestamped line to the step's detail; saved now, or with the next save."""
    stamp = timezone.now().isoformat(timespec="milliseconds")
    step.detail = (step.detail + "\n" if step.detail else "") + f"{stamp} {text}"
    if save:
        step.save(update_fields=["detail"])
    log.info("change %s step %s: %s", step.change_id, step.position, text)


def _set_step(step: ChangeStep, state: str, **extra) -> None:
    """Set the step's state (and fields), saving its detail with it: one write."""
    step.state = state
    fields = ["state", "detail"]
    for k, v in extra.items():
        setattr(step, k, v)
        fields.append(k)
    step.save(update_fields=fields)


def plan_steps(change: Change) -> list[ChangeStep]:
    """The change's steps, created once: one per replica of the model that is not
    stopped or failed, in a stable order; surge unless the node has no room for a copy."""
    steps_of = lambda: list(change.steps.select_related("old_replica", "new_replica", "node").order_by("position"))  # noqa: E731
    with transaction.atomic():
        existing = steps_of()
        if existing:
            return existing
        replicas = list(
            Replica.objects.filter(profile__model=change.model, state__in=ACTIVE)
            .select_related("profile", "node")
            .order_by("profile_id", "node_id", "slot", "id")
        )
        surge = fleet.surge_possible({r.profile_id: r.profile for r in replicas}.values())
        steps = [
            ChangeStep(change=change, position=i, profile=r.profile, node=r.node, old_replica=r,
                       policy=RestartPolicy.SURGE if surge[r.profile_id] else RestartPolicy.IN_PLACE)
            for i, r in enumerate(replicas, start=1)
        ]
        ChangeStep.objects.bulk_create(steps)
        if any(st.pk is None for st in steps):  # a database that does not return ids on insert
            return steps_of()
        return steps


def _take_down(step: ChangeStep, old: Replica | None, done: bool = False) -> None:
    """Drain the old replica (the router sends it nothing new; in-flight requests finish)
    and stop it; `done`: the step is done with it, recorded in the same transaction."""
    if old is None or old.state not in ACTIVE:
        if done:
            _set_step(step, StepState.DONE, finished_at=timezone.now())
        return
    if old.state != ReplicaState.DRAINING:
        fleet.mark(old, ReplicaState.DRAINING)
        _note(step, f"old replica {old.id} draining")
    result = fleet.drain(old)
    if result["drained"]:
        _note(step, f"old replica {old.id} drained in {result['seconds']:.2f} s", save=False)
    else:
        _note(step, f"old replica {old.id}: {result['inflight']} request(s) still in flight after the drain "
                    f"timeout ({result['seconds']:.0f} s); stopping it", save=False)
    fleet.stop(old, record=False)
    _note(step, f"old replica {old.id} stopped", save=False)
    with transaction.atomic():
        fleet.mark(old, ReplicaState.STOPPED)
        if done:
            _set_step(step, StepState.DONE, finished_at=timezone.now())


def _bring_up(step: ChangeStep, profile: Profile, target: list[str], slot: int, total: int,
              old: Replica | None) -> Outcome:
    """Start (or, after a restart of the worker, resume) the step's new replica until it
    answers; then, in one transaction, it becomes `ready` and (surge) the old one `draining`
    and the step `draining`: the router never sees the model without a ready replica."""
    new = step.new_replica
    if new is not None:
        new.refresh_from_db()
        if new.state == ReplicaState.READY:
            pass  # ready before the worker died: only the hand-over is left
        elif new.state == ReplicaState.STARTING and not fleet.alive(new):
            _note(step, f"new replica {new.id}: its process is gone (its worker died?); starting another", save=False)
            fleet.stop(new, ReplicaState.FAILED)
            fleet.mark(new, ReplicaState.FAILED, error="its process was gone when the rollout resumed\n" + fleet.read_log(new, 20))
            new = None
        elif new.state != ReplicaState.STARTING:
            new = None
        else:
            _note(step, f"new replica {new.id} (pid {new.pid}) still starting: waiting for it", save=False)
    if new is None:
        # Locally, the new row, its spawn and the step's link to it are one transaction (an
        # engine whose row was rolled back is untracked: reconcile stops it). A celery node
        # must see the row first: there each is committed on its own.
        together = transaction.atomic() if step.node.backend != "celery" else nullcontext()
        try:
            with together:
                new = fleet.start_replica(profile, step.node, target, slot=slot)
                _note(step, f"new replica {new.id} started: pid {new.pid}, {new.endpoint}", save=False)
                _set_step(step, step.state, new_replica=new, started_at=step.started_at)
        except fleet.EngineFailed as e:
            return Outcome(False, f"replica {step.position} of {total} on {step.node.name}: {e}")
    if new.state != ReplicaState.READY:
        try:
            seconds = fleet.wait_ready(new)
        except fleet.EngineFailed as e:
            tail = e.log_tail or fleet.read_log(new, 30)
            fleet.stop(new, ReplicaState.FAILED)
            fleet.mark(new, ReplicaState.FAILED, error=f"{e.reason}\n{tail}".strip())
            _note(step, f"new replica {new.id} failed: {e.reason}", save=False)
            return Outcome(False, f"replica {step.position} of {total} on {step.node.name}: the new replica "
                                  f"{new.id} failed: {e.reason}\n{tail}".strip())
        _note(step, f"new replica {new.id} ready in {seconds:.2f} s", save=False)
    with transaction.atomic():
        fleet.mark(new, ReplicaState.READY)
        if step.policy == RestartPolicy.IN_PLACE:
            _set_step(step, StepState.DONE, finished_at=timezone.now())
            return Outcome(True)
        # a save (not a queryset update): the router learns of replica changes from post_save
        if old is not None and Replica.objects.filter(id=old.id).values_list("state", flat=True).first() in (
                ReplicaState.STARTING, ReplicaState.READY):
            fleet.mark(old, ReplicaState.DRAINING)
            _note(step, f"old replica {old.id} draining", save=False)
        _set_step(step, StepState.DRAINING)
    return Outcome(True)


def run_step(change: Change, step: ChangeStep, total: int, profile: Profile | None = None,
             fresh: bool = False) -> Outcome:
    """One step, from whatever state it is in. `fresh`: the step and its replicas were just
    read (a first run); a resumed run reads them again."""
    if not fresh:
        step = ChangeStep.objects.select_related("old_replica", "new_replica", "node").get(id=step.id)
    if step.state in (StepState.DONE, StepState.SKIPPED):
        return Outcome(True)
    if step.state == StepState.FAILED:
        return Outcome(False, step.detail.rsplit("\n", 1)[-1])
    if profile is None:
        profile = Profile.objects.select_related("model").get(id=step.profile_id)
    target = list(profile.args)
    old = step.old_replica
    slot = old.slot if old is not None else step.position - 1

    if step.state == StepState.PENDING:
        now = timezone.now()
        if old is not None and old.state == ReplicaState.READY and args_hash(old.args) == args_hash(target):
            _note(step, f"replica {old.id} already runs the target args ({args_hash(target)})", save=False)
            _set_step(step, StepState.SKIPPED, started_at=now, finished_at=now)
            return Outcome(True)
        _note(step, f"restarting {'in place' if step.policy == RestartPolicy.IN_PLACE else 'new before old'}: "
                    f"replica {old.id if old else '-'} → args {args_hash(target)}", save=False)
        step.state, step.started_at = StepState.STARTING, now
        if step.policy == RestartPolicy.IN_PLACE or step.node.backend == "celery":
            _set_step(step, StepState.STARTING, started_at=now)
        # else: written with the new replica's spawn, in one transaction (nothing happened before it)

    if step.state == StepState.STARTING:
        if step.policy == RestartPolicy.IN_PLACE:
            _take_down(step, old)
        outcome = _bring_up(step, profile, target, slot, total, old)
        if not outcome.ok:
            _set_step(step, StepState.FAILED, started_at=step.started_at, finished_at=timezone.now())
            if step.policy == RestartPolicy.IN_PLACE and old is not None:
                _restore(step, old)
            return outcome
        if step.state == StepState.DONE:
            return Outcome(True)

    if step.state == StepState.DRAINING:
        _take_down(step, old, done=True)
    return Outcome(True)


def _restore(step: ChangeStep, old: Replica) -> None:
    """In place, the old replica is already gone when the new one fails: bring its args back."""
    try:
        back = fleet.start_replica(old.profile, old.node, old.args, slot=old.slot)
        fleet.wait_ready(back)
    except fleet.EngineFailed as e:
        _note(step, f"could not restore the previous args: {e.reason}")
        return
    fleet.mark(back, ReplicaState.READY)
    _note(step, f"replica {back.id} restored on the previous args at {back.endpoint}")


def _finish(change_id: int, state: str, error: str = "") -> None:
    Change.objects.filter(id=change_id, state=ChangeState.RUNNING).update(
        state=state, error=error[-20000:], finished_at=timezone.now()
    )


def run(change_id: int) -> str:
    """Roll the change's model out to its profiles' current args. Returns what happened."""
    change = Change.objects.filter(id=change_id).select_related("model").first()
    if change is None:
        return "gone"
    if change.state not in (ChangeState.QUEUED, ChangeState.RUNNING):
        return f"already {change.state}"
    lock = ChangeLock(change_id)
    if not lock.acquire():
        return "another worker runs it"
    try:
        with transaction.atomic():
            started = Change.objects.filter(id=change_id, state=ChangeState.QUEUED).update(
                state=ChangeState.RUNNING, started_at=timezone.now())
            if not started:  # not queued any more: running (resume) or finished meanwhile
                change.refresh_from_db()
                if change.state != ChangeState.RUNNING:
                    return f"already {change.state}"
            steps = plan_steps(change)
        profiles = {p.id: p for p in Profile.objects.select_related("model").filter(id__in={s.profile_id for s in steps})}
        for step in steps:
            if lock.lost.is_set():
                log.warning("change %s: lost its lock; leaving the rest to the worker that holds it", change_id)
                return "lock lost"
            outcome = run_step(change, step, len(steps), profiles[step.profile_id], fresh=not started)
            if not outcome.ok:
                _finish(change_id, ChangeState.FAILED, outcome.error)
                return "failed"
        _finish(change_id, ChangeState.SUCCEEDED)
        return "succeeded"
    except Exception as e:
        log.exception("change %s: rollout crashed", change_id)
        _finish(change_id, ChangeState.FAILED, f"the rollout crashed: {type(e).__name__}: {e}")
        raise
    finally:
        lock.release()


def sweep() -> list[int]:
    """Re-enqueue changes no worker is on: `queued` ones older than the grace period (their
    enqueue was lost), and `running` ones whose lock has expired (their worker died).
    A change is re-enqueued at most once per grace period."""
    from catalog import tasks

    grace = float(settings.LLMGW_SWEEP_GRACE)
    rds = fleet.redis_client()
    sent = []
    cutoff = timezone.now() - timezone.timedelta(seconds=grace)
    candidates = list(Change.objects.filter(state=ChangeState.QUEUED, created_at__lt=cutoff).values_list("id", flat=True))
    for cid in Change.objects.filter(state=ChangeState.RUNNING).values_list("id", flat=True):
        if not rds.exists(lock_key(cid)):
            candidates.append(cid)
    for cid in candidates:
        if rds.set(f"llmgw:rollout:swept:{cid}", "1", nx=True, ex=max(1, int(grace))):
            tasks.rollout.apply_async((cid,))
            sent.append(cid)
            log.info("sweep: change %s re-enqueued", cid)
    return sent
