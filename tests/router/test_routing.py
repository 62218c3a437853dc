"""Routing: ready replicas only, least in flight first, counted in Redis; one retry; 404/503."""

import time

import pytest

from .conftest import chat, inflight, settled


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
    assert settled(counts, ready_row) == 0 and settled(counts, other_row) == 0


def test_a_replica_marked_draining_gets_no_new_request(router, auth, engines, make_model):
    old, new = engines("old", "new")
    _, (old_row, new_row) = make_model("m", replicas=[(old, "ready"), (new, "starting")])
    assert post(router, auth).json()["engine"] == "old"  # the route is cached now
    # As the fleet does it (fleet.mark: save()), then at once, well within the route cache's second:
    new_row.state = "ready"
    new_row.save(update_fields=["state"])
    old_row.state = "draining"
    old_row.save(update_fields=["state"])
    before = len(old.received)
    engines_seen = {post(router, auth).json()["engine"] for _ in range(8)}
    assert engines_seen == {"new"} and len(old.received) == before


def test_a_state_changed_without_signals_is_seen_within_a_second(router, auth, engines, make_model):
    from catalog.models import Replica

    old, new = engines("old", "new")
    _, (old_row, new_row) = make_model("m", replicas=[(old, "ready"), (new, "starting")])
    assert post(router, auth).json()["engine"] == "old"
    Replica.objects.filter(pk=new_row.pk).update(state="ready")  # no signal, no version bump
    Replica.objects.filter(pk=old_row.pk).update(state="draining")
    time.sleep(1.1)
    assert {post(router, auth).json()["engine"] for _ in range(5)} == {"new"}


def test_a_cached_route_never_sends_to_a_replica_once_it_is_draining(router, auth, engines, make_model, counts):
    """Marking a replica draining bumps the routes' version before the fleet reads its count:
    a router holding the old route must not count a new request on it after that."""
    from router.gateway import ROUTES_VERSION_KEY

    old, new = engines("old", "new")
    _, (old_row, new_row) = make_model("m", replicas=[(old, "ready"), (new, "ready")])
    counts.set(f"llmgw:inflight:{new_row.pk}", 100)  # so that only the route could send to `old`
    assert post(router, auth).json()["engine"] == "old"
    version = counts.get(ROUTES_VERSION_KEY)
    old_row.state = "draining"
    old_row.save(update_fields=["state"])
    assert counts.get(ROUTES_VERSION_KEY) != version
    assert settled(counts, old_row) == 0  # what the fleet's drain reads: nothing, and nothing comes
    for _ in range(5):
        assert post(router, auth).json()["engine"] == "new"
    assert inflight(counts, old_row) == 0


def test_least_in_flight_first(router, auth, engines, make_model, counts):
    busy, idle = engines("busy", "idle")
    _, (busy_row, idle_row) = make_model("m", replicas=[(busy, "ready"), (idle, "ready")])
    # Another router process has 3 requests in flight on `busy`.
    counts.set(f"llmgw:inflight:{busy_row.pk}", 3)
    for _ in range(6):
        assert post(router, auth).json()["engine"] == "idle"
    assert settled(counts, idle_row) == 0  # our requests are done (the count drops just after each answer)
    counts.set(f"llmgw:inflight:{idle_row.pk}", 5)
    assert post(router, auth).json()["engine"] == "busy"
    assert settled(counts, busy_row, 3) == 3 and settled(counts, idle_row, 5) == 5  # ours came and went


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
    assert settled(counts, bad_row) == 0 and settled(counts, good_row, 1) == 1


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
    assert all(settled(counts, row) == 0 for row in rows)


def test_connection_refused_everywhere_is_a_clean_502(router, auth, make_model, counts):
    _, rows = make_model("m", replicas=[("http://127.0.0.1:9", "ready"), ("http://127.0.0.1:1", "ready")])
    r = post(router, auth)
    assert r.status_code == 502 and "retry-after" in r.headers
    assert r.json()["error"]["code"] == "upstream_unavailable"
    assert all(settled(counts, row) == 0 for row in rows)


def test_a_lone_replica_dropping_the_connection_is_tried_once_more(router, auth, engines, make_model, counts):
    (engine,) = engines("a")
    _, (row,) = make_model("m", replicas=[(engine, "ready")])
    engine.mode = "drop-once"
    r = post(router, auth)
    assert r.status_code == 200 and len(engine.received) == 2
    engine.mode = "error500"  # an engine's own 5xx is not retried on the same replica
    assert post(router, auth).status_code == 500 and len(engine.received) == 3
    engine.mode = "drop"  # and a connection failing twice ends there
    r = post(router, auth)
    assert r.status_code == 502 and len(engine.received) == 5
    assert settled(counts, row) == 0


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
