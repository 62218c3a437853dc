"""The fleet's implementation: what catalog.fleet (its __init__.py) lists, for the backend
each node names: `local` (local.py) or `celery` (celery_node.py)."""

from __future__ import annotations

import logging
import time

import httpx
from django.conf import settings
from django.utils import timezone

from catalog.choices import ChangeState, ReplicaState
from catalog.models import Change, Node, Profile, Replica

from . import celery_node, local
from .errors import EngineFailed
from .http import client

log = logging.getLogger(__name__)

__all__ = [
    "EngineFailed", "start_replica", "wait_ready", "drain", "stop", "probe", "alive", "read_log",
    "surge_possible", "reconcile", "reconcile_here", "inflight_key",
]

ACTIVE = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)
# An engine younger than this is never taken for untracked: its starter's transaction
# (spawn, then its record) may still be open.
UNTRACKED_GRACE = 20.0


def _backend(node: Node):
    return celery_node if node.backend == "celery" else local


def inflight_key(replica_id: int) -> str:
    """The router's count of requests in flight on a replica (INCR/DECR)."""
    return f"llmgw:inflight:{replica_id}"


_redis: dict = {}


def redis_client():
    """One Redis client per process and URL (its own connection pool)."""
    import os

    import redis

    key = (os.getpid(), settings.REDIS_URL)
    if key not in _redis:
        _redis[key] = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    return _redis[key]


def start_replica(profile: Profile, node: Node, args: list[str], slot: int = 0) -> Replica:
    """A new replica of profile on node with args, spawned; `starting` until wait_ready.
    EngineFailed (the row marked failed) when the engine cannot even be spawned."""
    replica = Replica.objects.create(profile=profile, node=node, slot=slot, args=list(args),
                                     state=ReplicaState.STARTING, started_at=timezone.now())
    try:
        return _backend(node).start(replica)
    except EngineFailed as e:
        mark(replica, ReplicaState.FAILED, error=str(e))
        raise


def wait_ready(replica: Replica, timeout: float | None = None) -> float:
    """Seconds until the replica answered health and a real completion; EngineFailed else."""
    timeout = settings.LLMGW_READY_TIMEOUT if timeout is None else timeout
    return _backend(replica.node).wait_ready(replica, timeout)


def mark(replica: Replica, state: str, error: str | None = None) -> None:
    replica.state = state
    fields = ["state"]
    if error is not None:
        replica.error = error
        fields.append("error")
    if state in (ReplicaState.STOPPED, ReplicaState.FAILED) and not replica.stopped_at:
        replica.stopped_at = timezone.now()
        fields.append("stopped_at")
    replica.save(update_fields=fields)


def _busy_slots(http: httpx.Client, replica: Replica) -> int | None:
    """llama.cpp's slots still processing; None when the engine does not answer at all."""
    try:
        r = http.get(replica.endpoint + "/slots")
    except httpx.HTTPError:
        try:
            http.get(replica.endpoint + "/health")
        except httpx.HTTPError:
            return None
        return 0
    if r.status_code != 200:
        return 0  # /slots disabled (--no-slots): only the router's count tells
    try:
        return sum(1 for s in r.json() if isinstance(s, dict) and s.get("is_processing"))
    except ValueError:
        return 0


def drain(replica: Replica, timeout: float | None = None) -> dict:
    """Wait until the router counts no request in flight on the replica and (llama.cpp) no
    slot is processing, up to timeout. The replica is already `draining`: the router sends it
    nothing new. Returns {"drained": bool, "seconds": float, "inflight": int}."""
    timeout = settings.LLMGW_DRAIN_TIMEOUT if timeout is None else timeout
    began = time.monotonic()
    key = inflight_key(replica.id)
    rds = redis_client()
    inflight = 0
    http = client()
    while True:
        try:
            inflight = int(rds.get(key) or 0)
        except Exception:  # Redis down: don't hang the rollout on it; slots still tell
            log.warning("drain of %s: cannot read %s", replica, key, exc_info=True)
            inflight = 0
        busy = 0
        if replica.profile.engine == "llamacpp" and replica.endpoint:
            busy = _busy_slots(http, replica)
            if busy is None:  # the engine is gone: nothing left to wait for
                return {"drained": True, "seconds": time.monotonic() - began, "inflight": inflight, "gone": True}
        if inflight <= 0 and busy == 0:
            return {"drained": True, "seconds": time.monotonic() - began, "inflight": 0}
        if time.monotonic() - began >= timeout:
            return {"drained": False, "seconds": time.monotonic() - began, "inflight": max(inflight, busy)}
        time.sleep(0.05)


