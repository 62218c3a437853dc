"""Hugging Face config.json -> Shape, on the public configs of real model families, and the
fetch through huggingface_hub against a local fake hub (pytest-httpserver)."""

from __future__ import annotations

import json

import pytest

from catalog.domain.hf import HFError, fetch_hf, shape_from_hf_config
from catalog.domain.kv import kv_bytes

# --- real configs (the fields that matter, with their public values) -------------------------

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "vocab_size": 128256,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28, "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16", "rope_scaling": None,
}
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
    "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "sliding_window": None, "use_sliding_window": False, "max_window_layers": 64,
    "rope_theta": 1000000, "torch_dtype": "bfloat16", "rope_scaling": None,
}
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "sliding_window": None, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
}
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256, "torch_dtype": "float32",
}
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_hidden_layers": 27,
                      "num_attention_heads": 16},
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "torch_dtype": "bfloat16",
}
PHI3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "sliding_window": 2047, "rope_scaling": None, "torch_dtype": "bfloat16",
}
JAMBA_V01 = {
    "architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_period": 8, "attn_layer_offset": 4,
    "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_dt_rank": 256, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}
# granite-4.0-h style: Mamba-2 layers with a few attention layers, named by layer_types
GRANITE_4_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 4096,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "layer_types": (["mamba"] * 9 + ["attention"]) * 4, "mamba_n_heads": 128, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
    "max_position_embeddings": 131072, "position_embedding_type": "nope", "torch_dtype": "bfloat16",
}
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "attention_chunk_size": 8192, "max_position_embeddings": 10485760,
        "no_rope_layers": [1, 1, 1, 0] * 12,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
}

FAMILIES = [
    # name, config, kv bytes/token of full-attention layers (f16/bf16), trained context, layers, attn layers
    ("Llama-3.1-8B", LLAMA_31_8B, 32 * 8 * 128 * 2 * 2, 131072),
    ("Qwen2.5-7B", QWEN25_7B, 28 * 4 * 128 * 2 * 2, 32768),
    ("Qwen3-32B", QWEN3_32B, 64 * 8 * 128 * 2 * 2, 40960),  # head_dim 128, not 5120/64 = 80
    ("Mistral-7B-v0.3", MISTRAL_7B_V03, 32 * 8 * 128 * 2 * 2, 32768),
    ("gemma-2-9b", GEMMA2_9B, 21 * 8 * 256 * 2 * 2, 8192),  # 21 of 42 layers global; head_dim 256 not 224
    ("gemma-3-27b", GEMMA3_27B, 10 * 16 * 128 * 2 * 2, 131072),  # 10 of 62 global; vLLM skips gemma3's rope factor
    ("DeepSeek-V3", DEEPSEEK_V3, 61 * 576 * 2, 163840),  # MLA latent 512 + rope 64
    ("gpt-oss-20b", GPT_OSS_20B, 12 * 8 * 64 * 2 * 2, 131072),
    ("Phi-3-mini-4k", PHI3_MINI_4K, 32 * 32 * 96 * 2 * 2, 4096),  # MHA: no num_key_value_heads
    ("Jamba-v0.1", JAMBA_V01, 4 * 8 * 128 * 2 * 2, 262144),
    ("granite-4.0-h", GRANITE_4_H, 4 * 8 * 128 * 2 * 2, 131072),
    ("Qwen3-Next-80B", QWEN3_NEXT_80B, 12 * 2 * 256 * 2 * 2, 262144),
    ("Llama-4-Scout", LLAMA4_SCOUT, 12 * 8 * 128 * 2 * 2, 10485760),
]


