"""Real parts for the fleet's tests: llama-server processes, Redis, Celery workers.

Isolation from whatever else runs on this machine: a private Redis database and a private
default queue (set here, before the Celery app reads its configuration), and a test
database the workers can open too: a file (SQLite) or a uniquely named PostgreSQL database.
A worker is pointed at it with DATABASE_URL, read by settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings

from llmgw_console.celery import app as celery_app

REDIS_DB = int(os.environ.get("LLMGW_TEST_REDIS_DB", "13"))
_base = settings.REDIS_URL.rsplit("/", 1)[0] if settings.REDIS_URL.count("/") >= 3 else settings.REDIS_URL
TEST_REDIS_URL = f"{_base}/{REDIS_DB}"
TEST_QUEUE = f"llmgw-fleet-test-{os.getpid()}"
ROOT = Path(__file__).resolve().parents[2]

# Short timeouts: failures show up in seconds, not minutes. Workers get them as environment.
FLEET_SETTINGS = {
    "LLMGW_READY_TIMEOUT": "30",
    "LLMGW_DRAIN_TIMEOUT": "30",
    "LLMGW_STOP_GRACE": "5",
    "LLMGW_ROLLOUT_LOCK_TTL": "4",
    "LLMGW_SWEEP_GRACE": "2",
}


def _configure_celery(broker: str, backend: str, queue: str) -> None:
    """Point this process's Celery app elsewhere, dropping connections made before."""
    import kombu.pools

    celery_app.conf.update(broker_url=broker, result_backend=backend, task_default_queue=queue)
    if celery_app._pool is not None:
        celery_app._pool.force_close_all()
        celery_app._pool = None
    celery_app.amqp._producer_pool = None
    kombu.pools.reset()  # kombu keeps producer pools per broker globally: closed ones must not be reused
    if getattr(celery_app._local, "backend", None) is not None:
        del celery_app._local.backend


@pytest.fixture(scope="package", autouse=True)
def _private_redis_and_queue():
    """For the fleet's tests only: a private Redis database and default queue (this process
    and its workers), and short timeouts; all put back afterwards."""
    from django.test.utils import override_settings

    over = override_settings(REDIS_URL=TEST_REDIS_URL, CELERY_BROKER_URL=TEST_REDIS_URL,
                             CELERY_RESULT_BACKEND=TEST_REDIS_URL, CELERY_TASK_DEFAULT_QUEUE=TEST_QUEUE,
                             **{k: float(v) for k, v in FLEET_SETTINGS.items()})
    before = (celery_app.conf.broker_url, celery_app.conf.result_backend, celery_app.conf.task_default_queue)
    over.enable()
    _configure_celery(TEST_REDIS_URL, TEST_REDIS_URL, TEST_QUEUE)
    import redis

    r = redis.Redis.from_url(TEST_REDIS_URL)
    for q in (TEST_QUEUE, "node.a", "node.b"):  # nothing left from an interrupted run
        r.delete(q)
    yield
    over.disable()
    _configure_celery(*before)


def database_url() -> str:
    """The test database as a DATABASE_URL a worker can be given."""
    from django.db import connection

    d = connection.settings_dict
    name = d["NAME"]
    if d["ENGINE"].endswith("sqlite3"):
        if not name or str(name) == ":memory:" or "mode=memory" in str(name):
            pytest.skip("the fleet tests need a test database other processes can open")
        return f"sqlite:///{Path(name).resolve()}"
    auth = quote(d.get("USER") or "")
    if d.get("PASSWORD"):
        auth += ":" + quote(d["PASSWORD"])
    host = d.get("HOST") or "127.0.0.1"
    port = d.get("PORT") or 5432
    return f"postgres://{auth}@{host}:{port}/{name}"


class Worker:
    def __init__(self, name: str, queues: list[str], pool: str, log_path: Path, env: dict):
        self.name = name
        self.log_path = log_path
        cmd = [sys.executable, "-m", "celery", "-A", "llmgw_console", "worker", "-Q", ",".join(queues),
               "-n", f"{name}-{os.getpid()}@%h", "--pool", pool, "--without-gossip", "--without-mingle",
               "--without-heartbeat", "-l", "INFO"]
        if pool != "solo":
            cmd += ["--concurrency", "4"]
        self.out = open(log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> "Worker":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log()[-3000:]}")
            if " ready." in self.log():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} not ready in {timeout} s:\n{self.log()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


@pytest.fixture
def start_worker(transactional_db, tmp_path):
    """start_worker(name, queues=None, pool="solo") -> a ready Celery worker subprocess on
    the test database, the private Redis database and the test's queues."""
    started: list[Worker] = []
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="llmgw_console.settings", DATABASE_URL=database_url(),
               REDIS_URL=TEST_REDIS_URL, CELERY_RESULT_BACKEND=TEST_REDIS_URL, LLMGW_CELERY_QUEUE=TEST_QUEUE,
               LLMGW_DATA=str(settings.DATA_DIR), PYTHONUNBUFFERED="1", **FLEET_SETTINGS)

    def start(name: str, queues: list[str] | None = None, pool: str = "solo") -> Worker:
        w = Worker(name, queues or [TEST_QUEUE], pool, tmp_path / f"worker-{name}-{len(started)}.log", env)
        started.append(w)
        return w.wait_ready()

    yield start
    for w in started:
        w.stop()


@pytest.fixture(scope="session")
def llama_server():
    from catalog.fleet import engines

    return engines.llama_server_binary()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    from catalog.fleet.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama.gguf", context_length=16384)


@pytest.fixture(autouse=True)
def _no_engine_left(request):
    """After each test: no engine of the test database still runs (they are stopped if so)."""
    yield
    if "transactional_db" not in request.fixturenames:
        return
    from catalog.fleet import local

    for p in local.engine_processes():
        local.kill_group(p["pid"], 2.0)


@pytest.fixture
def catalog_rows(transactional_db, tiny_model_path):
    """make(name, args, nodes=...) -> (model, profile): a llama.cpp model on the tiny GGUF."""
    from catalog.models import Model, Node, Profile

    def make(name: str = "tiny", args: list[str] | None = None, engine: str = "llamacpp", source: str | None = None,
             context_length: int = 16384):
        model = Model.objects.create(name=name, source=source or str(tiny_model_path), context_length=context_length,
                                     shape={"trained_context": context_length})
        profile = Profile.objects.create(model=model, name="cpu", engine=engine, args=list(args or []), cpu_only=True)
        return model, profile

    def node(name: str = "local", backend: str = "local") -> Node:
        return Node.objects.get_or_create(name=name, defaults={"backend": backend, "host": "127.0.0.1"})[0]

    make.node = node
    return make
