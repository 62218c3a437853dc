"""The celery backend: a node is a machine with a Celery worker consuming `node.<name>`.

The control side (the rollout) sends start, wait-ready, stop, probe, log and reconcile
requests to that queue with `apply_async(queue=node.queue)` and waits for the answer
(a Redis result backend; see `CELERY_RESULT_BACKEND` in settings). The worker runs them
with the local backend on its own machine (`catalog.tasks.node_*`)."""

from __future__ import annotations

from django.conf import settings

from catalog.models import Replica

from .errors import EngineFailed

# How long the control side waits for a node worker to take a request, beyond the work itself.
SLACK = 60.0


class NodeUnreachable(EngineFailed):
    pass


def _call(task, node, args: tuple, work_seconds: float = 0.0):
    from celery.exceptions import TimeoutError as CeleryTimeout

    result = task.apply_async(args, queue=node.queue)
    try:
        return result.get(timeout=work_seconds + SLACK, disable_sync_subtasks=False, propagate=True)
    except CeleryTimeout as e:
        raise NodeUnreachable(f"node {node.name}: no worker on queue {node.queue} answered within "
                              f"{work_seconds + SLACK:.0f} s") from e
    finally:
        result.forget()


def start(replica: Replica) -> Replica:
    from catalog import tasks

    answer = _call(tasks.node_start, replica.node, (replica.id,), 30.0)
    replica.refresh_from_db()
    if not answer.get("ok"):
        raise EngineFailed(answer.get("reason", "the node could not start the engine"), answer.get("log", ""))
    return replica


def wait_ready(replica: Replica, timeout: float) -> float:
    from catalog import tasks

    answer = _call(tasks.node_wait_ready, replica.node, (replica.id, timeout), timeout)
    if not answer.get("ok"):
        raise EngineFailed(answer.get("reason", "not ready"), answer.get("log", ""))
    return float(answer.get("seconds", 0.0))


def stop(replica: Replica, grace: float | None = None) -> None:
    from catalog import tasks

    grace = settings.LLMGW_STOP_GRACE if grace is None else grace
    _call(tasks.node_stop, replica.node, (replica.id, grace), grace + 10)


def alive(replica: Replica) -> bool:
    from catalog import tasks

    return bool(_call(tasks.node_alive, replica.node, (replica.id,)))


def probe(replica: Replica) -> bool:
    from catalog import tasks

    return bool(_call(tasks.node_probe, replica.node, (replica.id,), 10.0))


def read_log(replica: Replica, lines: int = 50) -> str:
    from catalog import tasks

    return str(_call(tasks.node_read_log, replica.node, (replica.id, lines)))


def reconcile(node) -> list[str]:
    from catalog import tasks

    return list(_call(tasks.node_reconcile, node, (node.name,), 120.0))
