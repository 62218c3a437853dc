"""KV bytes per engine and GGUF metadata -> Shape.

The llama.cpp figures are the worked examples of kv-memory.md §7, which were checked against
real llama.cpp @0c1e570 (`llama_kv_cache: size = ...`); tests/llamacpp/ re-checks them against
the llama-server binary of this project."""

from __future__ import annotations

import pytest

from catalog.domain.kv import KVBytes, KVError, ShapeError, kv_bytes, kv_settings_from_args, shape_from_gguf
from catalog.domain.shape import Shape

MIB = 1 << 20


def md(arch: str, **kv) -> dict:
    """A GGUF metadata dict: keys without a dot are prefixed with the arch."""
    out = {"general.architecture": arch}
    for k, v in kv.items():
        k = k.replace("__", ".")
        out[k if k.startswith("general.") else f"{arch}.{k}"] = v
    return out


def tiny_llama(layers=4, heads=4, kv=2, hd=32, ctx=4096) -> dict:
    return md("llama", context_length=ctx, embedding_length=heads * hd, block_count=layers,
              attention__head_count=heads, attention__head_count_kv=kv)


def tiny_gemma2(layers=6, kv=2, hd=64, window=64) -> dict:
    return md("gemma2", context_length=8192, embedding_length=4 * hd, block_count=layers,
              attention__head_count=4, attention__head_count_kv=kv, attention__key_length=hd,
              attention__value_length=hd, attention__sliding_window=window)


# --- llama.cpp: the §7 table --------------------------------------------------------------


