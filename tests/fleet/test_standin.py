"""The stand-in engine: the engines' own flags and refusals, and their HTTP."""

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.fleet.conftest import ROOT


def run(*args):
    return subprocess.run([sys.executable, "-m", "catalog.fleet.standin", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("engine,args,message", [
    ("vllm", ["m", "--max-model-len", "2048", "--no-such-flag"], "vllm serve: error: unrecognized arguments: --no-such-flag"),
    ("sglang", ["--model-path", "m", "--ctx-len", "4096"], "launch_server.py: error: unrecognized arguments: --ctx-len"),
    ("strata", ["--model", "m", "--max-model-len", "4096"], "strata serve: error: unrecognized arguments: --max-model-len"),
    ("freetoken", ["--model", "m", "--context", "4096"], "freetoken serve: error: unrecognized arguments: --context"),
])
def test_unknown_flag_is_refused_like_the_engine(engine, args, message):
    done = run(engine, *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "usage:" in done.stderr


@pytest.mark.parametrize("engine,args,message", [
    ("vllm", ["m", "--max-model-len", "40k"],
     "User-specified max_model_len (40000) is greater than the derived max_model_len (max_position_embeddings=32768"),
    ("sglang", ["--model-path", "m", "--context-length", "40000"],
     "User-specified context_length (40000) is greater than the derived context_length (32768)"),
    ("strata", ["--model", "m", "--context", "40000"], "exceeds the model's trained context (32768 tokens)"),
    ("freetoken", ["--model", "m", "--max-seq-len-override", "40000"], "larger than the model's max_position_embeddings (32768)"),
])
def test_context_over_the_trained_one_is_refused(engine, args, message):
    done = run(engine, *args, "--trained-context", "32768")
    assert done.returncode == 1
    assert message in done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm_standin():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "catalog.fleet.standin", "vllm", "/models/m.gguf",
                             "--served-model-name", "demo", "--max-model-len", "2048", "--host", "127.0.0.1",
                             "--port", str(port), "--trained-context", "32768"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(base + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield base
    proc.terminate()
    proc.wait(timeout=10)


def test_standin_speaks_the_engines_http(vllm_standin):
    base = vllm_standin
    health = httpx.get(base + "/health")
    assert health.status_code == 200 and health.content == b""
    models = httpx.get(base + "/v1/models").json()
    assert models["data"][0]["id"] == "demo" and models["data"][0]["max_model_len"] == 2048

    r = httpx.post(base + "/v1/completions", json={"model": "demo", "prompt": "Hello there", "max_tokens": 5})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 5 and body["usage"]["completion_tokens"] == 5

    r = httpx.post(base + "/v1/chat/completions", json={"model": "demo", "max_tokens": 3,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.json()["usage"]["completion_tokens"] == 3

    chunks = []
    with httpx.stream("POST", base + "/v1/chat/completions",
                      json={"model": "demo", "max_tokens": 4, "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    text = "".join(json.loads(c)["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert len(text.split()) == 4

    too_long = httpx.post(base + "/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 4000})
    assert too_long.status_code == 400 and "maximum context length is 2048" in too_long.json()["message"]


def test_each_token_takes_time_so_requests_stay_in_flight(vllm_standin):
    began = time.monotonic()
    r = httpx.post(vllm_standin + "/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 50})
    assert r.status_code == 200
    assert time.monotonic() - began >= 50 * 0.01
