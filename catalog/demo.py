"""The demo catalog: realistic models that work offline.

- `tiny-llama`: a tiny GGUF llama generated here, served for real by llama.cpp on the CPU
  (three replicas).
- `llama-3.1-8b-q4`: a GGUF whose header is as large as a real 128k-vocabulary model's
  (Llama-3.1-8B's hyperparameters, 128,256 tokens and 280,147 merges, ~7.8 MB) and whose
  file has the real size of a Q4_K_M quantisation, kept sparse so it takes no disk.
- `qwen2.5-7b-instruct`: a Hugging Face-origin model whose config.json sits in a local
  Hugging Face cache (HF_HOME; the run command sets it under LLMGW_DATA and runs offline)
  and whose files' sizes are in the catalog: vLLM, SGLang, strata and freetoken profiles.
- `mistral-7b-instruct`: declared in `demo/cluster.toml`, loaded like a real cluster file.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import gguf
import numpy as np
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from .cluster import load as load_cluster
from .models import GPUClass, Model, Node, OriginFile, Profile

CLUSTER_FILE = Path(settings.BASE_DIR) / "demo" / "cluster.toml"

QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "max_window_layers": 28, "sliding_window": 131072, "use_sliding_window": False, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064,
}
QWEN_FILES = [
    ("model-00001-of-00004.safetensors", 3945441440),
    ("model-00002-of-00004.safetensors", 3864726352),
    ("model-00003-of-00004.safetensors", 3864726424),
    ("model-00004-of-00004.safetensors", 3556377672),
]
MISTRAL_CONFIG = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 32768, "sliding_window": None, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
    "vocab_size": 32768,
}


def hf_snapshot(repo: str, config: dict, revision: str = "main") -> Path:
    """Put a repo's config.json in the local Hugging Face cache, as a download would."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    (snapshot / "config.json").write_text(json.dumps(config, indent=2))
    return snapshot