@pytest.mark.parametrize("name,config,per_token,trained", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_families(name, config, per_token, trained):
    s = shape_from_hf_config(config, weights_bytes=1000)
    assert s.kv_per_token == per_token
    assert s.trained_context == trained
    assert s.weights_bytes == 1000 and s.source_kind == "hf"
    assert len(s.kv_heads_per_layer) == s.layers


def test_gemma2_layer_kinds_and_dtype():
    s = shape_from_hf_config(GEMMA2_9B)
    assert s.swa_layers == (True, False) * 21 and s.sliding_window == 4096
    assert s.head_k == 256 and s.dtype_bytes == 4  # float32 weights: vLLM's auto KV dtype is 4 bytes


def test_gemma3_text_config_and_pattern():
    s = shape_from_hf_config(GEMMA3_27B)
    assert s.architecture == "gemma3_text" and s.layers == 62 and s.kv_heads == 16 and s.head_k == 128
    assert [i for i in range(62) if not s.swa_layers[i]] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert s.sliding_window == 1024 and s.dtype_bytes == 2  # top-level torch_dtype inherited
    assert s.rope_scaling == "linear x8"


def test_deepseek_v3_mla():
    s = shape_from_hf_config(DEEPSEEK_V3)
    assert s.mla and (s.kv_lora_rank, s.rope_head_dim, s.head_k, s.head_v, s.kv_heads) == (512, 64, 576, 0, 1)
    assert s.layers == 61  # the MTP layer is separate (num_nextn_predict_layers)
    assert kv_bytes(s, "vllm", 4096).kv == 4096 * 61 * 576 * 2
    assert s.rope_scaling == "yarn x40 from 4096"


def test_kimi_k2_style_mla():
    cfg = {**DEEPSEEK_V3, "model_type": "kimi_k2", "num_attention_heads": 64, "max_position_embeddings": 131072,
           "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}}
    s = shape_from_hf_config(cfg)
    assert s.mla and s.kv_per_token == 61 * 576 * 2 and s.trained_context == 131072


def test_gpt_oss_layer_types():
    s = shape_from_hf_config(GPT_OSS_20B)
    assert s.swa_layers == (True, False) * 12 and s.sliding_window == 128 and s.head_k == 64


def test_phi3_mha_and_no_swa():
    s = shape_from_hf_config(PHI3_MINI_4K)
    assert s.kv_heads == 32 == s.heads and s.head_k == 96 and s.swa_layers == ()


def test_phi3_longrope_trained_context():
    cfg = {**PHI3_MINI_4K, "max_position_embeddings": 131072,
           "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}
    assert shape_from_hf_config(cfg).trained_context == 131072


def test_jamba_layers_and_state():
    s = shape_from_hf_config(JAMBA_V01)
    assert [i for i in range(32) if not s.recurrent_layers[i]] == [4, 12, 20, 28]
    assert (s.state_r, s.state_s) == (3 * 8192, 16 * 8192)  # d_inner = 2 x 4096
    # llama.cpp: F32 state per slot for the 28 Mamba layers
    assert kv_bytes(s, "llamacpp", 4096, 2).state == 28 * (3 * 8192 + 16 * 8192) * 4 * 2


def test_granite_hybrid_state():
    s = shape_from_hf_config(GRANITE_4_H)
    assert sum(s.recurrent_layers) == 36
    assert s.state_r == 3 * (128 * 64 + 2 * 128) and s.state_s == 128 * 128 * 64


def test_qwen3_next_interval_and_layer_types():
    s = shape_from_hf_config(QWEN3_NEXT_80B)
    assert [i for i in range(48) if not s.recurrent_layers[i]] == list(range(3, 48, 4))
    assert s.state_r == 3 * (32 * 128 + 2 * 16 * 128) and s.state_s == 128 * 32 * 128
    cfg = {**QWEN3_NEXT_80B, "layer_types": ["linear_attention", "full_attention"] * 24}
    del cfg["full_attention_interval"]
    s2 = shape_from_hf_config(cfg)
    assert s2.kv_heads_per_layer == (0, 2) * 24


def test_llama4_chunked_layers():
    s = shape_from_hf_config(LLAMA4_SCOUT)
    assert s.sliding_window == 8192 and s.swa_layers == (True, True, True, False) * 12


def test_mistral_v01_sliding_everywhere():
    cfg = {**MISTRAL_7B_V03, "sliding_window": 4096, "max_position_embeddings": 32768}
    s = shape_from_hf_config(cfg)
    assert s.swa_layers == (True,) * 32 and s.kv_per_token == 0  # no full-attention layer at all
    # vLLM caps each layer at the window
    page = 16 * 8 * 256 * 2
    assert kv_bytes(s, "vllm", 32768).kv == 32 * (-(-(4095 + 2048) // 16) + 1) * page


def test_qwen2_use_sliding_window_false_wins():
    assert shape_from_hf_config(QWEN25_7B).swa_layers == ()


def test_head_dim_null_falls_back():
    cfg = {**QWEN3_32B, "head_dim": None}
    assert shape_from_hf_config(cfg).head_k == 80
    cfg = {**QWEN3_32B, "head_dim": 0}
    assert shape_from_hf_config(cfg).head_k == 80


@pytest.mark.parametrize("alias", ["n_head_kv", "num_kv_heads", "multi_query_group_num"])
def test_kv_head_aliases(alias):
    cfg = {k: v for k, v in MISTRAL_7B_V03.items() if k != "num_key_value_heads"}
    cfg[alias] = 2
    assert shape_from_hf_config(cfg).kv_heads == 2


@pytest.mark.parametrize("rope,expected", [
    ({"type": "linear", "factor": 4.0}, 16384),
    ({"rope_type": "dynamic", "factor": 2.0}, 8192),
    # SPEC §3: rope_scaling that extends the context -> trained for the extended length
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, 16384),
    ({"type": "yarn", "factor": 2.0}, 8192),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 4096),
])
def test_rope_scaling(rope, expected):
    cfg = {**MISTRAL_7B_V03, "max_position_embeddings": 4096, "rope_scaling": rope}
    assert shape_from_hf_config(cfg).trained_context == expected


def test_rope_parameters_transformers_5():
    cfg = {**MISTRAL_7B_V03, "max_position_embeddings": 4096, "dtype": "float16",
           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}
    s = shape_from_hf_config(cfg)
    assert s.trained_context == 8192 and s.dtype_bytes == 2
    nested = {**MISTRAL_7B_V03, "max_position_embeddings": 4096, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0}, "sliding_attention": {"rope_type": "default"}}}
    assert shape_from_hf_config(nested).trained_context == 16384


def test_nested_lm_configs():
    thinker = {"model_type": "qwen2_5_omni", "thinker_config": {"text_config": dict(QWEN25_7B)}}
    assert shape_from_hf_config(thinker).kv_per_token == 28 * 4 * 128 * 2 * 2
    decoder = {"model_type": "some_encdec", "decoder": dict(MISTRAL_7B_V03)}
    assert shape_from_hf_config(decoder).layers == 32


def test_qwen25_with_user_added_yarn():
    # Qwen's own advice for 128K: add {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    cfg = {**QWEN25_7B, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    s = shape_from_hf_config(cfg)
    assert s.trained_context == 131072 and s.rope_scaling == "yarn x4 from 32768"


def test_model_max_length_replaces():
    cfg = {**MISTRAL_7B_V03, "model_max_length": 8192}
    assert shape_from_hf_config(cfg).trained_context == 8192


@pytest.mark.parametrize("config,msg", [
    ({"model_type": "siglip_vision_model", "hidden_size": 1152}, "not a language model"),
    ({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096}, "num_attention_heads"),
    ({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4}, "head_dim nor hidden_size"),
    ({"model_type": "llama", "num_hidden_layers": -1}, "negative"),
    ({"model_type": "llama", "num_hidden_layers": "32"}, "whole number"),
    ({"model_type": "llama", "num_hidden_layers": 3e10, "num_attention_heads": 4, "hidden_size": 64}, "more than"),
    ({**GPT_OSS_20B, "layer_types": ["full_attention"] * 3}, "3 entries for 24 layers"),
    ([1, 2], "JSON object"),
])
def test_not_a_language_model(config, msg):
    with pytest.raises(HFError, match=msg):
        shape_from_hf_config(config)


# --- the fetch through a fake hub ----------------------------------------------------------------


@pytest.fixture
def hub(httpserver, tmp_path, monkeypatch):
    """A fake Hugging Face hub: config.json (HEAD + GET, with ETag / X-Repo-Commit / true
    Content-Length) and /api/models/{repo} with the siblings' sizes."""
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    endpoint = httpserver.url_for("").rstrip("/")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)  # read by fetch_hf at call time
    sha = "a" * 40

    def serve(repo, config, siblings, revision="main"):
        body = json.dumps(config).encode()
        headers = {"ETag": f'"{sha[:10]}{len(body)}"', "X-Repo-Commit": sha, "Content-Length": str(len(body))}
        url = f"/{repo}/resolve/{revision}/config.json"
        # the HEAD answers with the body too: werkzeug drops it but keeps the true Content-Length
        httpserver.expect_request(url, method="HEAD").respond_with_data(body, headers=headers)
        httpserver.expect_request(url, method="GET").respond_with_data(body, headers=headers,
                                                                        content_type="application/json")
        info = {"id": repo, "modelId": repo, "sha": sha, "private": False,
                "siblings": [{"rfilename": n, "size": z} for n, z in siblings]}
        api = f"/api/models/{repo}" + ("" if revision == "main" else f"/revision/{revision}")
        httpserver.expect_request(api, method="GET").respond_with_json(info)

    serve.endpoint = endpoint
    serve.server = httpserver
    return serve


