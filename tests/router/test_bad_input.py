"""Bad input: a clear 4xx in OpenAI's error shape, never a 5xx; unknown fields reach the engine."""

import json
import socket
from urllib.parse import urlsplit

import pytest

from .conftest import chat

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path, raw, param",
    [
        ("/v1/chat/completions", b"", None),
        ("/v1/chat/completions", b"{not json", None),
        ("/v1/chat/completions", b"\xff\xfe\x00garbage", None),
        ("/v1/chat/completions", b'[{"model": "m"}]', None),
        ("/v1/chat/completions", b'"just a string"', None),
        ("/v1/chat/completions", b'{"model": "m", "messages": [], "temperature": NaN}', None),
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, None),
        ("/v1/chat/completions", json.dumps({"messages": MSG}).encode(), "model"),
        ("/v1/chat/completions", json.dumps({"model": 7, "messages": MSG}).encode(), "model"),
        ("/v1/chat/completions", json.dumps({"model": "", "messages": MSG}).encode(), "model"),
        ("/v1/chat/completions", json.dumps({"model": "m"}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": "hi"}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": {"role": "user"}}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": ["hi"]}).encode(), "messages[0]"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "max_tokens": "x"}).encode(), "max_tokens"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "max_tokens": 1.5}).encode(), "max_tokens"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "max_tokens": True}).encode(), "max_tokens"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "max_tokens": -3}).encode(), "max_tokens"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "max_completion_tokens": [1]}).encode(), "max_completion_tokens"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "n_predict": -2}).encode(), "n_predict"),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": MSG, "stream": "yes"}).encode(), "stream"),
        ("/v1/completions", json.dumps({"model": "m"}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"model": "m", "prompt": 42}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"model": "m", "prompt": "x", "max_tokens": "100"}).encode(), "max_tokens"),
    ],
)
def test_bad_bodies_get_a_clear_400(router, auth, engines, make_model, path, raw, param):
    (engine,) = engines("a")
    make_model("m", max_output=16, replicas=[(engine, "ready")])
    r = router.post(path, content=raw, headers={**auth, "content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert engine.received == []


def test_a_body_over_the_limit_is_413(router, auth, engines, make_model, settings):
    settings.LLMGW_ROUTER_MAX_BODY = 10_000
    (engine,) = engines("a")
    make_model("m", replicas=[(engine, "ready")])
    big = json.dumps(chat(padding="x" * 20_000)).encode()
    r = router.post("/v1/chat/completions", content=big, headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # the same without a Content-Length (chunked): refused as it arrives
    r = router.post("/v1/chat/completions", content=iter([big[:6000], big[6000:]]), headers=auth)
    assert r.status_code == 413
    # just under the limit is fine
    ok = json.dumps(chat(padding="x" * 9_000)).encode()
    assert router.post("/v1/chat/completions", content=ok, headers=auth).status_code == 200
    assert len(engine.received) == 1


def test_a_huge_declared_length_is_refused_before_reading(router_url, auth, make_model, settings):
    settings.LLMGW_ROUTER_MAX_BODY = 1 << 20
    make_model("m")
    host = urlsplit(router_url)
    with socket.create_connection((host.hostname, host.port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  + f"authorization: {auth['authorization']}\r\ncontent-length: {10**12}\r\n\r\n".encode())
        answer = s.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 413")


def test_unknown_fields_reach_the_engine(router, auth, engines, make_model):
    (engine,) = engines("a")
    make_model("m", max_output=16, replicas=[(engine, "ready")])
    extra = {"top_k": 40, "cache_prompt": True, "grammar": "root ::= \"x\"", "x_custom": {"nested": [1, None]}}
    r = router.post("/v1/chat/completions", json=chat(**extra), headers=auth)
    assert r.status_code == 200
    got = engine.received[-1]
    assert {k: got[k] for k in extra} == extra and got["max_tokens"] == 16


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/v1/chat/completions", 405), ("POST", "/v1/models", 405), ("PUT", "/v1/completions", 405),
     ("POST", "/v1/embeddings", 404), ("GET", "/v1/", 404)],
)
def test_wrong_paths_and_methods(router, auth, method, path, status):
    r = router.request(method, path, headers=auth, content=b"{}")
    assert r.status_code == status
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
