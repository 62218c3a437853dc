"""Routing: ready replicas only, least in flight first, counted in Redis; one retry; 404/503."""

import pytest

from .conftest import chat, inflight


def post(router, auth, model="m", **extra):
    return router.post("/v1/chat/completions", json=chat(model, **extra), headers=auth)


@pytest.mark.parametrize("other_state", ["starting", "draining", "stopped", "failed"])
def test_only_ready_replicas_get_requests(router, auth, engines, make_model, counts, other_state):
    ready, other = engines("ready", "other")
    _, (ready_row, other_row) = make_model("m", replicas=[(ready, "ready"), (other, other_state)])
    for _ in range(12):
        r = post(router, auth)
        assert r.status_code == 200
        assert r.headers["x-llmgw-replica"] == str(ready_row.pk)
    assert len(ready.received) == 12 and other.received == []
    assert inflight(counts, ready_row) == 0 and inflight(counts, other_row) == 0


def test_a_replica_marked_draining_gets_no_new_request(router, auth, engines, make_model):
    from catalog.models import Replica

    old, new = engines("old", "new")
    _, (old_row, new_row) = make_model("m", replicas=[(old, "ready"), (new, "starting")])
    assert post(router, auth).json()["engine"] == "old"
    Replica.objects.filter(pk=new_row.pk).update(state="ready")
    Replica.objects.filter(pk=old_row.pk).update(state="draining")
    before = len(old.received)
    engines_seen = {post(router, auth).json()["engine"] for _ in range(8)}
    assert engines_seen == {"new"} and len(old.received) == before


def test_least_in_flight_first(router, auth, engines, make_model, counts):
    busy, idle = engines("busy", "idle")
    _, (busy_row, idle_row) = make_model("m", replicas=[(busy, "ready"), (idle, "ready")])
    # Another router process has 3 requests in flight on `busy`.
    counts.set(f"llmgw:inflight:{busy_row.pk}", 3)
    for _ in range(6):
        assert post(router, auth).json()["engine"] == "idle"
    counts.set(f"llmgw:inflight:{idle_row.pk}", 5)
    assert post(router, auth).json()["engine"] == "busy"
    assert inflight(counts, busy_row) == 3 and inflight(counts, idle_row) == 5  # ours came and went


def test_equal_load_is_spread(router, auth, engines, make_model):
    a, b = engines("a", "b")
    make_model("m", replicas=[(a, "ready"), (b, "ready")])
    for _ in range(40):
        assert post(router, auth).status_code == 200
    assert len(a.received) >= 5 and len(b.received) >= 5


@pytest.mark.parametrize("failure", ["error500", "drop"])
def test_a_failed_replica_is_retried_once_on_another(router, auth, engines, make_model, counts, failure):
    bad, good = engines("bad", "good")
    _, (bad_row, good_row) = make_model("m", replicas=[(bad, "ready"), (good, "ready")])
    bad.mode = failure
    counts.set(f"llmgw:inflight:{good_row.pk}", 1)  # so `bad` is tried first
    r = post(router, auth)
    assert r.status_code == 200 and r.json()["engine"] == "good"
    assert len(bad.received) == 1 and len(good.received) == 1
    assert inflight(counts, bad_row) == 0 and inflight(counts, good_row) == 1


def test_a_stream_is_retried_when_the_replica_fails_before_sending(router, auth, engines, make_model, counts):
    bad, good = engines("bad", "good")
    _, (bad_row, good_row) = make_model("m", replicas=[(bad, "ready"), (good, "ready")])
    bad.mode = "error500"
    counts.set(f"llmgw:inflight:{good_row.pk}", 1)
    r = post(router, auth, stream=True)
    assert r.status_code == 200 and '"engine": "good"' in r.text and "data: [DONE]" in r.text
    assert len(bad.received) == 1


def test_only_one_retry(router, auth, engines, make_model, counts):
    a, b, c = engines("a", "b", "c")
    _, rows = make_model("m", replicas=[(a, "ready"), (b, "ready"), (c, "ready")])
    for e in (a, b, c):
        e.mode = "error500"
    r = post(router, auth)
    assert r.status_code == 500  # the second replica's own answer, passed on
    assert r.json()["error"]["message"].endswith("is broken")
    assert sum(len(e.received) for e in (a, b, c)) == 2
    assert all(inflight(counts, row) == 0 for row in rows)


def test_connection_refused_everywhere_is_a_clean_502(router, auth, make_model, counts):
    _, rows = make_model("m", replicas=[("http://127.0.0.1:9", "ready"), ("http://127.0.0.1:1", "ready")])
    r = post(router, auth)
    assert r.status_code == 502 and "retry-after" in r.headers
    assert r.json()["error"]["code"] == "upstream_unavailable"
    assert all(inflight(counts, row) == 0 for row in rows)


def test_an_unknown_model_is_404(router, auth, engines, make_model):
    (engine,) = engines("a")
    make_model("m", replicas=[(engine, "ready")])
    r = post(router, auth, model="nope")
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `nope` does not exist or you do not have access to it.",
                                 "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


@pytest.mark.parametrize("states", [[], ["starting"], ["draining", "stopped", "failed"]])
def test_no_ready_replica_is_503_with_retry_after(router, auth, engines, make_model, states):
    started = engines(*[f"e{i}" for i in range(len(states))])
    make_model("m", replicas=list(zip(started, states)))
    r = router.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers=auth)
    assert r.status_code == 503
    assert int(r.headers["retry-after"]) > 0
    assert r.json()["error"]["code"] == "no_ready_replica"
    assert all(e.received == [] for e in started)
