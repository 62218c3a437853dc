"""`llmgw ctl …` as a user runs it: a subprocess talking to a running server."""

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from catalog import services
from catalog.models import Change, ChangeStep, Model, Profile
from tests.builders import make_model, use_shape

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = Path(sys.executable).with_name("llmgw")


@pytest.fixture
def model(monkeypatch):
    monkeypatch.setattr(services, "_enqueue_rollout", lambda change_id: None)
    use_shape(monkeypatch)
    return make_model()


@pytest.fixture
def env(live_server, operator):
    return {
        **os.environ,
        "LLMGW_URL": live_server.url,
        "LLMGW_TOKEN": Token.objects.create(user=operator).key,
        "LLMGW_POLL_INTERVAL": "0.2",
        "COLUMNS": "200",
    }


def command() -> list[str]:
    if SCRIPT.exists():  # installed with `pip install -e .`
        return [str(SCRIPT)]
    return [sys.executable, "-m", "llmgw.cli"]


def llmgw(env, *args, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run(command() + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_plan_table(model, env):
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "16384", "--slots", "4", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "context 8192 → 16384 tokens" in r.stdout and "longest answer 2048 → 4096" in r.stdout
    lines = r.stdout.splitlines()
    gguf = next(line for line in lines if "gguf" in line)
    assert "--ctx-size 16384 → 65536" in gguf and "GB a card of 1, of 79 usable" in gguf
    assert any("--parallel 2 → 4" in line for line in lines)
    assert any("--max-model-len 8192 → 16384" in line for line in lines)
    assert any("GB of RAM → " in line for line in lines)
    assert "dry run: nothing was changed" in r.stdout
    assert Change.objects.count() == 0


def test_dry_run_json(model, env):
    import json

    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "16384", "--dry-run", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["plan"]["context_after"] == 16384


def test_refusal_exits_3_with_the_server_message(model, env):
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "65536", "--message", "more")
    assert r.returncode == 3
    assert "llama-8b was trained for 32768 tokens" in r.stderr and "[tokens]" in r.stderr
    assert Model.objects.get(pk=model.pk).context_length == 8192
    refused = Change.objects.get()
    assert (refused.state, refused.source, refused.message) == ("refused", "cli", "more")

    r = llmgw(env, "ctl", "model", "context", "nope", "--tokens", "4096")
    assert r.returncode == 3 and "no model 'nope' in the catalog" in r.stderr


def test_conflict_and_forbidden_exit_3(model, env, viewer):
    first = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "16384")
    assert first.returncode == 0, first.stderr
    change = Change.objects.get()
    assert f"change {change.pk} queued" in first.stdout
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "4096")
    assert r.returncode == 3 and f"llmgw ctl change show {change.pk}" in r.stderr
    as_viewer = {**env, "LLMGW_TOKEN": Token.objects.create(user=viewer).key}
    r = llmgw(as_viewer, "ctl", "model", "context", "llama-8b", "--max-output", "100")
    assert r.returncode == 3 and "permission" in r.stderr
    r = llmgw({**env, "LLMGW_TOKEN": ""}, "ctl", "model", "list")
    assert r.returncode == 3 and "LLMGW_TOKEN" in r.stderr


def test_unreachable_exits_5_naming_llmgw_url(env):
    r = llmgw({**env, "LLMGW_URL": "http://127.0.0.1:9"}, "ctl", "model", "list")
    assert r.returncode == 5
    assert "LLMGW_URL" in r.stderr and "http://127.0.0.1:9" in r.stderr


def test_usage_exits_2(env):
    assert llmgw(env, "ctl", "model", "context").returncode == 2
    assert llmgw(env, "ctl", "model", "context", "x", "--tokens", "many").returncode == 2
    assert llmgw(env, "nothing").returncode == 2


def test_model_list_and_change_show(model, env):
    r = llmgw(env, "ctl", "model", "list")
    assert r.returncode == 0
    assert "llama-8b" in r.stdout and "3 of 3" in r.stdout
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--max-output", "4000", "--message", "longer answers")
    assert r.returncode == 0 and "longest answer 2048 → 4000" in r.stdout
    change = Change.objects.get()
    assert (change.state, change.source) == ("succeeded", "cli")
    r = llmgw(env, "ctl", "change", "show", str(change.pk))
    assert r.returncode == 0
    assert f"change {change.pk}" in r.stdout and "succeeded" in r.stdout and "why: longer answers" in r.stdout
    assert llmgw(env, "ctl", "change", "show", "99999").returncode == 3


def complete_rollout_later(model, *, fail=False, delay=1.0):
    """The rollout, as the fleet helper's task would record it, from another thread."""

    def run():
        from django.db import connection

        try:
            deadline = time.monotonic() + 90
            while not Change.objects.filter(model=model, state="queued").exists():
                if time.monotonic() > deadline:
                    return
                time.sleep(0.1)
            time.sleep(delay)
            change = Change.objects.get(model=model, state="queued")
            Change.objects.filter(pk=change.pk).update(state="running", started_at=timezone.now())
            profiles = list(Profile.objects.filter(model=model))
            steps = [
                ChangeStep.objects.create(change=change, position=i + 1, profile=p, node=p.replicas.first().node)
                for i, p in enumerate(profiles)
            ]
            for step in steps:
                time.sleep(0.3)
                ChangeStep.objects.filter(pk=step.pk).update(state="done", finished_at=timezone.now())
                if fail:
                    ChangeStep.objects.filter(pk=steps[1].pk).update(state="failed", detail="exited 1")
                    Change.objects.filter(pk=change.pk).update(
                        state="failed", error="llama-server exited: out of memory", finished_at=timezone.now()
                    )
                    return
            Change.objects.filter(pk=change.pk).update(state="succeeded", finished_at=timezone.now())
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_follows_the_rollout_to_its_end(model, env):
    thread = complete_rollout_later(model)
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "16384", "--wait", "--message", "docs", timeout=150)
    thread.join(timeout=30)
    assert r.returncode == 0, r.stderr
    change = Change.objects.get()
    assert change.state == "succeeded"
    assert "3/3" in r.stderr  # the progress bar: replica k of n
    assert f"change {change.pk}" in r.stdout and "succeeded" in r.stdout
    assert "replicas: 3 of 3 restarted" in r.stdout


def test_wait_on_a_failed_rollout_exits_4(model, env):
    thread = complete_rollout_later(model, fail=True)
    r = llmgw(env, "ctl", "model", "context", "llama-8b", "--tokens", "16384", "--wait", timeout=150)
    thread.join(timeout=30)
    assert r.returncode == 4, r.stderr
    assert "out of memory" in r.stderr and "llmgw ctl change rollback" in r.stderr
    change = Change.objects.get()
    back = llmgw(env, "ctl", "change", "rollback", str(change.pk), "--message", "oom")
    assert back.returncode == 0, back.stderr
    rollback = Change.objects.get(rollback_of=change)
    assert (rollback.kind, rollback.state, rollback.source, rollback.message) == ("rollback", "queued", "cli", "oom")
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_the_script_is_installed():
    if shutil.which("llmgw", path=str(SCRIPT.parent)) is None:
        pytest.skip("llmgw is not installed in this environment: pip install -e . --no-deps")
    r = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "ctl" in r.stdout
