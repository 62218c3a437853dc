"""`python manage.py shape`: a GGUF path or URL, an HF config file; bad input -> CommandError."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.domain.test_hf import DEEPSEEK_V3, GEMMA3_27B
from tests.llamacpp.ggufs import write_gemma2, write_llama
from tests.test_shapes import hub, serve_with_ranges  # noqa: F401  (hub is a fixture)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mirror(tmp_path, settings):
    root = tmp_path / "mirror"
    root.mkdir()
    settings.LLMGW_MIRROR_ROOT = root
    return root


def run(*args) -> str:
    out = io.StringIO()
    call_command("shape", *args, stdout=out)
    return out.getvalue()


def test_json_for_a_local_gguf(mirror):
    path = write_llama(mirror / "tiny.gguf", n_ctx=4096)
    got = json.loads(run(str(path), "--json"))
    for key in ("architecture", "layers", "kv_heads", "trained_context", "kv_per_token", "kv_bytes", "state_bytes",
                "weights_bytes"):
        assert key in got
    assert (got["architecture"], got["layers"], got["kv_heads"], got["trained_context"]) == ("llama", 2, 2, 4096)
    assert got["kv_per_token"] == 2 * 2 * 16 * 2 * 2
    # context defaults to the trained context: 4096 cells x 256 B
    assert got["kv_bytes"] == 4096 * 256 and got["state_bytes"] == 0
    assert got["weights_bytes"] == path.stat().st_size
    assert "bytes_read" not in got  # only for a URL


def test_relative_path_under_the_mirror_and_options(mirror):
    write_gemma2(mirror / "g.gguf")
    got = json.loads(run("g.gguf", "--context", "1024", "--slots", "4", "--json"))
    # gemma2 (2 KV heads x 16, K+V f16 = 128 B a cell), window 64: 2 full layers x 1024 cells x 4 streams
    # + 2 SWA layers x PAD(64 + 512) = 768 cells x 4 streams
    assert got["kv_bytes"] == 2 * 128 * (1024 * 4 + 768 * 4)
    q = json.loads(run("g.gguf", "--context", "1024", "--cache-type", "f32", "--json"))
    assert q["kv_bytes"] == 2 * 256 * (1024 + 768)
    v = json.loads(run("g.gguf", "--context", "1024", "--engine", "vllm", "--json"))
    assert v["engine"] == "vllm" and v["kv_bytes"] > 0


def test_a_file_given_from_the_shell(mirror, tmp_path):
    path = write_llama(tmp_path / "mine.gguf")  # outside the mirror root, but the admin names it
    assert json.loads(run(str(path), "--json"))["architecture"] == "llama"


def test_human_table(mirror):
    write_gemma2(mirror / "g.gguf")
    out = run("g.gguf", "--context", "2048")
    assert "gemma2" in out and "sliding window" in out and "64 tokens" in out and "llamacpp KV" in out


def test_url_reports_bytes_read(mirror, httpserver, tmp_path):
    url = serve_with_ranges(httpserver, "/m/tiny.gguf", write_llama(tmp_path / "t.gguf").read_bytes())
    got = json.loads(run(url, "--json"))
    assert got["requests"] >= 1 and got["bytes_read"] > 0 and got["architecture"] == "llama"


def test_hf_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GEMMA3_27B))
    got = json.loads(run("--hf-config", str(cfg), "--context", "8192", "--engine", "vllm", "--json"))
    assert got["architecture"] == "gemma3_text" and got["trained_context"] == 131072
    assert got["kv_per_token"] == 10 * 16 * 128 * 2 * 2
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DEEPSEEK_V3))
    got = json.loads(run("--hf-config", str(ds), "--context", "4096", "--engine", "sglang", "--json"))
    assert got["kv_bytes"] == 61 * 576 * 2 * 4096 and got["trained_context"] == 163840


@pytest.mark.parametrize("args,msg", [
    (["nope.gguf"], "nope.gguf"),
    ([], "exactly one"),
    (["a.gguf", "--hf-config", "b.json"], "exactly one"),
    (["--hf-config", "/nonexistent/config.json"], "config.json"),
    (["x.gguf", "--slots", "0"], "--slots"),
    (["x.gguf", "--context", "-5"], "--context"),
    (["../../etc/passwd.gguf"], "outside the mirror root"),
])
def test_bad_input(mirror, args, msg):
    with pytest.raises(CommandError, match=msg):
        run(*args)


def test_bad_files(mirror, tmp_path):
    (mirror / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(CommandError, match="junk.gguf"):
        run("junk.gguf")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CommandError, match="bad.json"):
        run("--hf-config", str(bad))
    vision = tmp_path / "vision.json"
    vision.write_text(json.dumps({"model_type": "siglip_vision_model", "hidden_size": 10}))
    with pytest.raises(CommandError, match="not a language model"):
        run("--hf-config", str(vision))


def test_quantized_row_mismatch_is_a_command_error(mirror):
    write_llama(mirror / "t.gguf", n_head_kv=1)  # K rows of 1 x 16 values: q4_0 blocks are 32
    with pytest.raises(CommandError, match="blocks of 32"):
        run("t.gguf", "--cache-type", "q4_0")


def test_exit_code_1_without_traceback(mirror, tmp_path):
    junk = tmp_path / "mirror2"
    junk.mkdir()
    (junk / "j.gguf").write_bytes(b"nonsense")
    proc = subprocess.run([sys.executable, "manage.py", "shape", str(junk / "j.gguf")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "LLMGW_MIRROR_ROOT": str(junk)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "CommandError" in proc.stderr and "j.gguf" in proc.stderr


def test_hf_repo_through_the_hub(hub):
    from tests.domain.test_hf import QWEN3_32B

    hub("Qwen/Qwen3-32B", QWEN3_32B, [("model-00001-of-00002.safetensors", 40), ("model-00002-of-00002.safetensors", 2)])
    got = json.loads(run("--hf-repo", "Qwen/Qwen3-32B", "--context", "1000", "--engine", "vllm", "--json"))
    assert got["weights_bytes"] == 42 and got["kv_per_token"] == 262144
    assert got["kv_bytes"] == 63 * 16 * 262144  # cdiv(1000, 16) blocks of 16 tokens
    with pytest.raises(CommandError, match="org/absent"):
        hub.server.expect_request("/org/absent/resolve/main/config.json").respond_with_data(
            "no", status=404, headers={"X-Error-Code": "RepositoryNotFound"})
        run("--hf-repo", "org/absent")
