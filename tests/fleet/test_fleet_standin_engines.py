"""The fleet with a stand-in engine (vLLM's flags): start, ready, stop; a refused context."""

import httpx
import pytest

from catalog import fleet
from catalog.choices import ReplicaState
from catalog.fleet import local


@pytest.mark.django_db(transaction=True)
def test_vllm_standin_replica_starts_answers_and_stops(catalog_rows):
    model, profile = catalog_rows("demo-vllm", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.9"], engine="vllm")
    node = catalog_rows.node()
    replica = fleet.start_replica(profile, node, profile.args)
    assert replica.state == ReplicaState.STARTING and replica.pid and replica.endpoint
    assert fleet.wait_ready(replica, 20) < 20
    assert httpx.get(replica.endpoint + "/v1/models").json()["data"][0]["max_model_len"] == 8192
    assert fleet.probe(replica)
    pid = replica.pid
    fleet.stop(replica)
    replica.refresh_from_db()
    assert replica.state == ReplicaState.STOPPED and replica.stopped_at
    assert not local.pid_is_replica(pid, replica.id)
    assert "--max-model-len 8192" in fleet.read_log(replica)


@pytest.mark.django_db(transaction=True)
def test_vllm_standin_refusing_the_context_fails_wait_ready_with_its_log(catalog_rows):
    model, profile = catalog_rows("demo-vllm", ["--max-model-len", "20000"], engine="vllm", context_length=16384)
    replica = fleet.start_replica(profile, catalog_rows.node(), profile.args)
    with pytest.raises(fleet.EngineFailed) as e:
        fleet.wait_ready(replica, 20)
    assert "exited" in e.value.reason
    assert "User-specified max_model_len (20000) is greater than the derived max_model_len" in e.value.log_tail


@pytest.mark.django_db(transaction=True)
def test_rollout_of_a_vllm_standin_model_and_a_refused_context(catalog_rows, start_worker):
    from catalog.choices import ChangeState, StepState
    from tests.fleet.helpers import request_change, up, wait_change

    start_worker("rollout")
    model, profile = catalog_rows("demo-vllm", ["--max-model-len", "4096"], engine="vllm", context_length=16384)
    olds = up(profile, catalog_rows.node(), 2)

    change = wait_change(request_change(profile, ["--max-model-len", "8192"]), 60)
    assert change.state == ChangeState.SUCCEEDED, change.error
    news = [s.new_replica for s in change.steps.order_by("position")]
    assert all(httpx.get(r.endpoint + "/v1/models").json()["data"][0]["max_model_len"] == 8192 for r in news)

    refused = wait_change(request_change(profile, ["--max-model-len", "32768"]), 60)
    assert refused.state == ChangeState.FAILED
    assert "User-specified max_model_len (32768) is greater than the derived max_model_len" in refused.error
    assert [s.state for s in refused.steps.order_by("position")] == [StepState.FAILED, StepState.PENDING]
    for r in news:
        r.refresh_from_db()
        assert r.state == ReplicaState.READY and fleet.probe(r)
    for r in olds:
        r.refresh_from_db()
        assert r.state == ReplicaState.STOPPED


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_never_answers_times_out_and_its_whole_group_is_stopped(catalog_rows, settings):
    # a configured command: a process that starts a child and never listens
    settings.LLMGW_ENGINE_COMMANDS = {"strata": [
        "{python}", "-c", "import subprocess, sys, time; print('loading experts...', flush=True); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"]}
    model, profile = catalog_rows("moe", ["--context", "8192"], engine="strata")
    replica = fleet.start_replica(profile, catalog_rows.node(), profile.args)
    with pytest.raises(fleet.EngineFailed) as e:
        fleet.wait_ready(replica, 2)
    assert "no health and completion within 2 s" in e.value.reason
    assert "loading experts..." in e.value.log_tail
    group = [p for p in local.engine_processes()]
    assert [p["pid"] for p in group] == [replica.pid]
    children = [int(c) for c in open(f"/proc/{replica.pid}/task/{replica.pid}/children").read().split()]
    assert len(children) == 1
    fleet.stop(replica, ReplicaState.FAILED)
    replica.refresh_from_db()
    assert replica.state == ReplicaState.FAILED
    import os

    assert not os.path.exists(f"/proc/{replica.pid}") or not local.pid_is_replica(replica.pid, replica.id)
    # the engine's child went with its group (gone, or a zombie its new parent has yet to reap)
    from tests.fleet.helpers import wait_for

    wait_for(lambda: local._zombie(children[0]), 10, "the engine's child to be gone")
