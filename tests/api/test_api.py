"""The REST API: who may do what, every answer's status and shape, bad input, query counts."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from catalog.models import Change, ChangeStep, Model, Profile
from tests.builders import make_model, use_shape

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_rollout(enqueued):
    """No test here hands a rollout to Celery."""


@pytest.fixture
def model(monkeypatch):
    use_shape(monkeypatch)
    return make_model()


def client_for(user=None, *, token=True) -> APIClient:
    client = APIClient()
    if user is not None:
        if token:
            client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
        else:
            client.force_login(user)
    return client


@pytest.fixture
def op(operator):
    return client_for(operator)


@pytest.fixture
def view(viewer):
    return client_for(viewer)


def context_url(name="llama-8b"):
    return reverse("api:model-context", args=[name])


def post(client, url, body=None, **extra):
    return client.post(url, body, format="json", **extra)


# ----------------------------------------------------------------------------- who may


def test_anonymous_may_do_nothing(model):
    change = Change.objects.create(model=model, kind="context", state="succeeded", source="api", before={"context_length": 4096})
    anon = APIClient()
    for method, url in [
        ("get", reverse("api:model-list")),
        ("get", reverse("api:model-detail", args=[model.name])),
        ("get", reverse("api:change-detail", args=[change.pk])),
        ("post", context_url()),
        ("post", reverse("api:change-rollback", args=[change.pk])),
    ]:
        r = getattr(anon, method)(url, {"tokens": 4096} if method == "post" else None, format="json")
        assert r.status_code == 401, (method, url, r.status_code)
        assert r["Content-Type"].startswith("application/json")  # not a redirect to the login form
    assert Model.objects.get(pk=model.pk).context_length == 8192
    assert Change.objects.count() == 1


def test_a_wrong_token_is_401(model):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get(reverse("api:model-list")).status_code == 401


def test_a_viewer_reads_but_does_not_change(model, view, viewer):
    assert view.get(reverse("api:model-list")).status_code == 200
    assert view.get(reverse("api:model-detail", args=[model.name])).status_code == 200
    r = post(view, context_url(), {"tokens": 16384})
    assert r.status_code == 403 and "permission" in r.json()["detail"]
    r = post(view, context_url(), {"max_output": 100})
    assert r.status_code == 403
    change = Change.objects.create(model=model, kind="context", state="failed", source="api", before={"context_length": 4096})
    r = post(view, reverse("api:change-rollback", args=[change.pk]))
    assert r.status_code == 403
    assert Change.objects.count() == 1
    model.refresh_from_db()
    assert (model.context_length, model.max_output) == (8192, 2048)
    # A dry run changes nothing: anyone logged in may see the plan.
    r = post(view, context_url(), {"tokens": 16384, "dry_run": True})
    assert r.status_code == 200 and r.json()["plan"]["ok"] is True


def test_session_login_works_too(model, operator):
    client = client_for(operator, token=False)
    assert client.get(reverse("api:model-list")).status_code == 200
    r = post(client, context_url(), {"tokens": 16384})
    assert r.status_code == 202


# ----------------------------------------------------------------------------- the context change


def test_dry_run_shows_the_plan_and_changes_nothing(model, op):
    r = post(op, context_url(), {"tokens": 16384, "slots": 4, "dry_run": True})
    assert r.status_code == 200
    body = r.json()
    assert body["dry_run"] is True and body["change"] is None
    plan = body["plan"]
    assert (plan["context_before"], plan["context_after"]) == (8192, 16384)
    gguf = next(p for p in plan["profiles"] if p["profile"] == "gguf")
    assert gguf["args_after"][-4:] == ["--ctx-size", "65536", "--parallel", "4"]
    assert gguf["memory_after"]["text"].endswith("usable")
    assert Change.objects.count() == 0
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_change_is_queued_202_with_where_to_follow_it(model, op, operator, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        r = post(op, context_url(), {"tokens": 16384, "message": "longer documents"})
    assert r.status_code == 202, r.json()
    body = r.json()
    change = Change.objects.get()
    assert body["id"] == change.pk and body["state"] == "queued" and body["kind"] == "context"
    assert body["url"] == f"http://testserver/api/v1/changes/{change.pk}"
    assert r["Location"] == body["url"]
    assert (body["user"], body["source"], body["message"]) == ("operator", "api", "longer documents")
    assert body["before"]["context_length"] == 8192 and body["after"]["context_length"] == 16384
    assert body["progress"] == {"done": 0, "total": 0, "current": None}
    assert enqueued == [change.pk]
    assert Model.objects.get(pk=model.pk).context_length == 16384


def test_source_header_cli_is_honoured_and_others_are_api(model, op):
    r = post(op, context_url(), {"max_output": 100}, HTTP_X_LLMGW_SOURCE="cli")
    assert r.json()["change"]["source"] == "cli"
    r = post(op, context_url(), {"max_output": 200}, HTTP_X_LLMGW_SOURCE="admin")
    assert r.json()["change"]["source"] == "api"


def test_max_output_only_is_200_with_the_change(model, op):
    r = post(op, context_url(), {"max_output": 4000})
    assert r.status_code == 200
    body = r.json()
    assert body["dry_run"] is False
    assert body["plan"]["output_only"] is True and body["plan"]["max_output_after"] == 4000
    assert body["change"]["state"] == "succeeded" and body["change"]["kind"] == "max_output"
    assert Model.objects.get(pk=model.pk).max_output == 4000


@pytest.mark.parametrize(
    "body, field, detail",
    [
        ({"tokens": 100}, "tokens", "a context of at least 256 tokens"),
        ({"tokens": 65536}, "tokens", "llama-8b was trained for 32768 tokens"),
        ({"tokens": 4096, "max_output": 5000}, "max_output", "an answer of 5000 tokens does not fit a context of 4096"),
        ({"tokens": 4096, "slots": 65}, "slots", "slots are 1 to 64"),
        ({"max_output": -1}, "max_output", "the longest answer is a number of tokens"),
        ({"max_output": 9000}, "max_output", "change the context with it"),
        ({"tokens": 32768, "slots": 64}, "tokens", "the gguf profile needs"),
    ],
)
def test_refused_400_with_the_seed_message_and_the_plan(model, op, body, field, detail):
    r = post(op, context_url(), body)
    assert r.status_code == 400
    data = r.json()
    assert data["field"] == field and detail in data["detail"]
    assert data["plan"]["ok"] is False
    assert Change.objects.get().state == "refused"  # the attempt is audited...
    model.refresh_from_db()
    assert (model.context_length, model.max_output) == (8192, 2048)  # ...and nothing else changed
    # The dry run says the same, and writes nothing.
    r = post(op, context_url(), {**body, "dry_run": True})
    assert r.status_code == 400 and r.json()["field"] == field
    assert Change.objects.count() == 1


def test_declared_model_400(monkeypatch, op):
    use_shape(monkeypatch)
    make_model("decl", declared=True)
    r = post(op, context_url("decl"), {"tokens": 4096})
    assert r.status_code == 400 and "declared in the cluster's settings" in r.json()["detail"]


def test_no_such_model_404(op, view):
    r = post(op, context_url("nope"), {"tokens": 4096})
    assert r.status_code == 404 and r.json()["detail"] == "no model 'nope' in the catalog"
    assert post(op, context_url("nope"), {"tokens": 4096, "dry_run": True}).status_code == 404
    assert op.get(reverse("api:model-detail", args=["nope"])).status_code == 404
    assert op.get(reverse("api:change-detail", args=[12345])).status_code == 404
    assert post(op, reverse("api:change-rollback", args=[12345])).status_code == 404


def test_conflict_409_names_the_active_change(model, op):
    first = post(op, context_url(), {"tokens": 16384}).json()
    r = post(op, context_url(), {"tokens": 4096})
    assert r.status_code == 409
    body = r.json()
    assert body["change_id"] == first["id"] and body["url"] == first["url"]
    assert f"change {first['id']}" in body["detail"]
    assert Model.objects.get(pk=model.pk).context_length == 16384


BAD = [
    ({"tokens": "16384"}, "tokens"),
    ({"tokens": "lots"}, "tokens"),
    ({"tokens": 16384.0}, "tokens"),
    ({"tokens": 16384.5}, "tokens"),
    ({"tokens": True}, "tokens"),
    ({"tokens": None}, "tokens"),
    ({"tokens": [16384]}, "tokens"),
    ({"tokens": 10**30}, "tokens"),
    ({"tokens": 2**31}, "tokens"),
    ({"tokens": -(2**63)}, "tokens"),
    ({"slots": "4", "tokens": 4096}, "slots"),
    ({"slots": 10**20, "tokens": 4096}, "slots"),
    ({"max_output": 1e300}, "max_output"),
    ({"max_output": {"a": 1}}, "max_output"),
    ({"tokens": 4096, "dry_run": "yes"}, "dry_run"),
    ({"tokens": 4096, "message": "x" * 5000}, "message"),
    ([1, 2], "body"),
    ("16384", "body"),
    (None, "tokens"),  # no body at all: the plan's first rule names the field
    ({}, "tokens"),
]


@pytest.mark.parametrize("body, field", BAD)
def test_bad_input_is_400_with_a_field(model, op, body, field):
    r = post(op, context_url(), body)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert r.json()["detail"]
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_bad_json_and_other_media(model, op):
    r = op.post(context_url(), b'{"tokens": 40', content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "body"
    r = op.post(context_url(), b"\xff\xfe", content_type="application/json")
    assert r.status_code == 400
    r = op.post(context_url(), b'{"tokens": ' + b"9" * 5000 + b"}", content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "body"  # past Python's int-parsing limit
    r = op.post(context_url(), b'{"tokens": 1e400}', content_type="application/json")
    assert r.status_code == 400 and r.json()["field"] == "tokens"
    r = op.post(context_url(), b'{"tokens": NaN}', content_type="application/json")
    assert r.status_code == 400
    r = op.post(context_url(), {"tokens": "4096"})  # a form: not what this endpoint takes
    assert r.status_code == 415


# ----------------------------------------------------------------------------- reading


def test_model_detail(model, op):
    Change.objects.create(model=model, kind="context", state="running", source="api")
    Model.objects.filter(pk=model.pk).update(shape={"architecture": "llama"}, shape_error="")
    r = op.get(reverse("api:model-detail", args=[model.name]))
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == "llama-8b" and body["context_length"] == 8192 and body["max_output"] == 2048
    assert body["profiles_count"] == 3 and (body["replicas_ready"], body["replicas_total"]) == (3, 3)
    assert [p["name"] for p in body["profiles"]] == ["cpu", "gguf", "vllm"]
    assert body["profiles"][1]["args"][-2:] == ["--parallel", "2"] and body["profiles"][1]["gpu_class"] == "A100-80G"
    assert {(r["profile"], r["state"]) for r in body["replicas"]} == {("cpu", "ready"), ("gguf", "ready"), ("vllm", "ready")}
    assert all(r["endpoint"].startswith("http://127.0.0.1:") for r in body["replicas"])
    assert body["shape"]["data"] == {"architecture": "llama"}
    assert body["current_change"]["state"] == "running"
    assert body["weights_bytes"] == 16 << 30


def test_model_list(model, op):
    r = op.get(reverse("api:model-list"))
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == 1
    (row,) = body["results"]
    assert row["name"] == "llama-8b" and row["declared"] is False and row["current_change"] is None
    assert (row["profiles_count"], row["replicas_ready"], row["replicas_total"]) == (3, 3, 3)


@pytest.mark.parametrize("models, replicas", [(1, 1), (6, 3)])
def test_model_list_costs_a_fixed_number_of_queries(monkeypatch, operator, django_assert_num_queries, models, replicas):
    use_shape(monkeypatch)
    for i in range(models):
        m = make_model(f"m{i}", replicas=replicas)
        Change.objects.create(model=m, kind="context", state="queued", source="api")
    client = client_for(operator)
    # token + user, count, page, active changes: whatever the number of models, profiles, replicas
    with django_assert_num_queries(4):
        r = client.get(reverse("api:model-list"))
    assert r.status_code == 200 and r.json()["count"] == models
    assert all(row["replicas_total"] == 3 * replicas for row in r.json()["results"])
    assert all(row["current_change"]["state"] == "queued" for row in r.json()["results"])


@pytest.mark.parametrize("replicas", [1, 4])
def test_change_and_model_detail_cost_a_fixed_number_of_queries(monkeypatch, operator, django_assert_num_queries, replicas):
    use_shape(monkeypatch)
    m = make_model(replicas=replicas)
    change = Change.objects.create(model=m, kind="context", state="running", source="api", user=operator)
    for i, profile in enumerate(Profile.objects.filter(model=m)):
        ChangeStep.objects.create(change=change, position=i, profile=profile, node=profile.replicas.first().node)
    client = client_for(operator)
    with django_assert_num_queries(3):  # token + user, change + model + user, steps
        assert client.get(reverse("api:change-detail", args=[change.pk])).status_code == 200
    # token, model + counts, active changes, files, profiles, replicas, recent changes
    with django_assert_num_queries(7):
        assert client.get(reverse("api:model-detail", args=[m.name])).status_code == 200


def test_change_detail_shows_progress(model, op, operator):
    post(op, context_url(), {"tokens": 16384, "message": "why not"})
    change = Change.objects.get()
    profiles = list(Profile.objects.filter(model=model))
    node = profiles[0].replicas.first().node
    for i, (profile, state) in enumerate(zip(profiles, ["done", "starting", "pending"])):
        ChangeStep.objects.create(change=change, position=i + 1, profile=profile, node=node, state=state)
    Change.objects.filter(pk=change.pk).update(state="running")
    body = op.get(reverse("api:change-detail", args=[change.pk])).json()
    assert body["state"] == "running" and body["message"] == "why not" and body["user"] == "operator"
    assert body["progress"] == {"done": 1, "total": 3, "current": 2}
    assert [s["state"] for s in body["steps"]] == ["done", "starting", "pending"]
    assert body["plan"]["context_after"] == 16384 and body["request"]["tokens"] == 16384


# ----------------------------------------------------------------------------- rollback


def test_rollback(model, op):
    change = post(op, context_url(), {"tokens": 16384}).json()
    r = post(op, reverse("api:change-rollback", args=[change["id"]]), {"message": "too slow"})
    assert r.status_code == 409  # the change itself is still queued
    Change.objects.filter(pk=change["id"]).update(state="failed")
    r = post(op, reverse("api:change-rollback", args=[change["id"]]), {"message": "too slow"})
    assert r.status_code == 202
    body = r.json()
    assert body["kind"] == "rollback" and body["rollback_of"] == change["id"] and body["message"] == "too slow"
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_rollback_without_body_and_bad_body(model, op):
    done = post(op, context_url(), {"max_output": 1000}).json()["change"]
    r = post(op, reverse("api:change-rollback", args=[done["id"]]))
    assert r.status_code == 200 and r.json()["change"]["state"] == "succeeded"
    assert Model.objects.get(pk=model.pk).max_output == 2048
    r = post(op, reverse("api:change-rollback", args=[done["id"]]), [1])
    assert r.status_code == 400 and r.json()["field"] == "body"


def test_create_api_token_command(operator, capsys):
    from django.core.management import CommandError, call_command

    call_command("create_api_token", "operator")
    key = capsys.readouterr().out.strip()
    assert key == Token.objects.get(user=operator).key
    call_command("create_api_token", "operator")
    assert capsys.readouterr().out.strip() == key
    call_command("create_api_token", "operator", "--rotate")
    assert capsys.readouterr().out.strip() != key
    with pytest.raises(CommandError, match="no user"):
        call_command("create_api_token", "ghost")
    User.objects.filter(pk=operator.pk).update(is_active=False)
    with pytest.raises(CommandError, match="not active"):
        call_command("create_api_token", "operator")


def test_schema_needs_a_token_or_a_session_and_has_no_warnings(view, viewer):
    assert APIClient().get("/api/schema/").status_code == 401
    response = view.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert "/api/v1/models/{name}/context" in schema["paths"]
    enums = schema["components"]["schemas"]
    assert {"ChangeStateEnum", "ReplicaStateEnum", "StepStateEnum"} <= set(enums)
    session = APIClient()
    session.force_login(viewer)
    assert session.get("/api/schema/docs/").status_code == 200


def test_a_replicas_log_is_readable_through_the_api(model, view, tmp_path):
    from catalog.models import Node, Replica

    log = tmp_path / "engine.log"
    log.write_text("$ llama-server --ctx-size 8192\n" + "".join(f"line {i}\n" for i in range(100)))
    replica = Replica.objects.create(profile=model.profiles.first(), node=Node.objects.create(name="n1"),
                                     state="ready", pid=4242, log_path=str(log))
    url = reverse("api:replica-log", args=[replica.pk])
    assert APIClient().get(url).status_code == 401

    body = view.get(url).json()
    assert body["log"].splitlines() == [f"line {i}" for i in range(50, 100)]
    assert view.get(url, {"lines": 500}).json()["log"].startswith("$ llama-server --ctx-size 8192")
    for bad in ("0", "x", "5001"):
        response = view.get(url, {"lines": bad})
        assert response.status_code == 400 and response.json()["field"] == "lines"
    assert view.get(reverse("api:replica-log", args=[replica.pk + 1])).status_code == 404

    detail = view.get(reverse("api:model-detail", args=[model.name])).json()
    (listed,) = [r for r in detail["replicas"] if r["id"] == replica.pk]
    assert listed["pid"] == 4242 and listed["log_url"].endswith(url)