def stop(replica: Replica, state: str = ReplicaState.STOPPED, record: bool = True) -> None:
    """Stop the engine and record it stopped (or failed, when state says so); `record=False`
    leaves the record to the caller (to write it with something else)."""
    _backend(replica.node).stop(replica)
    if record and (replica.state != ReplicaState.FAILED or state == ReplicaState.FAILED):
        mark(replica, state)
    try:
        redis_client().delete(inflight_key(replica.id))
    except Exception:
        pass


def alive(replica: Replica) -> bool:
    return _backend(replica.node).alive(replica)


def probe(replica: Replica) -> bool:
    return _backend(replica.node).probe(replica)


def read_log(replica: Replica, lines: int = 50) -> str:
    return _backend(replica.node).read_log(replica, lines)


# --- capacity ------------------------------------------------------------------------


def _cards_of(cpu_only: bool, gpu_class_id: int | None, gpus_per_node: int, tp: int) -> int:
    if cpu_only or (gpu_class_id is None and gpus_per_node == 0):
        return 0
    return max(gpus_per_node, tp, 1)


def _cards(profile: Profile) -> int:
    return _cards_of(profile.cpu_only, profile.gpu_class_id, profile.gpus_per_node, profile.tp)


def surge_possible(profiles) -> dict[int, bool]:
    """For each profile (by id): whether every node that runs it can hold one more copy of
    it next to what it runs now (its cards, or its RAM for CPU-only profiles). False ⇒
    restart in place. One query for any number of profiles (the live preview calls it)."""
    profiles = list(profiles)
    running_here = Node.objects.filter(replicas__profile__in=[p.id for p in profiles], replicas__state__in=ACTIVE)
    rows = Replica.objects.filter(state__in=ACTIVE, node__in=running_here).values_list(
        "node_id", "node__gpu_count", "node__ram_gb", "profile_id", "profile__cpu_only", "profile__gpu_class_id",
        "profile__gpus_per_node", "profile__tp", "profile__min_memory_gb",
    )
    # per node: its cards and RAM, the profiles running there, cards and CPU RAM taken
    nodes: dict[int, dict] = {}
    for node_id, gpu_count, ram_gb, profile_id, cpu_only, gpu_class_id, per_node, tp, min_memory in rows:
        node = nodes.setdefault(node_id, {"gpus": gpu_count, "ram": ram_gb, "profiles": set(), "cards": 0, "ram_used": 0})
        node["profiles"].add(profile_id)
        cards = _cards_of(cpu_only, gpu_class_id, per_node, tp)
        node["cards"] += cards
        node["ram_used"] += 0 if cards else min_memory
    out = {}
    for profile in profiles:
        need_cards = _cards(profile)
        room = True
        for node in nodes.values():
            if not (need_cards or profile.min_memory_gb) or profile.id not in node["profiles"]:
                continue
            if need_cards:
                room &= node["cards"] + need_cards <= node["gpus"]
            elif node["ram"]:
                room &= node["ram_used"] + profile.min_memory_gb <= node["ram"]
        out[profile.id] = room
    return out


# --- reconcile -----------------------------------------------------------------------


def _restart(replica: Replica, msgs: list[str]) -> None:
    try:
        new = start_replica(replica.profile, replica.node, replica.args, slot=replica.slot)
        wait_ready(new)
    except EngineFailed as e:
        failed = Replica.objects.filter(profile=replica.profile, node=replica.node, slot=replica.slot,
                                        state=ReplicaState.STARTING).order_by("-id").first()
        if failed is not None:
            stop(failed, ReplicaState.FAILED)
            mark(failed, ReplicaState.FAILED, error=str(e))
        msgs.append(f"replica {replica.id}: restart failed: {e.reason}")
        return
    mark(new, ReplicaState.READY)
    msgs.append(f"replica {replica.id}: restarted as replica {new.id} at {new.endpoint}")


