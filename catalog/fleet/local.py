"""The local backend: engine processes on this machine.

Each engine runs in its own session (so its own process group, pgid = pid), writes to a
log file under `DATA_DIR/logs/`, and carries in its environment which replica it is
(`LLMGW_REPLICA_ID`), on which node (`LLMGW_NODE`) and for which database
(`LLMGW_FLEET_DB`): reconcile finds, by those marks, engines the database no longer tracks
and stops them. A process survives the worker that started it (a worker killed in the
middle of a rollout does not take replicas with it); the next worker adopts it by pid."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection
from django.utils import timezone

from catalog.choices import ReplicaState
from catalog.models import Replica

from . import engines
from .errors import EngineFailed
from .http import client

log = logging.getLogger(__name__)

ACTIVE = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)
_children: dict[int, subprocess.Popen] = {}  # engines this process started: reaped on stop


def db_mark() -> str:
    return str(connection.settings_dict.get("NAME") or "")


def logs_dir() -> Path:
    path = Path(settings.DATA_DIR) / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- processes ------------------------------------------------------------------


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            if k.startswith(b"LLMGW_"):
                out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)


def process_age(pid: int) -> float:
    """Seconds since the process started (0 when it is gone)."""
    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def pid_is_replica(pid: int | None, replica_id: int) -> bool:
    """Whether pid is alive and is the engine of that replica (not a reused pid)."""
    if not pid:
        return False
    _reap(pid)
    if pid in _children:
        return _children[pid].poll() is None
    if _zombie(pid):
        return False
    env = _proc_env(pid)
    return env.get("LLMGW_REPLICA_ID") == str(replica_id) and env.get("LLMGW_FLEET_DB") == db_mark()


def alive(replica: Replica) -> bool:
    return pid_is_replica(replica.pid, replica.id)


def engine_processes() -> list[dict]:
    """Engines of this database running on this machine: pid, replica id, node."""
    mine = db_mark()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _proc_env(pid)
        if env.get("LLMGW_FLEET_DB") != mine or "LLMGW_REPLICA_ID" not in env or _zombie(pid):
            continue
        try:
            pgid = os.getpgid(pid)
        except OSError:
            continue
        if pgid != pid:  # a child of an engine: its group leader is the engine
            continue
        found.append({"pid": pid, "replica_id": int(env["LLMGW_REPLICA_ID"]), "node": env.get("LLMGW_NODE", ""),
                      "age": process_age(pid)})
    return found


def kill_group(pid: int, grace: float) -> None:
    """SIGTERM the engine's process group, SIGKILL it after grace seconds."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        log.warning("not allowed to signal process group %s", pid)
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        child = _children.get(pid)
        if child is not None:
            try:
                child.wait(timeout=0.05)
                _children.pop(pid, None)
                break
            except subprocess.TimeoutExpired:
                continue
        if _zombie(pid):
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # the rest of the group, or the engine itself
    except (ProcessLookupError, PermissionError):
        pass
    child = _children.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


# --- ports ------------------------------------------------------------------------


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("", "localhost") else "127.0.0.1", port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _choose_port(replica: Replica) -> int:
    low, high = settings.LLMGW_PORT_RANGE
    taken = set(Replica.objects.filter(node__host=replica.node.host, state__in=ACTIVE, port__isnull=False)
                .exclude(id=replica.id).values_list("port", flat=True))
    ports = list(range(low, high + 1))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        if port not in taken and _port_free(replica.node.host, port):
            return port
    raise EngineFailed(f"no free port in {low}-{high} on {replica.node.host}")


# --- replicas -----------------------------------------------------------------------


def start(replica: Replica) -> Replica:
    """Spawn the engine of a replica row (state starting, args set); record port, endpoint,
    log, pid and start time in one write. The port is chosen and taken (by the engine's
    record) under a machine-wide lock, so two starters never pick the same one."""
    profile = replica.profile
    node = replica.node
    logs = logs_dir()
    # A new file for each start; the time keeps apart replicas of other databases that
    # share this data folder (test runs, a second console) and happen to have the same id.
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S-%f")
    replica.log_path = str(logs / f"replica-{replica.id}-{profile.model.name}-{profile.name}-{stamp}.log")
    with open(logs / ".ports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        port = _choose_port(replica)
        cmd = engines.command(profile.engine, profile.model, node.host, port, list(replica.args))
        env = dict(os.environ, LLMGW_REPLICA_ID=str(replica.id), LLMGW_NODE=node.name, LLMGW_FLEET_DB=db_mark())
        with open(replica.log_path, "wb") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            replica.started_at = timezone.now()
            try:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=settings.BASE_DIR, start_new_session=True, close_fds=True)
            except OSError as e:
                out.write(f"cannot start the engine: {e}\n".encode())
                replica.save(update_fields=["log_path"])
                raise EngineFailed(f"cannot start the engine: {e}", f"{' '.join(cmd)}: {e}") from e
        _children[proc.pid] = proc
        replica.port = port
        replica.endpoint = f"http://{node.host}:{port}"
        replica.pid = proc.pid
        replica.save(update_fields=["port", "endpoint", "log_path", "pid", "started_at"])
    log.info("started %s: pid %s, %s", replica, proc.pid, replica.endpoint)
    return replica


def read_log(replica: Replica, lines: int = 50) -> str:
    if not replica.log_path:
        return ""
    try:
        with open(replica.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            tail = deque(f.read().decode(errors="replace").splitlines(), maxlen=lines)
    except OSError:
        return ""
    return "\n".join(tail)


def wait_ready(replica: Replica, timeout: float) -> float:
    """Health 200 and one real completion answered; seconds it took. EngineFailed when the
    process exits meanwhile (with its last log lines) or the timeout passes."""
    engine = replica.profile.engine
    probe = engines.probe(engine, replica.profile.model.name)
    began = time.monotonic()
    deadline = began + timeout
    healthy = False
    http = client()
    while True:
        if not alive(replica):
            raise EngineFailed(f"the engine exited while starting (pid {replica.pid})", read_log(replica, 30))
        try:
            if not healthy:
                healthy = http.get(engines.health_url(engine, replica.endpoint)).status_code == 200
            if healthy:
                r = http.post(replica.endpoint + probe.path, json=probe.body, timeout=max(5.0, min(60.0, deadline - time.monotonic())))
                if r.status_code == 200 and r.json():
                    return time.monotonic() - began
                healthy = False
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() >= deadline:
            raise EngineFailed(f"no health and completion within {timeout:.0f} s", read_log(replica, 30))
        time.sleep(0.02 if time.monotonic() - began < 3 else 0.25)


def stop(replica: Replica, grace: float | None = None) -> None:
    """Stop the replica's engine (its whole process group). The caller records the state."""
    grace = settings.LLMGW_STOP_GRACE if grace is None else grace
    if replica.pid and pid_is_replica(replica.pid, replica.id):
        kill_group(replica.pid, grace)
    else:
        _reap(replica.pid or 0)


def probe(replica: Replica) -> bool:
    if not alive(replica):
        return False
    try:
        r = client().get(engines.health_url(replica.profile.engine, replica.endpoint), timeout=5.0)
        return r.status_code == 200
    except httpx.HTTPError:
        return False
