"""KV-cache and recurrent-state bytes, per engine, as the engines allocate them.

Pure Python, no Django. Two halves:

- `shape_from_gguf`: a GGUF header's metadata -> `Shape`, read the way llama.cpp's
  `llama_model_base::load_hparams` (src/llama-model.cpp) and the per-arch
  `load_arch_hparams` (src/models/<arch>.cpp) read it.
- `kv_bytes`: the bytes one engine allocates for a context, given a `Shape`.

Every rule names the engine source it follows; /work/shared/reference/kv-memory.md pins the
versions (llama.cpp @0c1e570, vLLM 0.33.0, SGLang 0.5.23) and docs/kv.md lists them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from catalog.domain.args import get_arg, get_int, has_flag
from catalog.domain.shape import Shape

__all__ = ["ShapeError", "KVError", "KVBytes", "shape_from_gguf", "kv_bytes", "kv_settings_from_args", "ENGINES"]

ENGINES = ("llamacpp", "vllm", "sglang", "strata", "freetoken")


class ShapeError(ValueError):
    """Metadata that does not describe a model llama.cpp would load."""


class KVError(ValueError):
    """A KV-cache question with no answer: unknown engine or cache type, bad sizes."""


@dataclass(frozen=True)
class KVBytes:
    kv: int  # attention KV cache (full + sliding-window layers)
    state: int  # recurrent state (mamba/rwkv/GDN/shortconv), fixed per sequence

    @property
    def total(self) -> int:
        return self.kv + self.state


# --------------------------------------------------------------------------------------
# GGUF metadata -> Shape
# --------------------------------------------------------------------------------------

# src/llama-arch.cpp llm_arch_is_recurrent: recurrent memory only, every layer.
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# llm_arch_is_hybrid: attention KV for some layers + recurrent state for the others.
HYBRID_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "qwen35", "qwen35moe", "kimi-linear", "kimi_linear",
})
# Hybrids whose recurrent layers are the ones with head_count_kv == 0
# (src/models/jamba.cpp, granite-hybrid.cpp, lfm2.cpp: is_recr_impl[i] = n_head_kv(i) == 0).
_RECR_BY_ZERO_KV = frozenset({"jamba", "granitehybrid", "lfm2", "lfm2moe"})
# Hybrids with a GDN/linear-attention pattern key (src/models/qwen3next.cpp load_arch_hparams).
_RECR_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})

# Per-arch sliding-window defaults: (default n_swa or None = key required/absent means none,
# default pattern period, dense_first). From src/models/<arch>.cpp load_arch_hparams -> load_swa_pattern.
_SWA_ARCHS: dict[str, tuple[int | None, int, bool]] = {
    "gemma2": (4096, 2, False),  # gemma2.cpp: n_swa = 4096 default, load_swa_pattern(ml, 2)
    "gemma3": (None, 6, False),  # gemma3.cpp: only when the key is present and > 0, pattern 6
    "cohere2": (None, 4, False),  # cohere2.cpp: key required, pattern 4
    "gpt-oss": (None, 2, False),  # openai-moe.cpp: key required, pattern 2
    "exaone4": (None, 4, False),  # exaone4.cpp: when n_swa > 0, pattern 4
    "olmo2": (None, 4, False),  # olmo2.cpp: when n_swa > 0, pattern 4
    "gemma3n": (None, 5, False),  # gemma3n.cpp: pattern 5
    "smallthinker": (None, 4, True),  # smallthinker.cpp: load_swa_pattern(ml, 4, true)
}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalar(md: dict, key: str, default: int | None = None, *, required: bool = False) -> int | None:
    """A whole-number key; ShapeError when required and absent, negative, or not a number."""
    if key not in md:
        if required:
            raise ShapeError(f"the GGUF header has no {key}")
        return default
    v = md[key]
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise ShapeError(f"{key} is {v!r}, not a whole number")
    if v < 0:
        raise ShapeError(f"{key} is {v}, a negative size")
    return v


def _per_layer(md: dict, key: str, n: int, default: list[int] | None) -> list[int] | None:
    """llama.cpp's get_key_or_arr (src/llama-model-loader.cpp): a scalar applies to every
    layer; an array must have exactly block_count elements (u32/i32/bool)."""
    if key not in md:
        return default
    v = md[key]
    if isinstance(v, (list, tuple)):
        if len(v) != n:
            raise ShapeError(f"{key} has {len(v)} values for {n} layers (block_count)")
        out = []
        for x in v:
            if isinstance(x, bool):
                x = int(x)
            if not _is_int(x) or x < 0:
                raise ShapeError(f"{key} holds {x!r}, not a whole number of heads")
            out.append(x)
        return out
    if not isinstance(v, (list, tuple)) and hasattr(v, "count") and hasattr(v, "type"):
        # an ArraySummary from catalog.domain.gguf: the reader stepped over it
        raise ShapeError(f"{key} is an array of {getattr(v, 'count', '?')} values that was not read")
    return [_scalar(md, key)] * n  # type: ignore[list-item]


def _swa_pattern(md: dict, arch: str, n_layer_all: int, n_layer: int, period: int, dense_first: bool) -> list[bool]:
    """llama_model_base::load_swa_pattern (src/llama-model.cpp) + llama_hparams::set_swa_pattern
    (src/llama-hparams.cpp): a bool array per layer, or a u32 period overriding the arch's;
    with a period p, is_swa(il) = p == 0 || il % p < p - 1 (the last layer of each period is
    full attention; dense_first: il % p != 0). MTP layers are never SWA."""
    key = f"{arch}.attention.sliding_window_pattern"
    v = md.get(key)
    if isinstance(v, (list, tuple)):
        if len(v) > n_layer_all:
            raise ShapeError(f"{key} has {len(v)} values for {n_layer_all} layers (block_count)")
        flags = [bool(x) for x in v] + [False] * (n_layer_all - len(v))
        return flags
    if v is not None:
        period = _scalar(md, key)  # type: ignore[assignment]
    out = []
    for il in range(n_layer_all):
        if il >= n_layer:
            out.append(False)
        elif dense_first:
            out.append(period == 0 or il % period != 0)
        else:
            out.append(period == 0 or il % period < period - 1)
    return out


def shape_from_gguf(metadata: dict, file_size: int = 0) -> Shape:
    """A GGUF header's metadata as llama.cpp reads it (kv-memory.md §1.1, 1.4-1.6)."""
    md = metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ShapeError("the GGUF header has no general.architecture")
    a = arch + "."

    # llama_model_base::load_hparams (src/llama-model.cpp L1323-1331)
    n_ctx_train = _scalar(md, a + "context_length", required=True)
    n_embd = _scalar(md, a + "embedding_length", required=True)
    n_layer_all = _scalar(md, a + "block_count", required=True)
    if not n_layer_all:
        raise ShapeError(f"{a}block_count is 0: a model with no layers")
    if n_layer_all > 512:  # LLAMA_MAX_LAYERS
        raise ShapeError(f"{a}block_count is {n_layer_all}, more than llama.cpp's 512 layers")
    n_nextn = _scalar(md, a + "nextn_predict_layers", 0)
    if n_nextn > n_layer_all:
        raise ShapeError(f"{a}nextn_predict_layers ({n_nextn}) exceeds block_count ({n_layer_all})")
    n_layer = n_layer_all - n_nextn  # llama_hparams::n_layer(): MTP layers are the last ones

    # head counts: scalar or per-layer (get_key_or_arr, optional; head_count_kv defaults to head_count)
    heads = _per_layer(md, a + "attention.head_count", n_layer_all, [0] * n_layer_all)
    heads_kv = _per_layer(md, a + "attention.head_count_kv", n_layer_all, list(heads))
    recurrent_arch = arch in RECURRENT_ARCHS
    if not recurrent_arch and not any(heads[:n_layer]):
        raise ShapeError(f"the GGUF header has no {a}attention.head_count")

    # head widths: key/value_length default n_embd / n_head(0) (load_hparams L1437-1461)
    if heads[0] > 0:
        head_k = _scalar(md, a + "attention.key_length", n_embd // heads[0])
        head_v = _scalar(md, a + "attention.value_length", n_embd // heads[0])
    else:
        head_k = head_v = 0
    head_k_swa = _scalar(md, a + "attention.key_length_swa", head_k)
    head_v_swa = _scalar(md, a + "attention.value_length_swa", head_v)

    # MLA: llama_hparams::is_mla() (src/llama-hparams.cpp) <=> both *_mla keys present and != 0;
    # the cache then holds K only (src/llama-kv-cache.cpp: has_v = !is_mla), row = key_length x n_head_kv
    k_mla = _scalar(md, a + "attention.key_length_mla", 0)
    v_mla = _scalar(md, a + "attention.value_length_mla", 0)
    mla = bool(k_mla and v_mla)
    kv_lora = _scalar(md, a + "attention.kv_lora_rank", 0)
    rope_dim = _scalar(md, a + "rope.dimension_count", 0)
    if mla and kv_lora and head_k > kv_lora:
        rope_dim = head_k - kv_lora  # key_length = kv_lora_rank + qk_rope_head_dim (conversion/deepseek.py)

    # Recurrent layers (llama_hparams::is_recr, set in load_hparams and the per-arch loaders)
    recr = [False] * n_layer_all
    if recurrent_arch:
        recr = [True] * n_layer_all
    elif arch == "falcon-h1":  # falcon-h1.cpp: every layer is recurrent AND has attention
        recr = [True] * n_layer_all
    elif arch in _RECR_BY_ZERO_KV:
        recr = [il < n_layer and heads_kv[il] == 0 for il in range(n_layer_all)]
    elif arch in ("nemotron_h", "nemotron_h_moe"):  # nemotron-h.cpp: n_head_kv == 0 and n_ff == 0
        n_ff = _per_layer(md, a + "feed_forward_length", n_layer_all, [0] * n_layer_all)
        recr = [il < n_layer and heads_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layer_all)]
    elif arch in _RECR_BY_INTERVAL:  # qwen3next.cpp: recurrent_layers array, else full_attention_interval
        arr = md.get(a + "attention.recurrent_layers")
        if isinstance(arr, (list, tuple)):
            if len(arr) != n_layer_all:
                raise ShapeError(f"{a}attention.recurrent_layers has {len(arr)} values for {n_layer_all} layers")
            recr = [bool(x) for x in arr]
        else:
            interval = _scalar(md, a + "full_attention_interval", 4)
            if not interval:
                raise ShapeError(f"{a}full_attention_interval is 0")
            recr = [il < n_layer and (il + 1) % interval != 0 for il in range(n_layer_all)]

    # Which layers hold attention KV in the main context: has_kv, not recurrent-only (the hybrid
    # memory's filter_attn = !is_recr, except falcon-h1), not MTP (il < n_layer()).
    kv_layer_heads = []
    for il in range(n_layer):
        has_attn = heads_kv[il] > 0 and (not recr[il] or arch == "falcon-h1") and not recurrent_arch
        kv_layer_heads.append(heads_kv[il] if has_attn else 0)

    # Sliding window (kv-memory.md §1.4; per-arch load_arch_hparams)
    n_swa = 0
    swa = [False] * n_layer_all
    swa_key = a + "attention.sliding_window"
    if arch in _SWA_ARCHS:
        default, period, dense_first = _SWA_ARCHS[arch]
        n_swa = _scalar(md, swa_key, default or 0)
        if arch in ("cohere2", "gpt-oss") and swa_key not in md:
            raise ShapeError(f"the GGUF header has no {swa_key}, which llama.cpp requires for {arch}")
        if n_swa > 0:
            swa = _swa_pattern(md, arch, n_layer_all, n_layer, period, dense_first)
    elif arch == "llama4":
        # llama4.cpp: key present and 0 => no SWA; otherwise CHUNKED attention, n_swa forced to 8192, pattern 4
        if swa_key in md and _scalar(md, swa_key) == 0:
            n_swa = 0
        else:
            n_swa = 8192
            swa = _swa_pattern(md, arch, n_layer_all, n_layer, 4, False)
    elif arch == "phi3":
        n_swa = 0  # phi3.cpp: "Phi SWA is currently disabled" (PR #13676) even when the key is present
    elif arch in ("lfm2", "lfm2moe"):
        # lfm2.cpp: with a window > 0 every attention (non-recurrent) layer is SWA
        n_swa = _scalar(md, swa_key, 0)
        if n_swa > 0:
            swa = [il < n_layer and not recr[il] for il in range(n_layer_all)]
    # any other arch: llama.cpp's loader ignores sliding_window (e.g. llama/mistral), no SWA

    swa_layers = tuple(bool(swa[il]) and kv_layer_heads[il] > 0 for il in range(n_layer))

    # Recurrent state per layer in F32 elements: llama_hparams::n_embd_r / n_embd_s (src/llama-hparams.cpp)
    state_r = state_s = 0
    if any(recr[:n_layer]):
        wkv = _scalar(md, a + "wkv.head_size", 0)
        l_cache = _scalar(md, a + "shortconv.l_cache", 0)
        if wkv:  # RWKV
            state_r = _scalar(md, a + "token_shift_count", 2) * n_embd
            state_s = n_embd * wkv
        elif l_cache:  # LFM2 short convolution
            state_r = n_embd * (l_cache - 1)
            state_s = 0
        else:  # mamba / mamba2 / jamba / granitehybrid / falcon-h1 / nemotron_h / qwen3next GDN
            d_conv = _scalar(md, a + "ssm.conv_kernel", required=True)
            d_inner = _scalar(md, a + "ssm.inner_size", required=True)
            d_state = _scalar(md, a + "ssm.state_size", required=True)
            n_group = _scalar(md, a + "ssm.group_count", 0)
            state_r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
            state_s = d_state * d_inner

    full_heads = [h for h in kv_layer_heads if h > 0]
    rope_note = ""
    trained = n_ctx_train
    rs_type = md.get(a + "rope.scaling.type")
    rs_factor = md.get(a + "rope.scaling.factor")
    if (isinstance(rs_type, str) and rs_type != "none" and isinstance(rs_factor, (int, float))
            and not isinstance(rs_factor, bool) and 0 < rs_factor < 1e6):
        orig = md.get(a + "rope.scaling.original_context_length")
        orig = orig if _is_int(orig) and 0 < orig < 1 << 40 else None
        rope_note = f"{rs_type} x{rs_factor:g}" + (f" from {orig}" if orig else "")
        if rs_type == "yarn" and orig:
            # SPEC §3: rope scaling that extends the context means trained for the extended length
            # (a Qwen2.5 GGUF with yarn x4 from 32768 keeps context_length 32768)
            trained = max(trained, int(orig * rs_factor))

    return Shape(
        architecture=arch,
        layers=n_layer,
        heads=max(heads[:n_layer]) if n_layer else 0,
        kv_heads=max(full_heads) if full_heads else 0,
        # n_ctx_train (load_hparams L1323) is context_length, the converters' max_position_embeddings;
        # yarn scaling beyond it counts (above)
        trained_context=trained,
        head_k=head_k,
        head_v=0 if mla else head_v,
        kv_heads_per_layer=tuple(kv_layer_heads),
        swa_layers=swa_layers if any(swa_layers) else (),
        recurrent_layers=tuple(recr[:n_layer]) if any(recr[:n_layer]) else (),
        sliding_window=n_swa if any(swa_layers) else 0,
        head_k_swa=head_k_swa if head_k_swa != head_k else 0,
        head_v_swa=(0 if mla else head_v_swa) if head_v_swa != head_v else 0,
        mla=mla,
        kv_lora_rank=kv_lora if mla else 0,
        rope_head_dim=rope_dim if mla else 0,
        state_r=state_r,
        state_s=state_s,
        dtype_bytes=2,
        weights_bytes=max(int(file_size or 0), 0),
        source_kind="gguf",
        rope_scaling=rope_note,
        extra={"nextn_layers": n_nextn, "embedding_length": n_embd} if n_nextn else {"embedding_length": n_embd},
    )


# --------------------------------------------------------------------------------------
# Cache types
# --------------------------------------------------------------------------------------

# llama.cpp's -ctk/-ctv names (common/arg.cpp kv_cache_types)
LLAMACPP_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def row_bytes(cache_type: str, n: int) -> int:
    """ggml_row_size(type, n) = n / block * bytes_per_block (ggml/src/ggml.c); block sizes from
    gguf.GGML_QUANT_SIZES (q8_0: 34 B, q4_0: 18 B per 32 values)."""
    name = (cache_type or "f16").lower()
    if name not in LLAMACPP_CACHE_TYPES:
        raise KVError(f"unknown cache type {cache_type!r}: llama.cpp takes {', '.join(LLAMACPP_CACHE_TYPES)}")
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    if n % block:
        raise KVError(f"a row of {n} values cannot be stored as {name} (blocks of {block})")
    return n // block * nbytes


def engine_dtype_bytes(cache_dtype: str | None, shape: Shape) -> int:
    """vLLM's --kv-cache-dtype (vllm/config/cache.py CacheDType) and SGLang's: auto = the model's
    dtype; fp8 variants 1 byte; llama.cpp-style f16/bf16/f32 names are accepted too."""
    name = (cache_dtype or "auto").lower()
    if name == "auto":
        return shape.dtype_bytes or 2
    if name.startswith("fp8") or name == "int8":
        return 1
    if name in ("f16", "fp16", "float16", "half", "bf16", "bfloat16"):
        return 2
    if name in ("f32", "fp32", "float32", "float"):
        return 4
    raise KVError(f"unknown KV cache dtype {cache_dtype!r}")


# --------------------------------------------------------------------------------------
# Bytes per engine
# --------------------------------------------------------------------------------------


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _heads_k_v(shape: Shape, il: int) -> tuple[int, int]:
    """K and V widths (values per token) of layer il (llama_hparams::n_embd_k_gqa / n_embd_v_gqa:
    head dims of SWA layers may differ, src/llama-hparams.cpp)."""
    kvh = shape.kv_heads_at(il)
    if shape.is_swa(il):
        hk = shape.head_k_swa or shape.head_k
        hv = shape.head_v_swa or shape.head_v
    else:
        hk, hv = shape.head_k, shape.head_v
    if shape.mla:
        hv = 0
    return hk * kvh, hv * kvh


@lru_cache(maxsize=256)
def _kv_layers(shape: Shape) -> tuple[tuple[bool, int, int, int], ...]:
    """The layers that hold KV, grouped: (sliding-window?, K width, V width, how many). A plan
    sizes each profile before and after, on every keystroke of the live preview: walking 80
    layers each time is what it would cost otherwise."""
    groups: Counter[tuple[bool, int, int]] = Counter()
    for il in range(shape.layers):
        if shape.has_kv(il):
            groups[(shape.is_swa(il), *_heads_k_v(shape, il))] += 1
    return tuple((swa, k, v, n) for (swa, k, v), n in groups.items())


@lru_cache(maxsize=256)
def _recurrent_count(shape: Shape) -> int:
    return sum(1 for il in range(shape.layers) if shape.is_recurrent(il))


def _llamacpp(shape: Shape, context: int, slots: int, tk: str, tv: str, unified: bool, swa_full: bool,
              ubatch: int, batch: int = 2048) -> KVBytes:
    # llama-server gets --ctx-size context*slots --parallel slots (SPEC §3)
    n_ctx_user = context * slots
    # src/llama-context.cpp llama_context::llama_context: n_batch = min(n_ctx, n_batch) for causal
    # models, n_ubatch = min(n_batch, n_ubatch)
    n_ubatch = min(batch, n_ctx_user, ubatch)
    # same ctor: n_ctx = PAD(n_ctx, 256); unified: one stream of n_ctx cells; otherwise
    # n_ctx_seq = PAD(n_ctx / n_seq_max, 256) cells in each of n_seq_max streams
    n_ctx = _pad(n_ctx_user, 256)
    if unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq, n_stream = _pad(n_ctx // slots, 256), slots
    # src/llama-kv-cache-iswa.cpp llama_kv_cache_iswa ctor: SWA cells per stream
    size_swa = n_ctx_seq
    if not swa_full and shape.sliding_window:
        size_swa = _pad(min(n_ctx_seq, shape.sliding_window * (slots if unified else 1) + n_ubatch), 256)
    # src/llama-kv-cache.cpp llama_kv_cache ctor: per layer K [n_embd_k_gqa, kv_size, n_stream] of type_k,
    # V likewise of type_v unless MLA (has_v = !is_mla: the latent is cached once, as K)
    kv = 0
    for swa, k, v, layers in _kv_layers(shape):
        cells = size_swa if swa else n_ctx_seq
        row = row_bytes(tk, k) + (row_bytes(tv, v) if v else 0)
        kv += row * cells * n_stream * layers
    # src/llama-memory-recurrent.cpp llama_memory_recurrent ctor (via llama_model::create_memory):
    # F32 r and s rows, max(1, n_seq_max) of them, whatever -ctk/-ctv say
    n_recr = _recurrent_count(shape)
    state = n_recr * (shape.state_r + shape.state_s) * 4 * max(1, slots)
    return KVBytes(kv, state)


def _vllm(shape: Shape, context: int, slots: int, dtype: int, block_size: int, max_num_batched_tokens: int) -> KVBytes:
    # vllm/v1/kv_cache_interface.py: AttentionSpec.page_size_bytes =
    #   num_kv_heads * block_size * (head_size + head_size_v) * dtype; MLAAttentionSpec: head_size_v = 0,
    #   head_size = kv_lora_rank + qk_rope_head_dim, one KV head
    # FullAttentionSpec.max_memory_usage_bytes = cdiv(max_model_len, block_size) * page_size
    # SlidingWindowSpec.max_memory_usage_bytes: (cdiv(min(window - 1 + max_num_batched_tokens,
    #   max_model_len), block_size) + 1) pages
    chunked = shape.architecture.startswith("llama4")  # llama4's local layers are chunked, not sliding
    kv = 0
    for swa, k, v, layers in _kv_layers(shape):
        if shape.mla:
            k, v = (shape.kv_lora_rank + shape.rope_head_dim) or shape.head_k, 0
        page = block_size * (k + v) * dtype * layers
        if swa and chunked:
            # ChunkedLocalAttentionSpec.max_admission_blocks_per_request (llama4's chunked attention):
            # cdiv(min(attention_chunk_size + max_num_batched_tokens, max_model_len), block_size)
            pages = _cdiv(min(shape.sliding_window + max_num_batched_tokens, context), block_size)
        elif swa:
            pages = _cdiv(min(shape.sliding_window - 1 + max_num_batched_tokens, context), block_size) + 1
        else:
            pages = _cdiv(context, block_size)
        kv += pages * page
    # MambaSpec (vllm/v1/kv_cache_interface.py, shapes from vllm/model_executor/layers/mamba/mamba_utils.py):
    # one page per request of conv + ssm state, in mamba_cache_dtype (auto = the model's dtype);
    # the element counts equal llama.cpp's n_embd_r + n_embd_s
    n_recr = _recurrent_count(shape)
    state = n_recr * (shape.state_r + shape.state_s) * (shape.dtype_bytes or 2)
    return KVBytes(kv * slots, state * slots)


def _sglang(shape: Shape, context: int, slots: int, dtype: int) -> KVBytes:
    # sglang/srt/model_executor/pool_configurator.py: cell size per token =
    #   MHA: kv_heads * (head_dim + v_head_dim) * layers * dtype;  MLA: (kv_lora_rank + qk_rope_head_dim) * layers * dtype
    # the pool is sized in tokens, so every attention layer (sliding-window ones too) counts at full length
    cell = 0
    for _swa, k, v, layers in _kv_layers(shape):
        if shape.mla:
            k, v = (shape.kv_lora_rank + shape.rope_head_dim) or shape.head_k, 0
        cell += (k + v) * dtype * layers
    # mamba pool (sglang/srt/mem_cache/memory_pool.py MambaPool): one state per request; the SSM
    # state in float32 (--mamba-ssm-dtype default), the conv state in the model's dtype  [U: not pinned]
    n_recr = _recurrent_count(shape)
    state = n_recr * (shape.state_r * (shape.dtype_bytes or 2) + shape.state_s * 4)
    return KVBytes(cell * context * slots, state * slots)


def kv_bytes(shape: Shape, engine: str, context: int, slots: int = 1, *, cache_type_k: str = "f16",
             cache_type_v: str | None = None, unified: bool = False, swa_full: bool = False, ubatch: int = 512,
             block_size: int = 16, max_num_batched_tokens: int = 2048, batch: int = 2048) -> KVBytes:
    """Bytes an engine allocates for `slots` requests of `context` tokens each.

    llama.cpp: as llama-server sizes it for `--ctx-size context*slots --parallel slots`
    (kv-memory.md §1.10). vLLM: per request, times `slots` concurrent sequences. SGLang: a token
    pool of context*slots cells. cache_type_v None means "as cache_type_k" (llama.cpp's own
    default for -ctv is f16: kv_settings_from_args passes both). strata/freetoken: no engine rule is known here, so the naive
    full-attention figure `kv_per_token * context * slots` (not llama.cpp's) is used."""
    if engine not in ENGINES:
        raise KVError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    if not _is_int(context) or context <= 0:
        raise KVError(f"context must be a positive number of tokens, not {context!r}")
    if not _is_int(slots) or slots <= 0:
        raise KVError(f"slots must be at least 1, not {slots!r}")
    if engine == "llamacpp":
        if ubatch <= 0 or batch <= 0:
            raise KVError(f"ubatch and batch must be positive, not {ubatch!r} and {batch!r}")
        tk = cache_type_k or "f16"
        tv = cache_type_v or tk
        return _llamacpp(shape, context, slots, tk, tv, unified, swa_full, ubatch, batch)
    if engine == "vllm":
        if block_size <= 0:
            raise KVError(f"block size must be positive, not {block_size!r}")
        return _vllm(shape, context, slots, engine_dtype_bytes(cache_type_k, shape), block_size,
                     max_num_batched_tokens)
    if engine == "sglang":
        return _sglang(shape, context, slots, engine_dtype_bytes(cache_type_k, shape))
    # strata / freetoken: the naive full-attention rule
    return KVBytes(shape.kv_per_token * context * slots, 0)


def kv_settings_from_args(engine: str, args: Sequence[str]) -> dict:
    """kv_bytes keyword arguments from a profile's engine arguments."""
    args = args or ()
    if engine == "llamacpp":
        # common/arg.cpp: -ctk/--cache-type-k, -ctv/--cache-type-v, -kvu/--kv-unified (-no-kvu), --swa-full,
        # -ub/--ubatch-size, -b/--batch-size (n_ubatch = min(n_batch, n_ubatch) sizes the SWA cache)
        out: dict = {}
        k = get_arg(args, "-ctk", "--cache-type-k")
        v = get_arg(args, "-ctv", "--cache-type-v")
        out["cache_type_k"] = (k or "f16").lower()
        out["cache_type_v"] = (v or "f16").lower()
        out["unified"] = has_flag(args, "-kvu", "--kv-unified") and not has_flag(args, "-no-kvu", "--no-kv-unified")
        out["swa_full"] = has_flag(args, "--swa-full")
        ub = get_int(args, "-ub", "--ubatch-size")
        if ub > 0:
            out["ubatch"] = ub
        b = get_int(args, "-b", "--batch-size")
        if b > 0:
            out["batch"] = b
        return out
    if engine == "vllm":
        # vllm/engine/arg_utils.py: --kv-cache-dtype (auto = model dtype), --block-size, --max-num-batched-tokens
        out = {"cache_type_k": (get_arg(args, "--kv-cache-dtype") or "auto").lower()}
        bs = get_int(args, "--block-size")
        if bs > 0:
            out["block_size"] = bs
        mbt = get_int(args, "--max-num-batched-tokens")
        if mbt > 0:
            out["max_num_batched_tokens"] = mbt
        return out
    if engine == "sglang":
        # sglang/srt/server_args.py: --kv-cache-dtype (auto = model dtype)
        return {"cache_type_k": (get_arg(args, "--kv-cache-dtype") or "auto").lower()}
    return {}
