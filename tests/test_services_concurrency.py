"""Two changes of one model at the same moment, on PostgreSQL: one wins, the other is a Conflict.

The model's row is locked (select_for_update) while a change is planned and written, and the
database's partial unique index (one queued/running change per model) backs it up."""

import threading
import time

import pytest
from django.db import connection

from catalog import services
from catalog.models import Change, Model
from tests.builders import make_model, use_shape

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="needs PostgreSQL (row locks and concurrent transactions): set DATABASE_URL=postgres://…",
    ),
]


@pytest.fixture
def model(monkeypatch):
    monkeypatch.setattr(services, "_enqueue_rollout", lambda change_id: None)
    use_shape(monkeypatch)
    return make_model()


def race(name, user, requests):
    """Run each request in its own thread (its own connection), all released at once."""
    barrier = threading.Barrier(len(requests))
    results = [None] * len(requests)

    def run(i, kwargs):
        try:
            barrier.wait(timeout=10)
            results[i] = services.request_change(name, user=user, source="api", **kwargs)
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            results[i] = e
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, kw)) for i, kw in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def slow_planning(monkeypatch, seconds=0.3):
    """Hold the model's lock a while, so the other request surely waits on it."""
    plan = services._plan

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return plan(*args, **kwargs)

    monkeypatch.setattr(services, "_plan", slow)


@pytest.mark.parametrize("slow", [False, True])
def test_two_concurrent_changes_one_wins(model, operator, monkeypatch, slow):
    if slow:
        slow_planning(monkeypatch)
    results = race(model.name, operator, [{"tokens": 16384, "message": "a"}, {"tokens": 4096, "message": "b"}])
    changes = [r for r in results if isinstance(r, Change)]
    conflicts = [r for r in results if isinstance(r, services.Conflict)]
    assert len(changes) == 1 and len(conflicts) == 1, results
    winner = changes[0]
    assert conflicts[0].change == winner
    assert list(Change.objects.filter(model=model).values_list("pk", flat=True)) == [winner.pk]
    assert Model.objects.get(pk=model.pk).context_length == winner.request["tokens"]


def test_the_index_stops_what_the_check_would_miss(model, operator, monkeypatch):
    """Without the check under the lock, the partial unique index still lets one through."""
    monkeypatch.setattr(services, "_active_change", lambda model_id: None)
    slow_planning(monkeypatch, 0.1)
    results = race(model.name, operator, [{"tokens": 16384}, {"tokens": 4096}])
    assert sorted(type(r).__name__ for r in results) == ["Change", "Conflict"], results
    assert Change.objects.filter(model=model).count() == 1


def test_many_at_once(model, operator):
    results = race(model.name, operator, [{"tokens": 1024 * (i + 1)} for i in range(6)])
    assert sum(isinstance(r, Change) for r in results) == 1
    assert sum(isinstance(r, services.Conflict) for r in results) == 5, results
    assert Change.objects.filter(model=model, state="queued").count() == 1