def test_fetch_sums_safetensors(hub):
    hub("org/llama", LLAMA_31_8B, [("config.json", 800), ("model-00001-of-00002.safetensors", 5_000_000_000),
                                    ("model-00002-of-00002.safetensors", 1_060_000_000),
                                    ("original/consolidated.00.pth", 16_000_000_000)])
    config, weights = fetch_hf("org/llama")
    assert config["num_key_value_heads"] == 8 and weights == 6_060_000_000
    s = shape_from_hf_config(config, weights)
    assert s.weights_bytes == 6_060_000_000 and s.kv_per_token == 131072


def test_fetch_revision_and_consolidated_not_double_counted(hub):
    hub("mistralai/m", MISTRAL_7B_V03, [("consolidated.safetensors", 14_000), ("model-00001-of-00002.safetensors", 9_000),
                                         ("model-00002-of-00002.safetensors", 5_000)], revision="v3")
    _, weights = fetch_hf("mistralai/m", "v3")
    assert weights == 14_000


def test_fetch_bin_when_no_safetensors(hub):
    hub("old/model", PHI3_MINI_4K, [("pytorch_model-00001-of-00002.bin", 7), ("pytorch_model-00002-of-00002.bin", 3),
                                     ("training_args.bin", 1), ("README.md", 5)])
    assert fetch_hf("old/model")[1] == 10


