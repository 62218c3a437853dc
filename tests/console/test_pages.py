"""The console's pages: login required everywhere, whole pages and their htmx partials."""

import pytest
from django.test import Client
from django.urls import reverse

from catalog.models import Change, ChangeStep, Replica
from tests.builders import make_model

from .conftest import HX

pytestmark = pytest.mark.django_db


def urls(model, change, replica):
    return [
        ("get", reverse("catalog:model_list")),
        ("get", reverse("catalog:model_detail", args=[model.name])),
        ("post", reverse("catalog:context_preview", args=[model.name])),
        ("post", reverse("catalog:context_change", args=[model.name])),
        ("get", reverse("catalog:change_list")),
        ("get", reverse("catalog:change_detail", args=[change.pk])),
        ("post", reverse("catalog:change_rollback", args=[change.pk])),
        ("get", reverse("catalog:replica_log", args=[replica.pk])),
    ]


@pytest.fixture
def change(model, operator):
    return Change.objects.create(
        model=model, kind="context", state="failed", user=operator, source="console", message="longer documents",
        before={"context_length": 8192, "max_output": 2048}, after={"context_length": 16384, "max_output": 4096},
        error="replica 2 did not become healthy",
    )


def test_anonymous_is_sent_to_login_from_every_page(model, change):
    replica = Replica.objects.first()
    client = Client()
    for method, url in urls(model, change, replica):
        response = getattr(client, method)(url, {"tokens": "16384"} if method == "post" else None)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login") + "?next="), url
    assert Change.objects.count() == 1  # nothing was changed by an anonymous POST


def test_login_page_logs_in_and_goes_to_the_models(operator):
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post(reverse("login"), {"username": "operator", "password": "pw-operator-123"})
    assert response.status_code == 302 and response["Location"] == reverse("catalog:model_list")
    assert client.get(reverse("catalog:model_list")).status_code == 200
    bad = Client().post(reverse("login"), {"username": "operator", "password": "wrong"})
    assert bad.status_code == 200 and b"class=\"error\"" in bad.content


def test_model_list_shows_each_model_with_few_queries(viewer_client, model, django_assert_max_num_queries):
    other = make_model("qwen-7b", context=4096, max_output=0)
    Replica.objects.filter(profile__model=other, profile__name="vllm").update(state="starting")
    Replica.objects.create(profile=other.profiles.get(name="cpu"), node=Replica.objects.first().node, state="stopped")
    active = Change.objects.create(model=other, kind="context", state="running", source="api")
    with django_assert_max_num_queries(4):  # session, user, models with their counts
        response = viewer_client.get(reverse("catalog:model_list"))
    rows = response.content.decode()
    assert response.status_code == 200
    assert 'href="/models/llama-8b/"' in rows and 'href="/models/qwen-7b/"' in rows
    assert ">3/3<" in rows  # llama-8b: three profiles, each with one ready replica
    assert ">2/3<" in rows  # qwen-7b: one starting, the stopped one not counted
    assert f'href="/changes/{active.pk}/"' in rows and "no limit" in rows


def test_model_page_shows_profiles_replicas_shape_and_changes(viewer_client, model, change):
    model.shape = {"architecture": "llama", "layers": 32, "heads": 32, "kv_heads": 8, "trained_context": 32768,
                   "head_k": 128, "head_v": 128, "weights_bytes": 16 << 30}
    model.shape_error = "header: the mirror answered 503"
    model.save()
    replica = Replica.objects.filter(profile__name="vllm").get()
    page = viewer_client.get(reverse("catalog:model_detail", args=[model.name])).content.decode()
    assert "--gpu-memory-utilization" in page  # a profile's args
    assert replica.endpoint in page and reverse("catalog:replica_log", args=[replica.pk]) in page
    assert "llama" in page and "32768" in page and "128.0 KiB" in page  # the cached shape, KV a token
    assert "the mirror answered 503" in page  # its note
    assert reverse("catalog:change_detail", args=[change.pk]) in page and "longer documents" in page
    assert "Context length…" in page