class TestLlamaCppTable:
    def test_plain_context_pads_to_256(self):
        s = shape_from_gguf(tiny_llama())
        # -c 1000 -np 1: n_ctx PAD(1000,256)=1024; 4 layers x (64+64 values) x 2 B x 1024
        assert kv_bytes(s, "llamacpp", 1000).kv == 1_048_576

    def test_parallel_rounds_per_stream(self):
        s = shape_from_gguf(tiny_llama())
        # -c 4096 -np 3 -> n_ctx_seq PAD(1365,256)=1536 per stream, 3 streams: 4.50 MiB
        got = kv_bytes(s, "llamacpp", 4096 // 3, 3)
        assert got == KVBytes(kv=int(4.5 * MIB), state=0)
        assert got.total == int(4.5 * MIB)

    def test_unified_is_one_stream(self):
        s = shape_from_gguf(tiny_llama())
        # -c 4096 -np 3 -kvu: 4096 cells, one stream: 4.00 MiB
        assert kv_bytes(s, "llamacpp", 4096 // 3, 3, unified=True).kv == 4 * MIB

    @pytest.mark.parametrize("ct,expected", [("q8_0", 557_056), ("q4_0", 294_912), ("f32", 2_097_152), ("bf16", 1_048_576)])
    def test_quantized_cache(self, ct, expected):
        s = shape_from_gguf(tiny_llama())
        # 4 layers x 2 x row(type, 64) x 1024 cells; q8_0 row = 2 blocks x 34 B, q4_0 2 x 18 B
        assert kv_bytes(s, "llamacpp", 1024, cache_type_k=ct, cache_type_v=ct).kv == expected

    def test_k_and_v_types_apart(self):
        s = shape_from_gguf(tiny_llama())
        # K q8_0 (68 B/row), V f16 (128 B/row)
        assert kv_bytes(s, "llamacpp", 1024, cache_type_k="q8_0", cache_type_v="f16").kv == 4 * (68 + 128) * 1024
        # cache_type_v None: V as K (the profile's args always give both, kv_settings_from_args)
        assert kv_bytes(s, "llamacpp", 1024, cache_type_k="q8_0").kv == 557_056

    def test_quantized_row_must_fill_blocks(self):
        s = shape_from_gguf(tiny_llama(kv=1, hd=16, heads=4))
        with pytest.raises(KVError, match="blocks of 32"):
            kv_bytes(s, "llamacpp", 1024, cache_type_k="q8_0")

    def test_unknown_cache_type(self):
        with pytest.raises(KVError, match="unknown cache type"):
            kv_bytes(shape_from_gguf(tiny_llama()), "llamacpp", 1024, cache_type_k="q3_k")

    def test_swa_single_slot(self):
        s = shape_from_gguf(tiny_gemma2())
        assert s.swa_layers == (True, False, True, False, True, False)
        # base 4096 cells x 3 layers x 512 B = 6 MiB; SWA PAD(min(4096, 64 + 512), 256) = 768 cells: 1.125 MiB
        assert kv_bytes(s, "llamacpp", 4096).kv == 6 * MIB + 3 * 512 * 768

    def test_swa_unified_window_times_slots(self):
        s = shape_from_gguf(tiny_gemma2())
        # -c 4096 -np 4 -kvu -ub 100: SWA PAD(64*4 + 100) = 512 cells, one stream (0.75 MiB)
        got = kv_bytes(s, "llamacpp", 1024, 4, unified=True, ubatch=100)
        assert got.kv == 3 * 512 * 4096 + 3 * 512 * 512

    def test_swa_per_stream(self):
        s = shape_from_gguf(tiny_gemma2())
        # -c 4096 -np 4 -ub 100: n_ctx_seq 1024; SWA PAD(min(1024, 164)) = 256 cells x 4 streams (1.50 MiB)
        got = kv_bytes(s, "llamacpp", 1024, 4, ubatch=100)
        assert got.kv == 3 * 512 * 1024 * 4 + 3 * 512 * 256 * 4

    def test_swa_full(self):
        s = shape_from_gguf(tiny_gemma2())
        assert kv_bytes(s, "llamacpp", 4096, swa_full=True).kv == 6 * 512 * 4096

    def test_swa_window_larger_than_context(self):
        s = shape_from_gguf(tiny_gemma2(window=4096))
        # min(n_ctx_seq, ...) caps the SWA cache at the base size
        assert kv_bytes(s, "llamacpp", 1024).kv == 6 * 512 * 1024

    def test_small_context_caps_ubatch(self):
        s = shape_from_gguf(tiny_gemma2())
        # n_batch = min(n_ctx, 2048), n_ubatch = min(n_batch, 512): -c 300 -> n_ubatch 300, SWA PAD(364)=512
        # but min(n_ctx_seq=512, ...) -> 512 either way; at -c 200: n_ctx 256, SWA min(256, 264) = 256
        assert kv_bytes(s, "llamacpp", 200).kv == 6 * 512 * 256

    def test_mamba2_state(self):
        m = md("mamba2", context_length=4096, embedding_length=256, block_count=3, ssm__conv_kernel=4,
               ssm__inner_size=512, ssm__state_size=16, ssm__group_count=2, ssm__time_step_rank=8)
        s = shape_from_gguf(m)
        assert (s.state_r, s.state_s) == (3 * (512 + 64), 8192)
        # r = 1728, s = 8192, x 3 layers x 4 B x 4 seqs = 476,160 (0.45 MiB), independent of context
        assert kv_bytes(s, "llamacpp", 1024, 4) == KVBytes(kv=0, state=476_160)
        assert kv_bytes(s, "llamacpp", 100_000, 4).state == 476_160

    def test_recurrent_state_ignores_cache_type(self):
        m = md("mamba2", context_length=4096, embedding_length=256, block_count=3, ssm__conv_kernel=4,
               ssm__inner_size=512, ssm__state_size=16, ssm__group_count=2)
        s = shape_from_gguf(m)
        assert kv_bytes(s, "llamacpp", 1024, 4, cache_type_k="q8_0", cache_type_v="q8_0").state == 476_160

    def test_mla_caches_k_only(self):
        m = md("deepseek2", context_length=4096, embedding_length=64, block_count=2, attention__head_count=4,
               attention__head_count_kv=1, attention__key_length=96, attention__value_length=64,
               attention__key_length_mla=64, attention__value_length_mla=32, attention__kv_lora_rank=64,
               rope__dimension_count=32)
        s = shape_from_gguf(m)
        assert s.mla and s.head_k == 96 and s.head_v == 0 and s.kv_lora_rank == 64 and s.rope_head_dim == 32
        # K only: 2 layers x 96 x 2 B x 1024 = 393,216 (0.38 MiB)
        assert kv_bytes(s, "llamacpp", 1024).kv == 393_216


# --- vLLM ------------------------------------------------------------------------------------


def llama31_8b() -> Shape:
    return Shape(architecture="llama", layers=32, heads=32, kv_heads=8, trained_context=131072, head_k=128,
                 head_v=128, kv_heads_per_layer=(8,) * 32)


class TestVLLM:
    def test_full_attention_blocks(self):
        s = llama31_8b()
        assert s.kv_per_token == 131072
        assert kv_bytes(s, "vllm", 8192, cache_type_k="auto").kv == 8192 * 131072
        # 8193 tokens take 513 blocks of 16
        assert kv_bytes(s, "vllm", 8193, cache_type_k="auto").kv == 513 * 16 * 131072

    def test_slots_multiply_requests(self):
        s = llama31_8b()
        assert kv_bytes(s, "vllm", 1000, 3).kv == 3 * 63 * 16 * 131072

    def test_fp8_and_block_size(self):
        s = llama31_8b()
        assert kv_bytes(s, "vllm", 1000, cache_type_k="fp8_e4m3", block_size=32).kv == 32 * 32 * 65536

    def test_sliding_window_capped(self):
        s = Shape(architecture="gemma2", layers=2, heads=8, kv_heads=4, trained_context=8192, head_k=256,
                  head_v=256, kv_heads_per_layer=(4, 4), swa_layers=(True, False), sliding_window=4096)
        page = 16 * 4 * 512 * 2
        # SWA: cdiv(min(4096 - 1 + 2048, 32768), 16) + 1 = 385 pages; full: 2048 pages
        assert kv_bytes(s, "vllm", 32768).kv == 385 * page + 2048 * page
        # short contexts: the SWA layer holds no more than the context (+1 page)
        assert kv_bytes(s, "vllm", 1000).kv == (63 + 1) * page + 63 * page
        # a larger batch budget widens the SWA cap
        assert kv_bytes(s, "vllm", 32768, max_num_batched_tokens=8192).kv == 769 * page + 2048 * page

    def test_llama4_chunked_local_layers(self):
        s = Shape(architecture="llama4", layers=4, heads=40, kv_heads=8, trained_context=10485760, head_k=128,
                  head_v=128, kv_heads_per_layer=(8,) * 4, swa_layers=(True, True, True, False), sliding_window=8192)
        page = 16 * 8 * 256 * 2
        # ChunkedLocalAttentionSpec: cdiv(min(8192 + 2048, 65536), 16) = 640 pages, no extra page
        assert kv_bytes(s, "vllm", 65536).kv == 3 * 640 * page + 4096 * page

    def test_mla_latent(self):
        s = Shape(architecture="deepseek_v3", layers=61, heads=128, kv_heads=1, trained_context=163840,
                  head_k=576, head_v=0, kv_heads_per_layer=(1,) * 61, mla=True, kv_lora_rank=512, rope_head_dim=64)
        # (512 + 64) x 61 layers x 2 B per token
        assert kv_bytes(s, "vllm", 4096).kv == 4096 * 576 * 61 * 2

    def test_mamba_state_per_request(self):
        s = Shape(architecture="mamba2", layers=3, heads=0, kv_heads=0, trained_context=0, head_k=0, head_v=0,
                  kv_heads_per_layer=(0, 0, 0), recurrent_layers=(True,) * 3, state_r=1728, state_s=8192,
                  dtype_bytes=2)
        assert kv_bytes(s, "vllm", 4096, 4) == KVBytes(kv=0, state=4 * 3 * (1728 + 8192) * 2)


class TestSGLangAndOthers:
    def test_sglang_cells(self):
        s = llama31_8b()
        assert kv_bytes(s, "sglang", 1000, 2, cache_type_k="auto").kv == 131072 * 1000 * 2

    def test_sglang_mla(self):
        s = Shape(architecture="deepseek_v3", layers=61, heads=128, kv_heads=1, trained_context=163840,
                  head_k=576, head_v=0, kv_heads_per_layer=(1,) * 61, mla=True, kv_lora_rank=512, rope_head_dim=64)
        assert kv_bytes(s, "sglang", 1000, cache_type_k="fp8_e5m2").kv == 576 * 61 * 1000

    @pytest.mark.parametrize("engine", ["strata", "freetoken"])
    def test_naive_engines(self, engine):
        s = shape_from_gguf(tiny_gemma2())
        # kv_per_token counts the 3 full-attention layers only (the seed's figure)
        assert kv_bytes(s, engine, 1000, 2) == KVBytes(s.kv_per_token * 2000, 0)

    def test_bad_inputs(self):
        s = llama31_8b()
        with pytest.raises(KVError, match="unknown engine"):
            kv_bytes(s, "tgi", 1000)
        with pytest.raises(KVError, match="positive"):
            kv_bytes(s, "llamacpp", 0)
        with pytest.raises(KVError, match="slots"):
            kv_bytes(s, "llamacpp", 1000, 0)
        with pytest.raises(KVError, match="dtype"):
            kv_bytes(s, "vllm", 1000, cache_type_k="int3")


class TestSettingsFromArgs:
    def test_llamacpp(self):
        args = ["-m", "x.gguf", "-ctk", "q8_0", "--cache-type-v=q4_0", "-kvu", "--swa-full", "-ub", "256"]
        assert kv_settings_from_args("llamacpp", args) == {
            "cache_type_k": "q8_0", "cache_type_v": "q4_0", "unified": True, "swa_full": True, "ubatch": 256}

    def test_llamacpp_batch_caps_ubatch(self):
        kw = kv_settings_from_args("llamacpp", ["--batch-size=128", "--no-kv-unified"])
        assert kw["batch"] == 128 and kw["unified"] is False
        s = shape_from_gguf(tiny_gemma2())
        # n_ubatch = min(128, 512): SWA PAD(min(4096, 64 + 128), 256) = 256 cells, not 768
        assert kv_bytes(s, "llamacpp", 4096, **kw).kv == 3 * 512 * 4096 + 3 * 512 * 256

    def test_llamacpp_defaults(self):
        assert kv_settings_from_args("llamacpp", ["--ctx-size", "4096"]) == {
            "cache_type_k": "f16", "cache_type_v": "f16", "unified": False, "swa_full": False}

    def test_vllm_and_sglang(self):
        assert kv_settings_from_args("vllm", ["--kv-cache-dtype", "fp8", "--block-size=32"]) == {
            "cache_type_k": "fp8", "block_size": 32}
        assert kv_settings_from_args("vllm", []) == {"cache_type_k": "auto"}
        assert kv_settings_from_args("sglang", ["--kv-cache-dtype=fp8_e5m2"]) == {"cache_type_k": "fp8_e5m2"}
        assert kv_settings_from_args("strata", ["--context", "4096"]) == {}

    def test_settings_feed_kv_bytes(self):
        s = shape_from_gguf(tiny_llama())
        kw = kv_settings_from_args("llamacpp", ["-ctk", "q8_0", "-ctv", "q8_0"])
        assert kv_bytes(s, "llamacpp", 1024, **kw).kv == 557_056
        s2 = llama31_8b()
        assert kv_bytes(s2, "vllm", 16, **kv_settings_from_args("vllm", ["--kv-cache-dtype", "fp8"])).kv == 16 * 65536


# --- shape_from_gguf per family ----------------------------------------------------------------


class TestShapeFromGGUF:
    def test_defaults_head_dims_from_embedding(self):
        s = shape_from_gguf(md("qwen2", context_length=32768, embedding_length=3584, block_count=28,
                               attention__head_count=28, attention__head_count_kv=4))
        assert (s.head_k, s.head_v, s.kv_heads, s.trained_context) == (128, 128, 4, 32768)
        assert s.kv_per_token == 28 * 4 * 256 * 2  # Qwen2.5-7B: 57,344 B

    def test_qwen2_sliding_window_key_ignored(self):
        s = shape_from_gguf(md("qwen2", context_length=32768, embedding_length=64, block_count=2,
                               attention__head_count=4, attention__sliding_window=4096))
        assert s.swa_layers == () and s.sliding_window == 0

    def test_gemma3_pattern_6(self):
        s = shape_from_gguf(md("gemma3", context_length=131072, embedding_length=5376, block_count=62,
                               attention__head_count=32, attention__head_count_kv=16, attention__key_length=128,
                               attention__value_length=128, attention__sliding_window=1024))
        full = [i for i in range(62) if not s.swa_layers[i]]
        assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
        assert s.kv_per_token == 10 * 16 * 256 * 2
        assert s.sliding_window == 1024

    def test_gemma3_without_window_is_full(self):
        s = shape_from_gguf(md("gemma3", context_length=32768, embedding_length=64, block_count=6,
                               attention__head_count=4))
        assert s.swa_layers == ()

    def test_cohere2_needs_window(self):
        base = dict(context_length=8192, embedding_length=64, block_count=8, attention__head_count=4)
        with pytest.raises(ShapeError, match="sliding_window"):
            shape_from_gguf(md("cohere2", **base))
        s = shape_from_gguf(md("cohere2", attention__sliding_window=4096, **base))
        assert s.swa_layers == (True, True, True, False) * 2

    def test_gpt_oss_pattern_2(self):
        s = shape_from_gguf(md("gpt-oss", context_length=131072, embedding_length=2880, block_count=24,
                               attention__head_count=64, attention__head_count_kv=8, attention__key_length=64,
                               attention__value_length=64, attention__sliding_window=128))
        assert s.swa_layers == (True, False) * 12
        assert s.kv_per_token == 12 * 8 * 128 * 2

    def test_llama4_chunked_forced_8192(self):
        base = dict(context_length=10485760, embedding_length=5120, block_count=8, attention__head_count=40,
                    attention__head_count_kv=8, attention__key_length=128, attention__value_length=128)
        s = shape_from_gguf(md("llama4", **base))
        assert s.sliding_window == 8192 and s.swa_layers == (True, True, True, False) * 2
        s2 = shape_from_gguf(md("llama4", attention__sliding_window=1000, **base))
        assert s2.sliding_window == 8192  # forced
        s3 = shape_from_gguf(md("llama4", attention__sliding_window=0, **base))
        assert s3.swa_layers == ()

    def test_phi3_swa_disabled(self):
        s = shape_from_gguf(md("phi3", context_length=4096, embedding_length=3072, block_count=32,
                               attention__head_count=32, attention__head_count_kv=32, attention__sliding_window=2047))
        assert s.swa_layers == () and s.kv_per_token == 32 * 32 * 96 * 2 * 2

    def test_pattern_key_u32_and_bool_array(self):
        base = dict(context_length=8192, embedding_length=64, block_count=6, attention__head_count=4,
                    attention__sliding_window=64)
        s = shape_from_gguf(md("gemma3", attention__sliding_window_pattern=3, **base))
        assert s.swa_layers == (True, True, False, True, True, False)
        s2 = shape_from_gguf(md("gemma3", attention__sliding_window_pattern=[False, True, True, False, True, False], **base))
        assert s2.swa_layers == (False, True, True, False, True, False)

    def test_swa_head_dims(self):
        s = shape_from_gguf(md("gemma3", context_length=8192, embedding_length=64, block_count=6,
                               attention__head_count=4, attention__head_count_kv=2, attention__key_length=32,
                               attention__value_length=32, attention__key_length_swa=16, attention__value_length_swa=16,
                               attention__sliding_window=64))
        assert (s.head_k_swa, s.head_v_swa) == (16, 16)
        # 5 SWA layers of 2x(16+16) values at 768 cells + 1 full layer of 2x(32+32) at 1024 cells, f16
        assert kv_bytes(s, "llamacpp", 1024).kv == 5 * 64 * 2 * 768 + 128 * 2 * 1024

    def test_per_layer_head_arrays(self):
        s = shape_from_gguf(md("llama", context_length=4096, embedding_length=64, block_count=3,
                               attention__head_count=[4, 4, 4], attention__head_count_kv=[2, 1, 4]))
        assert s.kv_heads_per_layer == (2, 1, 4) and s.kv_heads == 4
        assert s.kv_per_token == (2 + 1 + 4) * 16 * 2 * 2

    def test_array_length_must_match(self):
        with pytest.raises(ShapeError, match="2 values for 3 layers"):
            shape_from_gguf(md("llama", context_length=4096, embedding_length=64, block_count=3,
                               attention__head_count=4, attention__head_count_kv=[2, 2]))

    def test_nextn_layers_excluded(self):
        s = shape_from_gguf(md("glm4moe", context_length=131072, embedding_length=64, block_count=4,
                               nextn_predict_layers=1, attention__head_count=4, attention__head_count_kv=2))
        assert s.layers == 3 and len(s.kv_heads_per_layer) == 3

    def test_legacy_mla_without_mla_keys_is_mha(self):
        s = shape_from_gguf(md("deepseek2", context_length=4096, embedding_length=64, block_count=2,
                               attention__head_count=128, attention__head_count_kv=128, attention__key_length=192,
                               attention__value_length=128, attention__kv_lora_rank=512))
        assert not s.mla and s.kv_per_token == 2 * 128 * 320 * 2

    def test_jamba_hybrid(self):
        kvh = [0, 0, 0, 0, 8, 0, 0, 0]
        s = shape_from_gguf(md("jamba", context_length=262144, embedding_length=4096, block_count=8,
                               attention__head_count=32, attention__head_count_kv=kvh, ssm__conv_kernel=4,
                               ssm__inner_size=8192, ssm__state_size=16, ssm__time_step_rank=256))
        assert s.recurrent_layers == tuple(h == 0 for h in kvh)
        assert (s.state_r, s.state_s) == (3 * 8192, 16 * 8192)
        got = kv_bytes(s, "llamacpp", 4096, 2)
        assert got.kv == 8 * 128 * 2 * 2 * 4096 * 2
        assert got.state == 7 * (3 * 8192 + 16 * 8192) * 4 * 2

    def test_granitehybrid(self):
        kvh = [0, 0, 0, 0, 0, 8, 0, 0, 0, 8]
        s = shape_from_gguf(md("granitehybrid", context_length=131072, embedding_length=1536, block_count=10,
                               attention__head_count=12, attention__head_count_kv=kvh, ssm__conv_kernel=4,
                               ssm__inner_size=3072, ssm__state_size=128, ssm__group_count=1, ssm__time_step_rank=48))
        assert sum(s.recurrent_layers) == 8 and s.kv_per_token == 2 * 8 * 128 * 2 * 2
        assert s.state_r == 3 * (3072 + 256) and s.state_s == 128 * 3072

    def test_qwen3next_interval_and_array(self):
        base = dict(context_length=262144, embedding_length=2048, block_count=8, attention__head_count=16,
                    attention__head_count_kv=2, attention__key_length=256, attention__value_length=256,
                    ssm__conv_kernel=4, ssm__inner_size=4096, ssm__state_size=128, ssm__group_count=16,
                    ssm__time_step_rank=32)
        s = shape_from_gguf(md("qwen3next", **base))
        assert s.recurrent_layers == (True, True, True, False) * 2
        assert s.kv_heads_per_layer == (0, 0, 0, 2) * 2
        assert s.state_r == 3 * (4096 + 2 * 16 * 128) and s.state_s == 128 * 4096
        s2 = shape_from_gguf(md("qwen3next", full_attention_interval=2, **base))
        assert s2.recurrent_layers == (True, False) * 4
        s3 = shape_from_gguf(md("qwen3next", attention__recurrent_layers=[True] * 7 + [False], **base))
        assert s3.kv_heads_per_layer == (0,) * 7 + (2,)

    def test_falcon_h1_both(self):
        s = shape_from_gguf(md("falcon-h1", context_length=16384, embedding_length=1024, block_count=4,
                               attention__head_count=8, attention__head_count_kv=2, attention__key_length=64,
                               attention__value_length=64, ssm__conv_kernel=4, ssm__inner_size=1536,
                               ssm__state_size=128, ssm__group_count=1))
        assert s.recurrent_layers == (True,) * 4 and s.kv_heads_per_layer == (2,) * 4
        got = kv_bytes(s, "llamacpp", 1024)
        assert got.kv == 4 * 2 * 128 * 2 * 1024 and got.state == 4 * (3 * (1536 + 256) + 128 * 1536) * 4

    def test_lfm2_shortconv_and_swa(self):
        kvh = [0, 0, 8, 0, 0, 8]
        base = dict(context_length=128000, embedding_length=1024, block_count=6, attention__head_count=16,
                    attention__head_count_kv=kvh, shortconv__l_cache=3)
        s = shape_from_gguf(md("lfm2", **base))
        assert (s.state_r, s.state_s) == (2 * 1024, 0) and sum(s.recurrent_layers) == 4
        s2 = shape_from_gguf(md("lfm2", attention__sliding_window=512, **base))
        assert s2.swa_layers == tuple(h > 0 for h in kvh)

    def test_rwkv_state(self):
        s = shape_from_gguf(md("rwkv7", context_length=1048576, embedding_length=768, block_count=2,
                               wkv__head_size=64, token_shift_count=2))
        assert (s.state_r, s.state_s) == (2 * 768, 768 * 64) and s.kv_per_token == 0

    def test_weights_and_kind(self):
        s = shape_from_gguf(tiny_llama(), file_size=123456)
        assert s.weights_bytes == 123456 and s.source_kind == "gguf"

    def test_rope_scaling_note(self):
        s = shape_from_gguf({**tiny_llama(ctx=131072), "llama.rope.scaling.type": "yarn",
                             "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.original_context_length": 32768})
        assert s.trained_context == 131072 and s.rope_scaling == "yarn x4 from 32768"

    def test_yarn_extends_trained_context(self):
        # a Qwen2.5 GGUF converted with yarn x4 from 32768 keeps context_length 32768 (SPEC §3)
        s = shape_from_gguf({**tiny_llama(ctx=32768), "llama.rope.scaling.type": "yarn",
                             "llama.rope.scaling.factor": 4.0, "llama.rope.scaling.original_context_length": 32768})
        assert s.trained_context == 131072
        # linear scaling in a GGUF: context_length is what llama.cpp trains against
        s2 = shape_from_gguf({**tiny_llama(ctx=4096), "llama.rope.scaling.type": "linear",
                              "llama.rope.scaling.factor": 2.0})
        assert s2.trained_context == 4096 and s2.rope_scaling == "linear x2"

    @pytest.mark.parametrize("broken,msg", [
        ({"general.architecture": None}, "general.architecture"),
        ({"llama.block_count": 0}, "no layers"),
        ({"llama.block_count": -2}, "negative"),
        ({"llama.context_length": "many"}, "not a whole number"),
        ({"llama.embedding_length": None}, "not a whole number"),
        ({"llama.attention.head_count_kv": [1, 2, 3]}, "3 values for 4 layers"),
        ({"llama.attention.head_count": 0}, "head_count"),
        ({"llama.nextn_predict_layers": 9}, "exceeds block_count"),
    ])
    def test_nonsense(self, broken, msg):
        with pytest.raises(ShapeError, match=msg):
            shape_from_gguf({**tiny_llama(), **broken})

    @pytest.mark.parametrize("missing", ["llama.block_count", "llama.context_length", "llama.embedding_length"])
    def test_missing_required(self, missing):
        m = tiny_llama()
        del m[missing]
        with pytest.raises(ShapeError, match=missing):
            shape_from_gguf(m)

    def test_roundtrip_to_dict(self):
        s = shape_from_gguf(tiny_gemma2())
        assert Shape.from_dict(s.to_dict()) == s


def test_odd_metadata_gives_shapeerror_or_a_shape():
    """Whatever the values, shape_from_gguf answers with a Shape or a ShapeError, and a Shape sizes."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    keys = ["block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
            "attention.key_length", "attention.value_length", "attention.sliding_window",
            "attention.sliding_window_pattern", "attention.key_length_mla", "attention.value_length_mla",
            "attention.kv_lora_rank", "nextn_predict_layers", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
            "ssm.group_count", "full_attention_interval", "attention.recurrent_layers", "shortconv.l_cache"]
    values = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.floats(), st.text(max_size=5),
                       st.lists(st.one_of(st.integers(-1, 8), st.booleans()), max_size=12))
    archs = st.sampled_from(["llama", "gemma2", "gemma3", "cohere2", "gpt-oss", "llama4", "phi3", "lfm2", "jamba",
                             "granitehybrid", "qwen3next", "falcon-h1", "mamba2", "rwkv7", "deepseek2", "nemotron_h"])

    @settings(max_examples=500, deadline=None)
    @given(archs, st.dictionaries(st.sampled_from(keys), values, max_size=8))
    def check(arch, changes):
        m = {"general.architecture": arch, f"{arch}.block_count": 6, f"{arch}.context_length": 4096,
             f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4}
        m.update({f"{arch}.{k}": v for k, v in changes.items()})
        try:
            s = shape_from_gguf(m)
        except ShapeError:
            return
        assert len(s.kv_heads_per_layer) == s.layers
        for engine in ("llamacpp", "vllm", "sglang"):
            try:
                kv_bytes(s, engine, 3000, 2)
            except KVError:
                pass

    check()