def test_fetch_missing_repo_names_it(hub):
    hub.server.expect_request("/nobody/nothing/resolve/main/config.json").respond_with_data(
        "Repository not found", status=404, headers={"X-Error-Code": "RepositoryNotFound"})
    with pytest.raises(HFError, match="nobody/nothing"):
        fetch_hf("nobody/nothing", timeout=5)


def test_fetch_bad_name():
    with pytest.raises(HFError, match="not a Hugging Face repository"):
        fetch_hf("a/b/c")


def test_fetch_offline_is_clear(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HFError, match="org/never-fetched.*HF_HUB_OFFLINE"):
        fetch_hf("org/never-fetched")
    assert len(hub.server.log) == 0  # no request left the machine


def test_fetch_offline_serves_cached_config(hub, monkeypatch):
    hub("org/cached", QWEN3_32B, [("model.safetensors", 42)])
    assert fetch_hf("org/cached") == (QWEN3_32B, 42)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config, weights = fetch_hf("org/cached")
    assert config == QWEN3_32B and weights == 0  # sizes are not in the cache: unknown


def test_fetch_sends_token(hub, monkeypatch):
    hub("org/private", QWEN3_32B, [("model.safetensors", 1)])
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test")
    fetch_hf("org/private")
    auth = [r.headers.get("Authorization") for r, _ in hub.server.log]
    assert auth and all(a == "Bearer hf_secret_test" for a in auth)