def test_model_page_shows_memory_as_planned_by_the_last_change(operator_client, model):
    operator_client.post(reverse("catalog:context_change", args=[model.name]), {"tokens": "16384"})
    page = operator_client.get(reverse("catalog:model_detail", args=[model.name])).content.decode()
    assert "Memory as planned by" in page
    assert "20.5 GB a card of 1, of 79 usable" in page  # the gguf profile, from the change's plan


def test_unknown_model_is_404(viewer_client):
    assert viewer_client.get(reverse("catalog:model_detail", args=["nope"])).status_code == 404


def test_change_page_polls_while_active_and_stops_when_it_ends(viewer_client, model):
    change = Change.objects.create(model=model, kind="context", state="running", source="console",
                                   before={"context_length": 8192}, after={"context_length": 16384})
    url = reverse("catalog:change_detail", args=[change.pk])
    page = viewer_client.get(url)
    assert page.status_code == 200 and b"<html" in page.content
    assert b'hx-trigger="every 1s"' in page.content and f'hx-get="{url}"'.encode() in page.content

    partial = viewer_client.get(url, **HX)
    assert partial.status_code == 200
    assert b"<html" not in partial.content and b'id="change-live"' in partial.content
    assert b'hx-trigger="every 1s"' in partial.content

    Change.objects.filter(pk=change.pk).update(state="succeeded")
    ended = viewer_client.get(url, **HX)
    assert ended.status_code == 286  # htmx stops polling, and swaps in the last state
    assert b"Succeeded" in ended.content and b"hx-trigger" not in ended.content
    assert b"hx-trigger" not in viewer_client.get(url).content


def test_change_page_shows_each_replica_step_and_the_failed_engine_log(viewer_client, model, change, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(200)) + "error: failed to allocate KV cache\n")
    old = Replica.objects.filter(profile__name="gguf").get()
    new = Replica.objects.create(profile=old.profile, node=old.node, state="failed", log_path=str(log))
    cpu = Replica.objects.filter(profile__name="cpu").get()
    ChangeStep.objects.create(change=change, position=0, profile=cpu.profile, node=cpu.node, old_replica=cpu, state="done")
    ChangeStep.objects.create(change=change, position=1, profile=old.profile, node=old.node,
                              old_replica=old, new_replica=new, state="failed", detail="no health within 120 s")
    ChangeStep.objects.create(change=change, position=2, profile=old.profile, node=old.node, state="pending")
    page = viewer_client.get(reverse("catalog:change_detail", args=[change.pk])).content.decode()
    assert "Replica 1 of 3" in page and "Replica 2 of 3" in page and "Replica 3 of 3" in page
    assert "1 of 3 replicas done" in page
    assert "no health within 120 s" in page and "replica 2 did not become healthy" in page
    assert "error: failed to allocate KV cache" in page and "line 199" in page
    assert "line 100\n" not in page  # only the last lines
    assert "Roll back" not in page  # a viewer gets no rollback button


def test_failed_change_offers_a_rollback_to_whoever_may_change(operator_client, viewer_client, change):
    url = reverse("catalog:change_detail", args=[change.pk])
    rollback = reverse("catalog:change_rollback", args=[change.pk])
    assert rollback in operator_client.get(url).content.decode()
    assert rollback not in viewer_client.get(url).content.decode()
    assert viewer_client.post(rollback).status_code == 403
    assert Change.objects.count() == 1


def test_rollback_makes_a_new_change_back_to_the_old_context(operator_client, model, change, enqueued):
    response = operator_client.post(reverse("catalog:change_rollback", args=[change.pk]), {"message": "it broke"})
    new = Change.objects.exclude(pk=change.pk).get()
    assert response.status_code == 302 and response["Location"] == new.get_absolute_url()
    assert (new.kind, new.rollback_of, new.message, new.source) == ("rollback", change, "it broke", "console")
    assert new.plan["context_after"] == 8192
    htmx = operator_client.post(reverse("catalog:change_rollback", args=[change.pk]), **HX)
    assert htmx.status_code == 200 and htmx["HX-Redirect"] == new.get_absolute_url()  # the running one: follow it


