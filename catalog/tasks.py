"""Celery tasks: thin, taking ids, fetching again, returning quietly when the row is gone.

- `rollout(change_id)`: the rolling restart (catalog.rollout), acks late, idempotent.
- `reconcile()` and `sweep_queued_changes()`: periodic (beat) and at worker start.
- `node_*`: what a node's worker (queue `node.<name>`) does on its own machine for the
  celery fleet backend; the control side waits on their results (Redis result backend)."""

from __future__ import annotations

import logging
import os

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from catalog import fleet, rollout as rollout_service
from catalog.fleet import local
from catalog.fleet.errors import EngineFailed
from catalog.models import Node, Replica

log = logging.getLogger(__name__)


@shared_task(acks_late=True, ignore_result=True)
def rollout(change_id: int) -> str:
    return rollout_service.run(change_id)


@shared_task(ignore_result=True)
def reconcile() -> list[str]:
    return fleet.reconcile()


@shared_task(ignore_result=True)
def sweep_queued_changes() -> list[int]:
    return rollout_service.sweep()


# --- node tasks: run by the worker of the replica's node, on that machine -----------------

NODE_TASK = dict(ignore_result=False, acks_late=False, soft_time_limit=None)


def _replica(replica_id: int) -> Replica | None:
    return Replica.objects.select_related("profile__model", "node").filter(id=replica_id).first()


@shared_task(**NODE_TASK)
def node_start(replica_id: int) -> dict:
    replica = _replica(replica_id)
    if replica is None:
        return {"ok": False, "reason": f"replica {replica_id} is gone"}
    try:
        local.start(replica)
    except EngineFailed as e:
        return {"ok": False, "reason": e.reason, "log": e.log_tail}
    return {"ok": True, "pid": replica.pid, "endpoint": replica.endpoint}


@shared_task(**NODE_TASK)
def node_wait_ready(replica_id: int, timeout: float) -> dict:
    replica = _replica(replica_id)
    if replica is None:
        return {"ok": False, "reason": f"replica {replica_id} is gone"}
    try:
        return {"ok": True, "seconds": local.wait_ready(replica, timeout)}
    except EngineFailed as e:
        return {"ok": False, "reason": e.reason, "log": e.log_tail}


@shared_task(**NODE_TASK)
def node_stop(replica_id: int, grace: float) -> bool:
    replica = _replica(replica_id)
    if replica is not None:
        local.stop(replica, grace)
    return True


@shared_task(**NODE_TASK)
def node_alive(replica_id: int) -> bool:
    replica = _replica(replica_id)
    return bool(replica and local.alive(replica))


@shared_task(**NODE_TASK)
def node_probe(replica_id: int) -> bool:
    replica = _replica(replica_id)
    return bool(replica and local.probe(replica))


@shared_task(**NODE_TASK)
def node_read_log(replica_id: int, lines: int = 50) -> str:
    replica = _replica(replica_id)
    return local.read_log(replica, lines) if replica else ""


@shared_task(**NODE_TASK)
def node_reconcile(node_name: str) -> list[str]:
    return fleet.reconcile_here(Node.objects.filter(name=node_name))


# --- at worker start -------------------------------------------------------------------------


def _queues(consumer) -> list[str]:
    try:
        return [q.name for q in consumer.task_consumer.queues]
    except AttributeError:
        return [q for q in os.environ.get("LLMGW_WORKER_QUEUES", "").split(",") if q]


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs):
    """Reconcile what this worker is responsible for and resume interrupted rollouts:
    node queues → reconcile that node here; the default queue → reconcile the fleet and
    sweep now, and again once a dead worker's rollout lock has expired."""
    queues = _queues(sender)
    try:
        for q in queues:
            if q.startswith("node."):
                node_reconcile.apply_async((q[len("node."):],), queue=q)
        if settings.CELERY_TASK_DEFAULT_QUEUE in queues:
            reconcile.apply_async()
            sweep_queued_changes.apply_async()
            sweep_queued_changes.apply_async(countdown=float(settings.LLMGW_ROLLOUT_LOCK_TTL) + 1)
    except Exception:
        log.exception("worker start: could not enqueue reconcile/sweep")