def reconcile_here(nodes) -> list[str]:
    """Reconcile the replicas of nodes whose engines run on THIS machine: dead processes
    marked (ready ones restarted unless a change of their model is running), engines the
    database no longer tracks stopped, an engine whose starter died before recording its
    pid adopted."""
    nodes = list(nodes)
    names = {n.name for n in nodes}
    msgs: list[str] = []
    changing = set(Change.objects.filter(state__in=[ChangeState.RUNNING, ChangeState.QUEUED]).values_list("model_id", flat=True))
    procs = [p for p in local.engine_processes() if p["node"] in names]
    by_replica = {p["replica_id"]: p for p in procs}
    for r in Replica.objects.filter(node__in=nodes, state__in=ACTIVE).select_related("profile__model", "node"):
        if not r.pid:
            p = by_replica.get(r.id)
            if p is not None:
                Replica.objects.filter(id=r.id, pid__isnull=True).update(pid=p["pid"])
                msgs.append(f"replica {r.id}: adopted its engine, pid {p['pid']}")
            elif r.started_at and (timezone.now() - r.started_at).total_seconds() > 120:
                mark(r, ReplicaState.FAILED, error="its engine was never started (the starter died)")
                msgs.append(f"replica {r.id}: never started, marked failed")
            continue
        if local.alive(r):
            if r.state == ReplicaState.READY and not (local.probe(r) or (time.sleep(1) or local.probe(r))):
                tail = local.read_log(r, 20)
                local.stop(r)
                mark(r, ReplicaState.FAILED, error="its endpoint did not answer /health\n" + tail)
                msgs.append(f"replica {r.id}: endpoint {r.endpoint} does not answer, marked failed")
                if r.profile.model_id not in changing:
                    _restart(r, msgs)
            continue
        tail = local.read_log(r, 20)
        if r.state == ReplicaState.DRAINING:
            mark(r, ReplicaState.STOPPED)
            msgs.append(f"replica {r.id}: draining and gone, marked stopped")
        elif r.state == ReplicaState.STARTING:
            mark(r, ReplicaState.FAILED, error=f"its process (pid {r.pid}) died while starting\n{tail}")
            msgs.append(f"replica {r.id}: died while starting, marked failed")
        else:
            mark(r, ReplicaState.FAILED, error=f"its process (pid {r.pid}) died\n{tail}")
            msgs.append(f"replica {r.id}: process {r.pid} died, marked failed")
            if r.profile.model_id not in changing:
                _restart(r, msgs)
    # engines nobody tracks any more
    tracked = {r.id: r for r in Replica.objects.filter(id__in=list(by_replica))}
    for p in procs:
        r = tracked.get(p["replica_id"])
        if p["age"] < UNTRACKED_GRACE:  # its starter may not have committed its record yet
            continue
        if r is None or r.state not in ACTIVE or (r.pid and r.pid != p["pid"]):
            local.kill_group(p["pid"], settings.LLMGW_STOP_GRACE)
            why = "no such replica" if r is None else f"replica is {r.state}" if r.state not in ACTIVE else f"replica runs as pid {r.pid}"
            msgs.append(f"pid {p['pid']} (replica {p['replica_id']}): untracked engine stopped ({why})")
    return msgs


def reconcile(nodes=None) -> list[str]:
    """Reconcile every node: local ones here, celery ones through their workers."""
    nodes = list(Node.objects.all() if nodes is None else nodes)
    msgs = reconcile_here([n for n in nodes if n.backend != "celery"])
    for node in nodes:
        if node.backend == "celery":
            try:
                msgs += celery_node.reconcile(node)
            except EngineFailed as e:
                msgs.append(str(e))
    for m in msgs:
        log.info("reconcile: %s", m)
    return msgs
