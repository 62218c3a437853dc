"""The same endpoints through Django's URLconf (router/views.py): WSGI, runserver, test client."""

import json

from .conftest import chat


def test_chat_through_django(client, auth, engines, make_model, counts):
    (engine,) = engines("a")
    make_model("m", max_output=20, replicas=[(engine, "ready")])
    r = client.post("/v1/chat/completions", json.dumps(chat(max_tokens=99)), content_type="application/json",
                    headers=auth)
    assert r.status_code == 200, r.content
    assert r.json()["engine"] == "a" and engine.received[-1]["max_tokens"] == 20


def test_a_stream_through_django_under_wsgi_arrives_whole(client, auth, engines, make_model, counts):
    (engine,) = engines("a", tokens=3)
    _, (row,) = make_model("m", replicas=[(engine, "ready")])
    r = client.post("/v1/chat/completions", json.dumps(chat(stream=True)), content_type="application/json", headers=auth)
    assert r.status_code == 200
    assert r.content.decode().rstrip().endswith("data: [DONE]")
    assert int(counts.get(f"llmgw:inflight:{row.pk}") or 0) == 0


def test_no_login_redirect_and_no_csrf_for_api_clients(client, engines, make_model, counts):
    client.enforce_csrf_checks = True
    (engine,) = engines("a")
    make_model("m", replicas=[(engine, "ready")])
    r = client.post("/v1/chat/completions", json.dumps(chat()), content_type="application/json")
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = client.get("/v1/models")
    assert r.status_code == 401


def test_models_and_bad_input_through_django(client, auth, make_model, settings, counts):
    settings.LLMGW_ROUTER_MAX_BODY = 1000
    make_model("m", context_length=2048, max_output=512)
    (entry,) = client.get("/v1/models", headers=auth).json()["data"]
    assert (entry["id"], entry["context_length"], entry["max_output"]) == ("m", 2048, 512)
    r = client.post("/v1/chat/completions", "{oops", content_type="application/json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = client.post("/v1/chat/completions", json.dumps(chat(pad="x" * 2000)), content_type="application/json", headers=auth)
    assert r.status_code == 413
    assert client.get("/v1/chat/completions", headers=auth).status_code == 405