def test_history_filters_by_model_user_source_and_state(viewer_client, model, operator, admin_user):
    other = make_model("qwen-7b")
    a = Change.objects.create(model=model, kind="context", state="succeeded", user=operator, source="console")
    b = Change.objects.create(model=other, kind="max_output", state="failed", user=admin_user, source="api")
    c = Change.objects.create(model=other, kind="context", state="refused", user=operator, source="cli")

    def shown(**params):
        page = viewer_client.get(reverse("catalog:change_list"), params).content.decode()
        return {x.pk for x in (a, b, c) if f'href="/changes/{x.pk}/"' in page}

    assert shown() == {a.pk, b.pk, c.pk}
    assert shown(model="qwen-7b") == {b.pk, c.pk}
    assert shown(user="operator") == {a.pk, c.pk}
    assert shown(source="api") == {b.pk}
    assert shown(state="refused") == {c.pk}
    assert shown(model="qwen-7b", user="operator") == {c.pk}
    assert shown(model="no-such-model", state="failed") == {b.pk}  # an unknown value is ignored


def test_history_htmx_answers_the_table_only(viewer_client, model):
    Change.objects.create(model=model, kind="context", state="succeeded", source="console")
    whole = viewer_client.get(reverse("catalog:change_list"))
    partial = viewer_client.get(reverse("catalog:change_list"), {"state": "succeeded"}, **HX)
    assert b"<html" in whole.content and b'<form class="filters"' in whole.content
    assert b"<html" not in partial.content and b'<form class="filters"' not in partial.content
    assert partial.content.lstrip().startswith(b'<div id="history">')


def test_replica_log_page_shows_the_tail(viewer_client, model, tmp_path):
    log = tmp_path / "r.log"
    log.write_text("".join(f"row {i}\n" for i in range(500)))
    replica = Replica.objects.filter(profile__name="gguf").get()
    replica.log_path = str(log)
    replica.save()
    page = viewer_client.get(reverse("catalog:replica_log", args=[replica.pk]), {"lines": "10"}).content.decode()
    assert "row 499" in page and "row 490" in page and "row 489" not in page
    missing = Replica.objects.filter(profile__name="cpu").get()
    page = viewer_client.get(reverse("catalog:replica_log", args=[missing.pk]), {"lines": "x"})
    assert page.status_code == 200 and b"no log is kept for it" in page.content


def test_model_and_change_pages_cost_the_same_queries_however_many_rows(viewer_client, model, operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(url):
        with CaptureQueriesContext(connection) as ctx:
            assert viewer_client.get(url).status_code == 200
        return len(ctx.captured_queries)

    change = Change.objects.create(model=model, kind="context", state="running", source="console", user=operator)
    node = Replica.objects.first().node
    for p in model.profiles.all():
        ChangeStep.objects.create(change=change, position=p.pk, profile=p, node=node, state="done")
    model_url = reverse("catalog:model_detail", args=[model.name])
    change_url = reverse("catalog:change_detail", args=[change.pk])
    few = queries(model_url), queries(change_url)

    for p in model.profiles.all():
        for slot in range(1, 4):
            Replica.objects.create(profile=p, node=node, slot=slot, state="ready", endpoint="http://127.0.0.1:1")
        ChangeStep.objects.create(change=change, position=1000 + p.pk, profile=p, node=node, state="pending")
    for _ in range(5):
        Change.objects.create(model=model, kind="context", state="succeeded", source="api", user=operator)
    assert (queries(model_url), queries(change_url)) == few
    assert few[0] <= 10 and few[1] <= 8, few