# last: huggingface_hub keeps retrying in the abandoned worker thread for a while
def test_fetch_unreachable_hub_is_bounded(monkeypatch, tmp_path):
    import socket
    import time

    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(HFError, match="org/away"):
        fetch_hf("org/away", timeout=1)
    assert time.monotonic() - t0 < 5


def test_pure_mamba_configs():
    # Mamba-Codestral-7B (mamba2): d_inner = 128 heads x 64 = 8192, 8 groups of state 128
    codestral = {"model_type": "mamba2", "hidden_size": 4096, "num_hidden_layers": 64, "num_heads": 128,
                 "head_dim": 64, "expand": 2, "state_size": 128, "n_groups": 8, "conv_kernel": 4,
                 "torch_dtype": "bfloat16"}
    s = shape_from_hf_config(codestral)
    assert s.kv_per_token == 0 and s.heads == 0 and sum(s.recurrent_layers) == 64
    assert (s.state_r, s.state_s) == (3 * (8192 + 2 * 8 * 128), 128 * 8192)
    assert kv_bytes(s, "llamacpp", 100_000, 2).kv == 0
    # falcon-mamba-7b (Mamba-1): intermediate_size is d_inner, no groups
    fm = {"model_type": "falcon_mamba", "hidden_size": 4096, "num_hidden_layers": 64, "intermediate_size": 8192,
          "state_size": 16, "conv_kernel": 4}
    s = shape_from_hf_config(fm)
    assert (s.state_r, s.state_s) == (3 * 8192, 16 * 8192)


def test_falcon_h1_every_layer_both():
    cfg = {"model_type": "falcon_h1", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 2, "head_dim": 64, "mamba_d_ssm": 1536, "mamba_d_state": 128,
           "mamba_n_groups": 1, "mamba_d_conv": 4, "max_position_embeddings": 16384}
    s = shape_from_hf_config(cfg)
    assert s.recurrent_layers == (True,) * 4 and s.kv_heads_per_layer == (2,) * 4
    assert s.state_r == 3 * (1536 + 256) and s.state_s == 128 * 1536


def test_odd_configs_give_hferror_or_a_shape():
    """Whatever the values, shape_from_hf_config answers with a Shape or an HFError."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    keys = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
            "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types", "sliding_window_pattern",
            "use_sliding_window", "max_position_embeddings", "rope_scaling", "rope_parameters", "model_type",
            "attn_layer_period", "attn_layer_offset", "full_attention_interval", "torch_dtype", "text_config",
            "mamba_d_state", "linear_num_value_heads", "no_rope_layers", "attention_chunk_size", "model_max_length"]
    values = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.floats(allow_nan=True), st.text(max_size=12),
                       st.lists(st.one_of(st.sampled_from(["full_attention", "sliding_attention", "mamba"]),
                                          st.integers(0, 1)), max_size=70),
                       st.dictionaries(st.sampled_from(["type", "rope_type", "factor", "full_attention"]),
                                       st.one_of(st.text(max_size=8), st.floats(), st.integers(), st.none()),
                                       max_size=3))
    base = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64,
            "max_position_embeddings": 4096}

    @settings(max_examples=400, deadline=None)
    @given(st.dictionaries(st.sampled_from(keys), values, max_size=8))
    def check(changes):
        try:
            s = shape_from_hf_config({**base, **changes})
        except HFError:
            return
        assert len(s.kv_heads_per_layer) == s.layers and s.kv_per_token >= 0
        kv_bytes(s, "vllm", 1000)

    check()
