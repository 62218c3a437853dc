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


def test_fleet_up_places_each_profile_on_nodes_of_its_kind(catalog_rows):
    from catalog.models import GPUClass, Node, Profile

    # (a transactional test starts from an empty database: no seeded GPU classes)
    l4 = GPUClass.objects.create(name="L4", memory_gb=22.49, usable_gb=22.0, source="test")
    h100 = GPUClass.objects.create(name="H100-80G", memory_gb=79.65, usable_gb=79.1, source="test")
    Node.objects.create(name="cpu-1", host="127.0.0.1")
    l4_node = Node.objects.create(name="l4-1", host="127.0.0.1", gpu_class=l4, gpu_count=4)
    Node.objects.create(name="h100-1", host="127.0.0.1", gpu_class=h100, gpu_count=1)
    model, _ = catalog_rows("tiny", ["--ctx-size", "1024", "--parallel", "1", "--threads", "1"])
    Profile.objects.create(model=model, name="vllm-l4", engine="vllm", gpu_class=l4, gpus_per_node=2,
                           args=["--max-model-len", "4096"])
    Profile.objects.create(model=model, name="vllm-h100-tp2", engine="vllm", gpu_class=h100, tp=2,
                           args=["--max-model-len", "4096", "--tensor-parallel-size", "2"])
    out = StringIO()
    call_command("fleet", "up", "--replicas", "tiny/cpu=2", stdout=out)
    placed = sorted(Replica.objects.filter(state=ReplicaState.READY).values_list("profile__name", "node__name"))
    assert placed == [("cpu", "cpu-1"), ("cpu", "cpu-1"), ("vllm-l4", l4_node.name)]
    assert "tiny/vllm-h100-tp2: no node here of its kind (2 x H100-80G); skipped" in out.getvalue()
    call_command("fleet", "down", stdout=StringIO())
