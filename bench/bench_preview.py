"""Benchmark: the console's live preview (POST /models/<name>/context/preview/) for a model
with 8 profiles whose shape is cached, against a bare login-required Django view measured
in the same run, through the same middleware and test client.

Run:  .venv/bin/python bench/bench_preview.py [--requests 300]

Every preview asks for a context no earlier request asked for (as an admin typing does), so
nothing computed from a request can be reused; what a plan is made from (the catalog's rows,
the fleet's room, the shape) is kept between requests as in production (catalog.plan_inputs),
dropped whenever the catalog changes. The test environment's template instrumentation
(django.test.utils.setup_test_environment, which copies every template context for the test
client) is not installed: it is not part of a server's time.

Prints the median (and p90) server time per request, the SQL queries per request, the
ratio to the bare view, and where the preview's time goes (the inputs, the plan, the
template), so that a slow part can be named. Goal: <= 3x the bare view, <= 6 queries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_console.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import Permission, User  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import HttpResponse, QueryDict  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases  # noqa: E402
from django.urls import include, path  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

GiB = 1 << 30
FORM = "application/x-www-form-urlencoded"


@require_POST
def bare(request):
    """Login required (by the middleware, as every console page), nothing else."""
    return HttpResponse("ok")


urlpatterns = [
    path("bench/bare/", bare),
    path("", include("llmgw_console.urls")),
]


def build_catalog():
    """A model served 8 ways (llama.cpp on cards and CPUs, vLLM, SGLang, strata, freetoken),
    one ready replica per profile on 4 nodes, its shape cached as catalog.shapes stores it."""
    from django.utils import timezone

    from catalog import shapes
    from catalog.domain.shape import Shape
    from catalog.models import GPUClass, Model, Node, OriginFile, Profile, Replica

    a100, h100, l40s = (GPUClass.objects.get(name=n) for n in ("A100-80G", "H100-80G", "L40S"))
    nodes = [
        Node.objects.create(name="gpu-a", gpu_class=a100, gpu_count=8, ram_gb=1024),
        Node.objects.create(name="gpu-h", gpu_class=h100, gpu_count=8, ram_gb=1024),
        Node.objects.create(name="gpu-l", gpu_class=l40s, gpu_count=4, ram_gb=512),
        Node.objects.create(name="cpu-1", ram_gb=512),
    ]
    model = Model.objects.create(
        name="bench-70b", source="https://mirror.example/bench-70b.gguf", origin_repo="example/bench-70b",
        context_length=8192, max_output=2048,
    )
    OriginFile.objects.create(model=model, path="model.safetensors", size=40 * GiB)
    profiles = [
        ("ll-a100", "llamacpp", ["--ctx-size", "16384", "--parallel", "2"], a100, 2, 1, nodes[0]),
        ("ll-h100", "llamacpp", ["-c", "8192", "-np", "1", "--cache-type-k", "q8_0"], h100, 1, 1, nodes[1]),
        ("ll-cpu", "llamacpp", ["--ctx-size", "8192", "--parallel", "1"], None, 0, 1, nodes[3]),
        ("vllm-tp2", "vllm", ["--max-model-len=8192", "--gpu-memory-utilization", "0.9"], h100, 2, 2, nodes[1]),
        ("vllm-tp4", "vllm", ["--max-model-len", "8192"], a100, 4, 4, nodes[0]),
        ("sglang", "sglang", ["--context-length", "8192", "--mem-fraction-static", "0.85"], l40s, 4, 4, nodes[2]),
        ("strata", "strata", ["--context", "8192"], a100, 1, 1, nodes[0]),
        ("freetoken", "freetoken", ["--max-seq-len-override", "8192"], l40s, 1, 1, nodes[2]),
    ]
    for name, engine, args, gpu, per_node, tp, node in profiles:
        p = Profile.objects.create(
            model=model, name=name, engine=engine, args=args, gpu_class=gpu, gpus_per_node=per_node, tp=tp,
            cpu_only=gpu is None, min_memory_gb=60 if gpu is None else 0,
        )
        Replica.objects.create(profile=p, node=node, state="ready", endpoint="http://127.0.0.1:1", args=args)
    shape = Shape(
        architecture="llama", layers=80, heads=64, kv_heads=8, trained_context=131072, head_k=128, head_v=128,
        weights_bytes=40 * GiB, source_kind="gguf",
    )
    # The cache as catalog.shapes writes it: the preview reads no header.
    model.shape, model.shape_key, model.shape_read_at = shape.to_dict(), shapes._key(model), timezone.now()
    model.save()
    return model


_asked = 0


def next_tokens() -> int:
    """A context no earlier request of this run asked for: 8192 to 32768 tokens, 64 apart,
    then the same range shifted by one token, and so on."""
    global _asked
    _asked += 1
    steps = (32768 - 8192) // 64
    return 8192 + 64 * (_asked % steps) + _asked // steps


def measure(client: Client, url: str, data, n: int, **post) -> list[float]:
    """n POSTs to url of data (or of data(), called before each request, out of the time):
    their times; every answer must be 200."""
    times = []
    for _ in range(n):
        body = data() if callable(data) else data
        t = time.perf_counter()
        response = client.post(url, body, **post)
        times.append(time.perf_counter() - t)
        assert response.status_code == 200, response.status_code
    return times


def count_queries(client: Client, url: str, data: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        client.post(url, data, content_type=FORM)
    return len(ctx.captured_queries)


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


def report(base: str, base_t: list[float], base_q: int, name: str, times: list[float], kept_q: int, read_q: int,
           first_t: list[float], *, goal: float, what: str) -> float:
    """The figures of a run: medians and p90s, queries, the ratio to the baseline against
    its goal, and the first request after a catalog write. Returns the median."""

    def p90(xs: list[float]) -> float:
        return sorted(xs)[int(len(xs) * 0.9)]

    b, m, first = statistics.median(base_t), statistics.median(times), statistics.median(first_t)
    print(f"requests each: {len(times)} (8 profiles, shape cached, {what})")
    print(f"{base:24s}: median {ms(b)}  p90 {ms(p90(base_t))}  queries {base_q}")
    print(f"{name:24s}: median {ms(m)}  p90 {ms(p90(times))}  queries {kept_q} ({read_q} on the first after a catalog write)")
    print(f"ratio                   : {m / b:.2f}x   (goal <= {goal:g}x)")
    print(f"first after a write     : median {ms(first)}  ({first / b:.2f}x the baseline)")
    print(f"queries                 : {max(kept_q, read_q)} at most   (goal <= 6)")
    return m


def timed(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    n = args.requests

    old = setup_databases(verbosity=0, interactive=False)
    try:
        with override_settings(
            ROOT_URLCONF=sys.modules[__name__],
            PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
            ALLOWED_HOSTS=["testserver"],
            DEBUG=False,
        ):
            run(n)
    finally:
        from django.test.utils import teardown_databases

        teardown_databases(old, verbosity=0)


def run(n: int) -> None:
    from django.template.loader import render_to_string

    from catalog import plan_inputs, services, views
    from catalog.forms import ContextForm

    model = build_catalog()
    user = User.objects.create_user("operator", password="x")
    user.user_permissions.add(Permission.objects.get(codename="change_context"))
    client = Client()
    client.force_login(user)

    preview_url = f"/models/{model.name}/context/preview/"

    def data() -> str:
        """The form as htmx posts it (application/x-www-form-urlencoded)."""
        return urlencode({"tokens": next_tokens(), "slots": 2, "max_output": "", "message": "bench"})

    # Warm up both (template loading, URL resolvers, imports).
    for _ in range(20):
        client.post(preview_url, data(), content_type=FORM)
        client.post("/bench/bare/", data(), content_type=FORM)
    for _ in range(3):
        answer = client.post(preview_url, data(), content_type=FORM)
        assert answer.status_code == 200 and answer.content.count(b'data-profile="') == 8, answer.content[:500]
        assert b"Refused" not in answer.content, answer.content[:2000]

    # Interleaved rounds so both see the same machine load; queries counted apart (capturing
    # them slows each query down).
    bare_t, prev_t = [], []
    for _ in range(5):
        bare_t += measure(client, "/bench/bare/", data, n // 5, content_type=FORM)
        prev_t += measure(client, preview_url, data, n // 5, content_type=FORM)

    def data_after_a_write() -> str:
        plan_inputs.clear()  # as after a write to the catalog: this preview reads it again
        return data()

    first_t = measure(client, preview_url, data_after_a_write, max(n // 5, 20), content_type=FORM)
    bare_q = count_queries(client, "/bench/bare/", data())
    kept_q = count_queries(client, preview_url, data())
    plan_inputs.clear()  # as after a write to the catalog: the first preview reads it again
    read_q = count_queries(client, preview_url, data())

    prev_med = report("bare login-required view", bare_t, bare_q, "console preview", prev_t, kept_q, read_q, first_t,
                      goal=3, what="a new context each request")

    # Where the preview's time goes.
    from catalog.domain.plan import ChangeRequest, plan_change

    kwargs = {"tokens": 32768, "slots": 2, "max_output": 0}
    plan = services.preview(model.name, **kwargs)
    svc = timed(lambda: services.preview(model.name, tokens=next_tokens(), slots=2), 200)
    with CaptureQueriesContext(connection) as ctx:
        inputs = services._planning_inputs(model.name)
    load_queries = [q["sql"] for q in ctx.captured_queries]
    load = timed(lambda: services._planning_inputs(model.name), 100)
    domain = timed(lambda: plan_change(*inputs, ChangeRequest(tokens=next_tokens(), slots=2), name=model.name), 200)

    form = ContextForm(QueryDict(data()))
    form.is_valid()

    def render():
        ctx = views._panel_context(type("M", (), {"name": model.name})(), form, views.plan_view(plan), preview=True)
        ctx["can_change"] = True
        return render_to_string("catalog/model_detail.html#preview", ctx)

    tpl = timed(render, 200)
    print()
    print("where the preview's time goes (median, called directly):")
    print(f"  services.preview                 {ms(svc)}")
    print(f"    of which the plan              {ms(domain)}")
    print(f"  plan_view + fragment             {ms(tpl)}")
    print(f"  the rest (middleware, session, auth, form, client) ~ {ms(max(prev_med - svc - tpl, 0))}")
    print(f"  not spent while the catalog is unchanged: reading the inputs, {ms(load)} ({len(load_queries)} queries):")
    for sql in load_queries:
        print("    ", sql[:140])


if __name__ == "__main__":
    main()
