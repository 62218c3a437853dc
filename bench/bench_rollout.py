"""The rollout's orchestration overhead (SPEC §5; not part of the test run).

    .venv/bin/python bench/bench_rollout.py [--replicas 4] [--width 64] [--layers 2] [--runs 1]

A context change of a model served by N real llama-server replicas on this machine, run by
catalog.rollout.run in this process (the Celery task calls exactly that), on a migrated SQLite
file in a temporary LLMGW_DATA and Redis database 14. It measures, in the same run, the total
time of the rollout against the sum of the replicas' own times: each new replica's start
(spawn → health 200 and a completion answered) and each old replica's drain and stop
(draining → process gone). The rest is the orchestration's overhead: database writes, port
choice, polling. Goal: overhead under 10% of the total.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--width", type=int, default=64, help="the tiny model's width (bigger loads slower)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print where the rollout's own time goes (cProfile)")
    ap.add_argument("--profile-sort", default="tottime", help="cProfile sort key (tottime, cumtime)")
    ap.add_argument("--queries", action="store_true", help="print the rollout's SQL statements")
    ap.add_argument("--postgres", metavar="URL", help="run on a fresh database on this PostgreSQL server "
                    "(e.g. postgres://postgres@127.0.0.1:5432/postgres) instead of a SQLite file")
    ap.add_argument("--sqlite-wal", action="store_true", help="SQLite in WAL mode with synchronous=NORMAL "
                    "(commits without an fsync each) instead of the settings' default journal")
    opts = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="llmgw-bench-rollout-"))
    database_url = f"sqlite:///{data / 'bench.sqlite3'}"
    dropdb = None
    if opts.postgres:
        import psycopg

        name = f"llmgw_bench_rollout_{os.getpid()}"
        with psycopg.connect(opts.postgres, autocommit=True) as pg:
            pg.execute(f'CREATE DATABASE "{name}"')
        database_url = opts.postgres.rsplit("/", 1)[0] + "/" + name

        def dropdb():
            from django.db import connections

            connections.close_all()
            with psycopg.connect(opts.postgres, autocommit=True) as pg:
                pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    os.environ.update(LLMGW_DATA=str(data), DATABASE_URL=database_url,
                      REDIS_URL=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
                      DJANGO_SETTINGS_MODULE="llmgw_console.settings", LOG_LEVEL="WARNING")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if opts.sqlite_wal:
        from django.db.backends.signals import connection_created

        def wal(sender, connection, **kwargs):
            if connection.vendor == "sqlite":
                with connection.cursor() as c:
                    c.execute("PRAGMA journal_mode=WAL")
                    c.execute("PRAGMA synchronous=NORMAL")

        connection_created.connect(wal)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from catalog import fleet, rollout
    from catalog.choices import ChangeState, ReplicaState
    from catalog.fleet import engines
    from catalog.fleet.tiny_gguf import write_tiny_llama
    from catalog.models import Change, Model, Node, Profile

    print(f"llama-server: {engines.llama_server_binary()}")
    print(f"database: {database_url}" + (" (WAL, synchronous=NORMAL)" if opts.sqlite_wal else ""))
    gguf = write_tiny_llama(data / "models" / "bench.gguf", context_length=16384, width=opts.width, layers=opts.layers,
                            heads=max(4, opts.width // 64), kv_heads=max(2, opts.width // 128), ffn=opts.width * 2)
    print(f"model: {gguf.stat().st_size / 2**20:.1f} MiB, {opts.layers} layers, width {opts.width}")
    model = Model.objects.create(name="bench", source=str(gguf), context_length=16384, shape={"trained_context": 16384})
    args = ["--ctx-size", "1024", "--parallel", "2", "--threads", "1"]
    profile = Profile.objects.create(model=model, name="cpu", engine="llamacpp", args=args, cpu_only=True)
    node = Node.objects.create(name="local", backend="local")
    replicas = [fleet.start_replica(profile, node, args, slot=i) for i in range(opts.replicas)]
    for r in replicas:
        fleet.wait_ready(r)
        fleet.mark(r, ReplicaState.READY)

    def stamp(step, text) -> datetime:
        for line in step.detail.splitlines():
            t, _, rest = line.partition(" ")
            if text in rest:
                return datetime.fromisoformat(t)
        raise RuntimeError(f"no {text!r} in step {step.position}")

    # A worker has its Redis connection open after its first task: so does this process.
    fleet.redis_client().ping()
    ratios = []
    try:
        for run in range(opts.runs):
            ctx = 2048 * (run + 2)
            profile.args = ["--ctx-size", str(ctx), "--parallel", "4", "--threads", "1"]
            profile.save()
            change = Change.objects.create(model=model, kind="context", source="cli", state=ChangeState.QUEUED)
            profiler = None
            if opts.profile:
                import cProfile

                profiler = cProfile.Profile(time.perf_counter)
                profiler.enable()
            from django.db import connection
            from django.test.utils import CaptureQueriesContext

            captured = CaptureQueriesContext(connection)
            captured.__enter__()
            from django.utils import timezone

            wall0 = timezone.now()
            began = time.perf_counter()
            outcome = rollout.run(change.id)
            total = time.perf_counter() - began
            captured.__exit__(None, None, None)
            if opts.queries:
                for q in captured.captured_queries:
                    print(f"  {float(q['time']) * 1000:6.1f} ms  {q['sql'][:150]}")
            if profiler is not None:
                import pstats

                profiler.disable()
                pstats.Stats(profiler).sort_stats(opts.profile_sort).print_stats(40)
            change.refresh_from_db()
            if outcome != "succeeded":
                print(f"rollout {outcome}: {change.error}")
                return 1
            start_sum = drain_sum = 0.0
            print(f"\nrun {run + 1}: --ctx-size {ctx} --parallel 4 over {opts.replicas} replicas")
            for step in change.steps.order_by("position"):
                new, old = step.new_replica, step.old_replica
                start = (stamp(step, f"new replica {new.id} ready") - new.started_at).total_seconds()
                drain = (old.stopped_at - stamp(step, f"old replica {old.id} draining")).total_seconds()
                start_sum += start
                drain_sum += drain
                ms = lambda a, b: (b - a).total_seconds() * 1000  # noqa: E731
                print(f"  step {step.position}: start {start * 1000:7.1f} ms   drain+stop {drain * 1000:7.1f} ms   "
                      f"step {ms(step.started_at, step.finished_at):7.1f} ms   (before spawn "
                      f"{ms(step.started_at, new.started_at):5.1f}, ready→draining "
                      f"{ms(stamp(step, f'new replica {new.id} ready'), stamp(step, f'old replica {old.id} draining')):5.1f}, "
                      f"stopped→done {ms(old.stopped_at, step.finished_at):5.1f} ms)")
            steps = list(change.steps.order_by("position"))
            gaps = [(b.started_at - a.finished_at).total_seconds() * 1000 for a, b in zip(steps, steps[1:])]
            print(f"  before step 1 {(steps[0].started_at - wall0).total_seconds() * 1000:.1f} ms, between steps "
                  + ", ".join(f"{g:.1f}" for g in gaps) + f" ms, after the last "
                  f"{(change.finished_at - steps[-1].finished_at).total_seconds() * 1000:.1f} ms")
            own = start_sum + drain_sum
            overhead = total - own
            ratios.append(overhead / total)
            print(f"  total {total * 1000:.1f} ms; replicas' own time {own * 1000:.1f} ms "
                  f"(starts {start_sum * 1000:.1f} + drains/stops {drain_sum * 1000:.1f})")
            print(f"  {len(captured.captured_queries)} SQL statements")
            print(f"  orchestration overhead {overhead * 1000:.1f} ms = {overhead / total:.1%} of the total (goal < 10%)")
    finally:
        from catalog.models import Replica

        for r in Replica.objects.filter(state__in=[ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING]):
            fleet.stop(r)
        if dropdb is not None:
            dropdb()
    if opts.runs > 1:
        print(f"\noverhead ratio over {opts.runs} runs: " + ", ".join(f"{x:.1%}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
