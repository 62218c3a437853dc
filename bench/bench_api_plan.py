"""Benchmark: a dry-run plan through the REST API (POST /api/v1/models/<name>/context with
`dry_run`) for a model with 8 profiles whose shape is cached, against an empty DRF endpoint
(same authentication, same JSON body) measured in the same run.

As in bench_preview.py: every request asks for a context no earlier one asked for, what a
plan is made from is kept between requests as in production (its Redis version read on
every request), and the test environment's instrumentation is not installed.

Run:  .venv/bin/python bench/bench_api_plan.py [--requests 300]

Prints the median (and p90) server time per request, the SQL queries per request and the
ratio to the empty endpoint. Goal: <= 2x the empty endpoint, <= 6 queries.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_preview  # noqa: E402  (sets Django up; its catalog of 8 profiles is reused)
from django.contrib.auth.models import Permission, User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.urls import include, path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402


class Empty(APIView):
    """Token or session authentication and IsAuthenticated, as every API view; nothing else."""

    def post(self, request):
        return Response({})


urlpatterns = [
    path("bench/empty/", Empty.as_view()),
    path("", include("llmgw_console.urls")),
]


def measure(client: Client, url: str, body: str, headers: dict, n: int) -> list[float]:
    return bench_preview.measure(client, url, body, n, content_type="application/json", headers=headers)


def run(n: int) -> None:
    from rest_framework.authtoken.models import Token

    from catalog import plan_inputs

    model = bench_preview.build_catalog()
    user = User.objects.create_user("operator", password="x")
    user.user_permissions.add(Permission.objects.get(codename="change_context"))
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    client = Client()
    url = f"/api/v1/models/{model.name}/context"

    def body() -> str:
        return json.dumps({"tokens": bench_preview.next_tokens(), "slots": 2, "dry_run": True, "message": "bench"})

    for _ in range(20):
        measure(client, url, body, headers, 1)
        measure(client, "/bench/empty/", body, headers, 1)
    for _ in range(3):
        plan = client.post(url, body(), content_type="application/json", headers=headers).json()["plan"]
        assert len(plan["profiles"]) == 8 and plan["refusal"] is None, plan.get("refusal")

    empty_t, plan_t = [], []
    for _ in range(5):  # interleaved, so both see the same machine load
        empty_t += measure(client, "/bench/empty/", body, headers, n // 5)
        plan_t += measure(client, url, body, headers, n // 5)
    def body_after_a_write() -> str:
        plan_inputs.clear()  # as after a write to the catalog: this plan reads it again
        return body()

    first_t = measure(client, url, body_after_a_write, headers, max(n // 5, 20))
    queries = {}
    for name, u in (("empty", "/bench/empty/"), ("plan", url), ("first plan", url)):
        if name == "first plan":
            plan_inputs.clear()  # as after a write to the catalog: the first plan reads it again
        with CaptureQueriesContext(connection) as ctx:
            measure(client, u, body, headers, 1)
        queries[name] = len(ctx.captured_queries)

    bench_preview.report("empty DRF endpoint", empty_t, queries["empty"], "dry-run plan", plan_t, queries["plan"],
                         queries["first plan"], first_t, goal=2, what="token auth, a new context each request")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    n = parser.parse_args().requests
    old = setup_databases(verbosity=0, interactive=False)
    try:
        with override_settings(ROOT_URLCONF=sys.modules[__name__], ALLOWED_HOSTS=["testserver"], DEBUG=False):
            run(n)
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