def write_large_header_gguf(path: Path) -> None:
    """A GGUF with Llama-3.1-8B's metadata, tokenizer and tensor table, its data sparse."""
    if path.exists() and path.stat().st_size > 4 << 30:
        return
    rng = np.random.default_rng(8)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("Llama 3.1 8B Instruct (demo header)")
    w.add_context_length(131072)
    w.add_embedding_length(4096)
    w.add_block_count(32)
    w.add_feed_forward_length(14336)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_rope_dimension_count(128)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_vocab_size(128256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    # Tokens and merges as long as Llama-3's on average (~6 and ~12 bytes): a 7.8 MB header.
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"

    def base36(i: int) -> str:
        out = ""
        while True:
            i, r = divmod(i, 36)
            out = digits[r] + out
            if not i:
                return out

    lengths = rng.integers(3, 10, size=128256)
    tokens = [base36(i).rjust(int(n), "_") for i, n in enumerate(lengths)]
    w.add_token_list(tokens)
    w.add_token_types([1] * 128256)
    pairs = rng.integers(0, 128256, size=(280147, 2))
    w.add_token_merges([f"{tokens[a][:5]} {tokens[b][:6]}" for a, b in pairs])
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128009)
    w.add_chat_template("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}")
    q4k, q6k = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    sizes: list[int] = []

    def pad(n: int) -> int:
        return -(-n // 32) * 32

    def info(name: str, shape: tuple[int, int], qtype):
        # shape in GGML order (ne0, ne1); the writer takes a quantized tensor's numpy shape
        # in bytes: (rows, bytes per row).
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        ne0, ne1 = shape
        sizes.append(ne1 * ne0 // block * size)
        w.add_tensor_info(name, (ne1, ne0 // block * size), np.dtype(np.uint8), sizes[-1], raw_dtype=qtype)

    def norm(name: str):
        sizes.append(4096 * 4)
        w.add_tensor_info(name, (4096,), np.dtype(np.float32), sizes[-1])

    info("token_embd.weight", (4096, 128256), q4k)
    for i in range(32):
        for name, shape in (("attn_q", (4096, 4096)), ("attn_k", (4096, 1024)), ("attn_v", (4096, 1024)),
                            ("attn_output", (4096, 4096)), ("ffn_gate", (4096, 14336)), ("ffn_up", (4096, 14336)),
                            ("ffn_down", (14336, 4096))):
            info(f"blk.{i}.{name}.weight", shape, q6k if name in ("attn_v", "ffn_down") else q4k)
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
    norm("output_norm.weight")
    info("output.weight", (4096, 128256), q6k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as f:  # the tensor data: a hole, as large as the tensors say
        f.truncate(pad(f.seek(0, 2)) + sum(pad(n) for n in sizes))


def admin_password() -> tuple[str, bool]:
    """The demo admin's password, kept in the data folder (0600); created once."""
    path = Path(settings.DATA_DIR) / "admin-password"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip(), True


def ensure_admin() -> str:
    """The `admin` superuser; returns a line saying how to log in."""
    password, _ = admin_password()
    user = User.objects.filter(username="admin").first()
    if user is None:
        User.objects.create_superuser("admin", "admin@example.com", password)
    elif not user.check_password(password):
        return "admin: exists already, with a password of its own"
    return f"admin: login 'admin', password '{password}'"


def build(mirror: Path) -> list[str]:
    """Fill the catalog with the demo (once: models that exist are left as they are)."""
    from .fleet.tiny_gguf import write_tiny_llama

    mirror.mkdir(parents=True, exist_ok=True)
    tiny = mirror / "tiny-llama.gguf"
    if not tiny.exists():
        write_tiny_llama(tiny, context_length=4096)
    big = mirror / "llama-3.1-8b-instruct-Q4_K_M.gguf"
    write_large_header_gguf(big)
    hf_snapshot("Qwen/Qwen2.5-7B-Instruct", QWEN_CONFIG)
    hf_snapshot("mistralai/Mistral-7B-Instruct-v0.3", MISTRAL_CONFIG)

    said = []
    gpu = {g.name: g for g in GPUClass.objects.all()}
    with transaction.atomic():
        for name, host, klass, count, ram in (
            ("cpu-1", "127.0.0.1", None, 0, 24),
            ("l4-1", "127.0.0.1", "L4", 4, 192),
            ("h100-1", "127.0.0.1", "H100-80G", 8, 1024),
        ):
            Node.objects.get_or_create(name=name, defaults={"host": host, "gpu_class": gpu.get(klass), "gpu_count": count, "ram_gb": ram})

        def model(name: str, **fields) -> Model | None:
            if Model.objects.filter(name=name).exists():
                said.append(f"{name}: already in the catalog")
                return None
            said.append(f"{name}: added")
            return Model.objects.create(name=name, **fields)

        if m := model("tiny-llama", source=str(tiny.relative_to(mirror)), context_length=1024, max_output=256):
            Profile.objects.create(model=m, name="cpu", engine="llamacpp", cpu_only=True, min_memory_gb=2,
                                   args=["--ctx-size", "2048", "--parallel", "2", "--threads", "1"])
        if m := model("llama-3.1-8b-q4", source=str(big.relative_to(mirror)), context_length=8192, max_output=2048):
            Profile.objects.create(model=m, name="l4", engine="llamacpp", gpu_class=gpu["L4"], gpus_per_node=1,
                                   args=["--ctx-size=16384", "--parallel=2", "-ngl", "99", "--cache-type-k", "q8_0",
                                         "--cache-type-v", "q8_0", "-fa", "on"])
            Profile.objects.create(model=m, name="cpu", engine="llamacpp", cpu_only=True, min_memory_gb=8,
                                   args=["-c", "8192", "-np", "1"])
        if m := model("qwen2.5-7b-instruct", origin_repo="Qwen/Qwen2.5-7B-Instruct", origin_revision="main",
                      context_length=16384, max_output=4096):
            OriginFile.objects.bulk_create(OriginFile(model=m, path=p, size=s) for p, s in QWEN_FILES)
            Profile.objects.create(model=m, name="vllm-l4", engine="vllm", gpu_class=gpu["L4"], gpus_per_node=1,
                                   args=["--max-model-len", "16384", "--gpu-memory-utilization", "0.92"])
            Profile.objects.create(model=m, name="sglang-h100-tp2", engine="sglang", gpu_class=gpu["H100-80G"],
                                   gpus_per_node=2, tp=2, args=["--context-length", "16384", "--tp", "2"])
            Profile.objects.create(model=m, name="strata-4090", engine="strata", gpu_class=gpu["RTX-4090"],
                                   gpus_per_node=1, args=["--context", "16384"])
            Profile.objects.create(model=m, name="freetoken-l4", engine="freetoken", gpu_class=gpu["L4"],
                                   gpus_per_node=1, args=["--max-seq-len-override=16384"])
    result = load_cluster(CLUSTER_FILE)
    said += [f"{n}: declared in {CLUSTER_FILE.name}" for n in result.created]
    return said
