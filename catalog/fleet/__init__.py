"""The fleet: the only code that starts, checks and stops engine processes.

    start_replica(profile, node, args) -> Replica     spawn; the row is `starting`
    wait_ready(replica, timeout)                      health 200 + one real completion
    drain(replica, timeout)                           wait for in-flight requests to finish
    stop(replica)                                     SIGTERM, then SIGKILL, whole group
    probe(replica) -> bool, read_log(replica, lines=50) -> str
    surge_possible(profiles) -> {id: bool}            can each node hold a second copy?
    reconcile() -> list[str]                          the database against what really runs

The backend is chosen per node: `local` (processes on this machine, `local.py`) or
`celery` (a worker on queue `node.<name>` on that machine, `celery_node.py`).
The implementation lives in `core.py`, loaded on first use, so that
`python -m catalog.fleet.standin` runs without Django."""

from __future__ import annotations

__all__ = [
    "EngineFailed", "start_replica", "wait_ready", "drain", "stop", "probe", "alive", "read_log", "mark",
    "surge_possible", "reconcile", "reconcile_here", "inflight_key", "redis_client",
]


def __getattr__(name):
    if name in __all__:
        from . import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
