"""API keys: Bearer keys, stored hashed, issued by a command or in the admin (shown once)."""

import io
import re

import pytest
from django.core.management import CommandError, call_command

from router.models import ApiKey, hash_key

from .conftest import chat


def error_of(response):
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    "headers, code",
    [
        ({}, "missing_api_key"),
        ({"authorization": "Bearer llmgw-not-a-key"}, "invalid_api_key"),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "invalid_api_key"),
        ({"authorization": "Bearer"}, "invalid_api_key"),
    ],
)
def test_a_missing_or_bad_key_gets_401(router, engines, make_model, headers, code):
    (engine,) = engines("a")
    make_model("m", replicas=[(engine, "ready")])
    r = router.post("/v1/chat/completions", json=chat(), headers=headers)
    assert r.status_code == 401
    assert error_of(r)["code"] == code
    assert engine.received == []


def test_an_inactive_key_gets_401(router, engines, make_model):
    (engine,) = engines("a")
    make_model("m", replicas=[(engine, "ready")])
    row, key = ApiKey.issue("revoked")
    row.active = False
    row.save()
    r = router.post("/v1/chat/completions", json=chat(), headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"


def test_a_key_limited_to_other_models_gets_404(router, engines, make_model):
    (engine,) = engines("a")
    allowed, _ = make_model("allowed", replicas=[(engine, "ready")])
    make_model("other", replicas=[(engine, "ready")])
    row, key = ApiKey.issue("limited")
    row.models.set([allowed])
    headers = {"authorization": f"Bearer {key}"}
    r = router.post("/v1/chat/completions", json=chat("other"), headers=headers)
    assert r.status_code == 404
    assert error_of(r)["code"] == "model_not_found" and error_of(r)["param"] == "model"
    assert engine.received == []
    assert router.post("/v1/chat/completions", json=chat("allowed"), headers=headers).status_code == 200


def test_create_api_key_prints_the_key_once_and_stores_its_hash(transactional_db, make_model):
    make_model("a")
    make_model("b")
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "ci", "--models", "a,b", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert re.fullmatch(r"llmgw-[A-Za-z0-9_-]{40,}", key)
    row = ApiKey.objects.get(name="ci")
    assert row.key_hash == hash_key(key) and key not in (row.key_hash, row.prefix)
    assert sorted(m.name for m in row.models.all()) == ["a", "b"]
    assert key not in err.getvalue()


def test_create_api_key_for_every_model(transactional_db):
    out = io.StringIO()
    call_command("create_api_key", "all", stdout=out, stderr=io.StringIO())
    assert ApiKey.objects.get(name="all").models.count() == 0


@pytest.mark.parametrize("args, message", [(["x", "--models", "nope"], "no such model: nope"), (["dup"], "exists already")])
def test_create_api_key_refuses(transactional_db, args, message):
    ApiKey.issue("dup")
    with pytest.raises(CommandError, match=message):
        call_command("create_api_key", *args, stdout=io.StringIO(), stderr=io.StringIO())


def test_the_admin_shows_a_new_key_once(client, admin_user, make_model):
    model, _ = make_model("m")
    client.force_login(admin_user)
    r = client.post("/admin/router/apikey/add/", {"name": "from-admin", "active": "on", "models": [model.pk]}, follow=True)
    assert r.status_code == 200
    shown = [str(m) for m in r.context["messages"]]
    (key,) = re.findall(r"llmgw-[A-Za-z0-9_-]{40,}", " ".join(shown))
    row = ApiKey.objects.get(name="from-admin")
    assert row.key_hash == hash_key(key) and [m.name for m in row.models.all()] == ["m"]
    page = client.get(f"/admin/router/apikey/{row.pk}/change/")
    assert key not in page.content.decode()
