"""Streaming: the engine's SSE chunks reach the client as they come, and the in-flight count
is released when the stream ends or its client goes away."""

import json
import threading
import time

import httpx
import pytest

from .conftest import chat, inflight, settled


def test_chunks_arrive_before_the_engine_finishes(router_url, auth, engines, make_model, counts):
    (engine,) = engines("a", tokens=4)
    _, (row,) = make_model("m", max_output=50, replicas=[(engine, "ready")])
    engine.gate = threading.Event()  # the engine sends one chunk, then waits for the gate
    with httpx.Client(base_url=router_url, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json=chat(stream=True), headers=auth) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            first = next(line for line in lines if line)
            # The first chunk is here while the engine is still held: nothing was buffered.
            assert not engine.finished.is_set()
            assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["content"] == "t0 "
            assert inflight(counts, row) == 1
            engine.gate.set()
            rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and len(rest) == 4
    assert engine.finished.is_set()
    assert engine.received[-1]["stream"] is True and engine.received[-1]["max_tokens"] == 50
    assert settled(counts, row) == 0


def test_a_client_leaving_mid_stream_releases_the_count_and_the_engine(router_url, auth, engines, make_model, counts):
    (engine,) = engines("a", tokens=1000)
    engine.chunk_delay = 0.01
    _, (row,) = make_model("m", replicas=[(engine, "ready")])
    with httpx.Client(base_url=router_url, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json=chat(stream=True), headers=auth) as r:
            lines = r.iter_lines()  # held: dropping it would close the connection here
            assert next(line for line in lines if line).startswith("data: ")
            assert r.headers["x-llmgw-replica"] == str(row.pk)
            assert inflight(counts, row) == 1
    # the client is gone, long before the engine's 1000 chunks (10 s) are through
    assert engine.disconnected.wait(5), "the engine was not told: its request ran on"
    assert settled(counts, row) == 0
    assert not engine.finished.is_set()


def test_completions_stream_too(router, auth, engines, make_model):
    (engine,) = engines("a", tokens=3)
    make_model("m", replicas=[(engine, "ready")])
    r = router.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True}, headers=auth)
    events = [line for line in r.text.splitlines() if line]
    assert r.status_code == 200 and events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]] == ["t0 ", "t1 ", "t2 "]


def test_a_client_leaving_while_the_engine_thinks_releases_it_too(router_url, auth, engines, make_model, counts):
    """Not streamed: a client that gives up before the answer is ready ends the engine's
    request and its count at once, not when the engine is done (10 s here)."""
    (engine,) = engines("a")
    engine.chunk_delay = 10.0  # the engine takes 10 s to answer
    _, (row,) = make_model("m", replicas=[(engine, "ready")])
    with httpx.Client(base_url=router_url, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/chat/completions", json=chat(), headers=auth)
    assert settled(counts, row, timeout=3.0) == 0
    assert time.monotonic() - started < 6.0
