"""The longest answer: max_tokens / max_completion_tokens held to the model's max_output."""

import json
import time

import pytest

from router.requests import clamp

from .conftest import chat


@pytest.mark.parametrize(
    "sent, cap, expected",
    [
        ({}, 100, {"max_tokens": 100}),  # absent: filled in
        ({"max_tokens": 5000}, 100, {"max_tokens": 100}),  # larger: lowered
        ({"max_tokens": 7}, 100, {"max_tokens": 7}),  # smaller: left alone
        ({"max_tokens": 100}, 100, {"max_tokens": 100}),
        ({"max_completion_tokens": 5000}, 100, {"max_completion_tokens": 100}),
        ({"max_completion_tokens": 9}, 100, {"max_completion_tokens": 9}),
        ({"max_tokens": 5000, "max_completion_tokens": 50}, 100, {"max_tokens": 100, "max_completion_tokens": 50}),
        ({"max_tokens": 30, "max_completion_tokens": 5000}, 100, {"max_tokens": 30, "max_completion_tokens": 100}),
        ({"max_tokens": None}, 100, {"max_tokens": 100}),  # null means "no limit": the cap
        ({"n_predict": -1}, 100, {"n_predict": 100}),  # llama.cpp's own field, -1 = unlimited
        ({"n_predict": 5000, "max_tokens": 3}, 100, {"n_predict": 100, "max_tokens": 3}),
        ({"max_tokens": 0}, 100, {"max_tokens": 0}),
        ({}, 0, {}),  # max_output 0: no limit, nothing added
        ({"max_tokens": 5000}, 0, {"max_tokens": 5000}),
    ],
)
def test_clamp_table(sent, cap, expected):
    body = {"model": "m", **sent}
    changed = clamp(body, cap)
    assert {k: v for k, v in body.items() if k != "model"} == expected
    assert changed == (expected != sent)


def test_the_engine_gets_the_capped_body(router, auth, engines, make_model):
    (engine,) = engines("a")
    make_model("m", max_output=64, replicas=[(engine, "ready")])
    cases = [
        (chat(), {"max_tokens": 64}),
        (chat(max_tokens=10_000), {"max_tokens": 64}),
        (chat(max_tokens=12), {"max_tokens": 12}),
        (chat(max_completion_tokens=10_000), {"max_completion_tokens": 64}),
        (chat(max_tokens=10_000, max_completion_tokens=20), {"max_tokens": 64, "max_completion_tokens": 20}),
    ]
    for sent, expected in cases:
        r = router.post("/v1/chat/completions", json=sent, headers=auth)
        assert r.status_code == 200, r.text
        got = engine.received[-1]
        assert {k: got.get(k) for k in expected} == expected
        assert not ({"max_tokens", "max_completion_tokens"} - set(expected)) & set(got)
        assert got["model"] == "m" and got["messages"] == sent["messages"]


def test_completions_are_capped_too(router, auth, engines, make_model):
    (engine,) = engines("a")
    make_model("m", max_output=32, replicas=[(engine, "ready")])
    r = router.post("/v1/completions", json={"model": "m", "prompt": "once upon", "max_tokens": 999}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith("hello")
    assert engine.received[-1]["max_tokens"] == 32


def test_a_max_output_change_applies_to_the_next_request(router, auth, engines, make_model):
    from catalog.models import Model

    (engine,) = engines("a")
    make_model("m", max_output=64, replicas=[(engine, "ready")])
    assert router.post("/v1/chat/completions", json=chat(max_tokens=500), headers=auth).status_code == 200
    assert engine.received[-1]["max_tokens"] == 64
    model = Model.objects.get(name="m")
    model.max_output = 200
    model.save()
    assert router.post("/v1/chat/completions", json=chat(max_tokens=500), headers=auth).status_code == 200
    assert engine.received[-1]["max_tokens"] == 200
    model.max_output = 0  # no limit: the client's own value goes through
    model.save()
    assert router.post("/v1/chat/completions", json=chat(max_tokens=500), headers=auth).status_code == 200
    assert engine.received[-1]["max_tokens"] == 500
    # A change that skips save() (a bulk update) is seen within the route cache's second.
    Model.objects.filter(name="m").update(max_output=100)
    time.sleep(1.1)
    assert router.post("/v1/chat/completions", json=chat(max_tokens=500), headers=auth).status_code == 200
    assert engine.received[-1]["max_tokens"] == 100


def test_an_unchanged_body_goes_through_byte_for_byte(router, auth, engines, make_model):
    (engine,) = engines("a")
    make_model("m", max_output=0, replicas=[(engine, "ready")])
    raw = json.dumps(chat(temperature=0.5, some_engine_option={"x": [1, 2]}), indent=2)
    r = router.post("/v1/chat/completions", content=raw, headers={**auth, "content-type": "application/json"})
    assert r.status_code == 200
    assert engine.received[-1] == json.loads(raw)
