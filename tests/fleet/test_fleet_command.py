"""`manage.py fleet up / status / reconcile / down` with real llama-server processes."""

from io import StringIO

import pytest
from django.core.management import call_command

from catalog.choices import ReplicaState
from catalog.fleet import local
from catalog.models import Replica
from tests.fleet.helpers import complete

pytestmark = [pytest.mark.llamacpp, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("llama_server")]


def test_fleet_up_status_down(catalog_rows):
    catalog_rows("tiny", ["--ctx-size", "1024", "--parallel", "2", "--threads", "1"])
    catalog_rows("other", ["--max-model-len", "4096"], engine="vllm")
    out = StringIO()
    call_command("fleet", "up", "--replicas", "tiny=2", stdout=out)
    text = out.getvalue()
    ready = list(Replica.objects.filter(state=ReplicaState.READY).select_related("profile__model"))
    assert sorted(r.profile.model.name for r in ready) == ["other", "tiny", "tiny"]
    for r in ready:
        assert r.endpoint in text and local.alive(r)
    assert complete(next(r for r in ready if r.profile.engine == "llamacpp"))["tokens_predicted"] >= 1

    out = StringIO()
    call_command("fleet", "up", "--replicas", "tiny=2", stdout=out)  # already there: nothing new
    assert Replica.objects.count() == 3

    out = StringIO()
    call_command("fleet", "status", stdout=out)
    assert out.getvalue().count(" ready ") == 3

    call_command("fleet", "reconcile", stdout=StringIO())
    call_command("fleet", "down", stdout=StringIO())
    assert set(Replica.objects.values_list("state", flat=True)) == {ReplicaState.STOPPED}
    assert local.engine_processes() == []
