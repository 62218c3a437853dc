"""A Hugging Face `config.json` -> `Shape`, read as vLLM and SGLang read it.

Pure Python (huggingface_hub for the fetch only). Rules and their sources:
kv-memory.md §5.1 (fields), §3.1 (vLLM `model_arch_config_convertor.py`: text config, KV heads,
head size, MLA), §3.2 (vLLM `vllm/config/model.py::_get_and_verify_max_len`: trained context and
rope scaling), §1.6 (recurrent state element counts, the same in llama.cpp and vLLM).
"""

from __future__ import annotations

import os

from catalog.domain.shape import Shape

__all__ = ["HFError", "shape_from_hf_config", "fetch_hf", "text_config"]


class HFError(ValueError):
    """A config that is not a language model's, or a repository that could not be read."""


# transformers PretrainedConfig.get_text_config searches these sub-configs (vLLM uses it)
_SUB_CONFIGS = ("text_config", "decoder", "generator", "text_encoder")
# vLLM get_total_num_kv_heads (model_arch_config_convertor.py L152): first present wins
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
# vLLM derive_max_model_len_and_key (vllm/config/model.py L374): the smallest present
_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
             "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# rope types whose max_position_embeddings is already the extended length (no multiplication)
_NO_MULTIPLY = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "default", "mrope"}
_DTYPES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

# transformers config-class defaults for fields real configs leave out (vLLM reads the filled-in
# config object): Gemma3TextConfig max_position_embeddings 131072, sliding_window 4096, pattern 6
_CLASS_DEFAULTS = {
    "gemma3_text": {"max_position_embeddings": 131072, "sliding_window": 4096},
    "gemma2": {"max_position_embeddings": 8192, "sliding_window": 4096},
}

MAX_LAYERS = 4096

_PURE_RECURRENT = {"mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "rwkv7"}


def _num(cfg: dict, *keys: str, default: int | None = None) -> int | None:
    """The first present, non-null whole-number key."""
    for k in keys:
        v = cfg.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise HFError(f"{k} is {v!r}, not a whole number")
        if v < 0:
            raise HFError(f"{k} is {v}, a negative size")
        return int(v)
    return default


def text_config(config: dict) -> dict:
    """The language model's part of a config: itself, or a nested LM config (multimodal
    models: text_config; encoder-decoder: decoder; Qwen-Omni: thinker_config.text_config).
    Top-level fields the sub-config lacks (dtype) are inherited."""
    if not isinstance(config, dict):
        raise HFError("a config.json must be a JSON object")
    sub = None
    thinker = config.get("thinker_config")
    if isinstance(thinker, dict) and isinstance(thinker.get("text_config"), dict):
        sub = thinker["text_config"]
    for key in _SUB_CONFIGS:
        if sub is None and isinstance(config.get(key), dict) and config[key]:
            sub = config[key]
    if sub is None:
        return config
    merged = dict(sub)
    for k in ("torch_dtype", "dtype"):
        if merged.get(k) is None and config.get(k) is not None:
            merged[k] = config[k]
    if "model_type" not in merged and config.get("model_type"):
        merged["model_type"] = config["model_type"]
    return merged


def _rope_sets(cfg: dict) -> list[dict]:
    """rope_scaling (transformers < 5) or rope_parameters (>= 5, maybe one set per layer type)."""
    sets = []
    for key in ("rope_scaling", "rope_parameters"):
        v = cfg.get(key)
        if not isinstance(v, dict):
            continue
        if any(isinstance(x, dict) for x in v.values()):
            sets.extend(x for x in v.values() if isinstance(x, dict))
        else:
            sets.append(v)
    return sets


def _trained_context(cfg: dict, model_type: str) -> tuple[int, str]:
    """The context the model is trained for.

    vllm/config/model.py::_get_and_verify_max_len: the smallest of the length keys
    (model_max_length replaces it), times the rope factor for linear/dynamic scaling (gemma3
    skipped: its max_position_embeddings is already extended); llama3 and longrope:
    max_position_embeddings is already the extended length. yarn: SPEC §3 — "a config whose
    rope_scaling extends the context is trained for the extended length" — so the longer of
    max_position_embeddings and original_max_position_embeddings x factor (DeepSeek-V3 4096 x 40 =
    163840 = max_position_embeddings; Qwen2.5 with a user-added yarn x4 from 32768 -> 131072, what
    vLLM before PR #56446 derived; newer vLLM wants VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 or a raised
    max_position_embeddings for it, kv-memory.md §3.2)."""
    present = [(k, _num(cfg, k)) for k in _LEN_KEYS if cfg.get(k) is not None]
    present = [(k, v) for k, v in present if v]
    if not present:
        return 0, ""
    derived = min(v for _, v in present)
    mml = _num(cfg, "model_max_length")
    if mml:
        derived = mml
    note = ""
    factor = 1.0
    extended = 0
    for rs in _rope_sets(cfg):
        rtype = str(rs.get("rope_type") or rs.get("type") or "default").lower()
        f = rs.get("factor")
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f < 1e6:
            continue
        orig = rs.get("original_max_position_embeddings")
        orig = orig if isinstance(orig, int) and not isinstance(orig, bool) and 0 < orig < 1 << 40 else None
        if rtype in ("yarn", "deepseek_yarn"):
            extended = max(extended, int((orig or derived) * f))
        elif rtype not in _NO_MULTIPLY and "gemma3" not in model_type:
            factor = max(factor, float(f))
        if f != 1 and not note:
            note = f"{rtype} x{f:g}" + (f" from {orig}" if orig else "")
    return max(int(derived * factor), extended), note


def _dtype_bytes(cfg: dict) -> int:
    v = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(v, str):
        return _DTYPES.get(v.lower().removeprefix("torch."), 2)
    return 2


def shape_from_hf_config(config: dict, weights_bytes: int = 0) -> Shape:
    """A config.json as vLLM reads it (kv-memory.md §3.1, §3.2, §5.1)."""
    cfg = text_config(config)
    mt = str(cfg.get("model_type") or config.get("model_type") or "").lower()
    for k, v in _CLASS_DEFAULTS.get(mt, {}).items():
        if cfg.get(k) is None:
            cfg = {**cfg, k: v}
    archs = config.get("architectures") or cfg.get("architectures") or []

    layers = _num(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if not layers:
        raise HFError(f"not a language model config: no num_hidden_layers (model_type {mt or 'unknown'!r})")
    if layers > MAX_LAYERS:  # bounded memory for hostile input; real models have < 200
        raise HFError(f"num_hidden_layers is {layers}, more than {MAX_LAYERS}")
    hidden = _num(cfg, "hidden_size", "d_model", "n_embd", "hidden_dim", default=0)
    heads = _num(cfg, "num_attention_heads", "n_head", "num_heads", default=0)
    pure_recurrent = mt in _PURE_RECURRENT
    if not heads and not pure_recurrent:
        raise HFError(f"not a language model config: no num_attention_heads (model_type {mt or 'unknown'!r})")
    # get_total_num_kv_heads: absent => MHA
    kv_heads = _num(cfg, *_KV_HEAD_KEYS, default=heads) or heads
    # get_head_size: head_dim when given and > 0, then hidden_size_per_head, then hidden / heads
    head_dim = _num(cfg, "head_dim", default=0) or _num(cfg, "hidden_size_per_head", default=0)
    if not head_dim and heads:
        if not hidden:
            raise HFError("the config gives neither head_dim nor hidden_size")
        head_dim = hidden // heads
    head_v = head_dim  # MHA/GQA: V as wide as K
    if pure_recurrent:  # Mamba-2's num_heads/head_dim are SSM heads, not attention
        heads = kv_heads = head_dim = head_v = 0

    # MLA (deepseek_v2/v3, kimi_k2, ...): latent kv_lora_rank + decoupled rope key, one "head"
    kv_lora = _num(cfg, "kv_lora_rank", default=0)
    mla = bool(kv_lora)
    rope_dim = _num(cfg, "qk_rope_head_dim", default=0) if mla else 0
    if mla:
        head_dim, head_v, kv_heads = kv_lora + rope_dim, 0, 1

    # Layer kinds ------------------------------------------------------------------------
    kinds = ["attention"] * layers  # attention | sliding | recurrent | both
    lt = cfg.get("layer_types")
    if isinstance(lt, list) and lt:
        if len(lt) < layers:
            raise HFError(f"layer_types has {len(lt)} entries for {layers} layers")
        for i, t in enumerate(lt[:layers]):
            t = str(t)
            if t in ("sliding_attention", "chunked_attention"):
                kinds[i] = "sliding"
            elif t in ("mamba", "linear_attention", "conv", "recurrent", "mamba2"):
                kinds[i] = "recurrent"
            else:
                kinds[i] = "attention"
    elif mt == "jamba" or ("attn_layer_period" in cfg and "attn_layer_offset" in cfg):
        period = _num(cfg, "attn_layer_period", default=1) or 1
        offset = _num(cfg, "attn_layer_offset", default=0)
        kinds = ["attention" if i % period == offset else "recurrent" for i in range(layers)]
    elif mt.startswith("qwen3_next") or "full_attention_interval" in cfg:
        interval = _num(cfg, "full_attention_interval", default=4) or 4
        kinds = ["attention" if (i + 1) % interval == 0 else "recurrent" for i in range(layers)]
    elif isinstance(cfg.get("hybrid_override_pattern"), str):  # Nemotron-H: M mamba, * attention, - MLP
        pat = cfg["hybrid_override_pattern"]
        kinds = [{"M": "recurrent", "*": "attention"}.get(c, "none") for c in pat[:layers]]
        kinds += ["none"] * (layers - len(kinds))
    elif pure_recurrent:
        kinds = ["recurrent"] * layers
    elif mt.startswith("falcon_h1"):
        kinds = ["both"] * layers

    # Sliding window -------------------------------------------------------------------
    window = _num(cfg, "sliding_window", default=0) or 0
    chunk = _num(cfg, "attention_chunk_size", default=0) or 0
    if mt.startswith("llama4") and chunk:
        window = chunk
        if not (isinstance(lt, list) and lt):
            nrl = cfg.get("no_rope_layers")
            if isinstance(nrl, list) and len(nrl) >= layers:
                # transformers Llama4: a NoPE layer (0) attends globally, the others are chunked
                kinds = ["sliding" if nrl[i] else "attention" for i in range(layers)]
            else:
                kinds = ["attention" if (i + 1) % 4 == 0 else "sliding" for i in range(layers)]
    elif cfg.get("use_sliding_window") is False or mt.startswith("phi3") or mt == "phi":
        # Qwen2/3: use_sliding_window false => transformers sets sliding_window None;
        # Phi-3: llama.cpp disables its SWA (phi3.cpp, PR #13676), the conservative reading
        window = 0
        kinds = ["attention" if k == "sliding" else k for k in kinds]
    elif window and not (isinstance(lt, list) and lt):
        pattern = _num(cfg, "sliding_window_pattern", default=0)
        if mt.startswith("gemma2"):
            pattern = pattern or 2
        elif mt.startswith("gemma3"):
            pattern = pattern or 6
        elif mt.startswith("cohere2"):
            pattern = pattern or 4
        elif mt.startswith("gpt_oss"):
            pattern = pattern or 2
        if pattern:
            # transformers: sliding iff (i + 1) % pattern != 0 (the last layer of each period is full)
            kinds = ["sliding" if k == "attention" and (i + 1) % pattern else k for i, k in enumerate(kinds)]
        elif mt.startswith(("qwen2", "qwen3")) and cfg.get("use_sliding_window"):
            mwl = _num(cfg, "max_window_layers", default=0)
            kinds = ["sliding" if k == "attention" and i >= mwl else k for i, k in enumerate(kinds)]
        elif mt in ("mistral", "mixtral", "starcoder2", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
            # transformers applies sliding_window to every layer of these families
            kinds = ["sliding" if k == "attention" else k for k in kinds]
    if not window:
        kinds = ["attention" if k == "sliding" else k for k in kinds]

    # Recurrent state (elements per layer per sequence; kv-memory.md §1.6 table) --------------
    state_r = state_s = 0
    if any(k in ("recurrent", "both") for k in kinds):
        state_r, state_s = _recurrent_state(cfg, mt, hidden)

    kv_per_layer = tuple(kv_heads if k in ("attention", "sliding", "both") else 0 for k in kinds)
    swa = tuple(k == "sliding" for k in kinds)
    recr = tuple(k in ("recurrent", "both") for k in kinds)
    trained, rope_note = _trained_context(cfg, mt)
    # llama.cpp derives a GGUF's n_ctx from the same max_position_embeddings; SWA head dims equal
    return Shape(
        architecture=mt or (archs[0] if archs else "unknown"),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads if any(kv_per_layer) else 0,
        trained_context=trained,
        head_k=head_dim,
        head_v=head_v,
        kv_heads_per_layer=kv_per_layer,
        swa_layers=swa if any(swa) else (),
        recurrent_layers=recr if any(recr) else (),
        sliding_window=window if any(swa) else 0,
        mla=mla,
        kv_lora_rank=kv_lora,
        rope_head_dim=rope_dim,
        state_r=state_r,
        state_s=state_s,
        dtype_bytes=_dtype_bytes(cfg),
        weights_bytes=max(int(weights_bytes or 0), 0),
        source_kind="hf",
        rope_scaling=rope_note,
        extra={"architectures": list(archs)[:4]} if archs else {},
    )


def _recurrent_state(cfg: dict, mt: str, hidden: int) -> tuple[int, int]:
    """(n_embd_r, n_embd_s) as the converters map the config to GGUF and llama_hparams::n_embd_r/s
    compute them (kv-memory.md §1.6 table); vLLM's MambaSpec shapes hold the same element counts."""
    if mt.startswith("qwen3_next") or "linear_num_value_heads" in cfg:
        v_heads = _num(cfg, "linear_num_value_heads", default=0)
        v_dim = _num(cfg, "linear_value_head_dim", default=0)
        k_heads = _num(cfg, "linear_num_key_heads", default=0)
        k_dim = _num(cfg, "linear_key_head_dim", default=0)
        d_conv = _num(cfg, "linear_conv_kernel_dim", default=4)
        d_inner, d_state, n_group = v_heads * v_dim, k_dim, k_heads
    elif mt.startswith("lfm2"):
        l_cache = _num(cfg, "conv_L_cache", default=3)
        return hidden * (l_cache - 1), 0
    elif mt.startswith("rwkv"):
        head = _num(cfg, "head_size", "attention_head_size", default=64)
        return 2 * hidden, hidden * head
    elif mt in ("jamba", "mamba", "falcon_mamba"):
        # Mamba-1 (intermediate_size = d_inner) / Jamba (mamba_expand x hidden): no groups
        if mt == "jamba":
            d_inner = _num(cfg, "mamba_expand", default=2) * hidden
        else:
            d_inner = _num(cfg, "intermediate_size", default=0) or _num(cfg, "expand", default=2) * hidden
        d_state = _num(cfg, "mamba_d_state", "state_size", default=16)
        d_conv = _num(cfg, "mamba_d_conv", "conv_kernel", default=4)
        n_group = 0
    elif mt == "mamba2":
        d_inner = (_num(cfg, "num_heads", default=0) * _num(cfg, "head_dim", default=0)
                   or _num(cfg, "expand", default=2) * hidden)
        d_state = _num(cfg, "state_size", default=128)
        d_conv = _num(cfg, "conv_kernel", default=4)
        n_group = _num(cfg, "n_groups", default=1)
    else:
        # GraniteMoeHybrid / Falcon-H1 (mamba_d_ssm) / Nemotron-H: Mamba-2 mixers named mamba_*
        n_heads = _num(cfg, "mamba_n_heads", default=0)
        d_head = _num(cfg, "mamba_d_head", default=0)
        d_inner = _num(cfg, "mamba_d_ssm", default=0) or n_heads * d_head
        if not d_inner:
            d_inner = _num(cfg, "mamba_expand", "expand", default=2) * hidden
        d_state = _num(cfg, "mamba_d_state", "ssm_state_size", "state_size", default=128)
        d_conv = _num(cfg, "mamba_d_conv", "conv_kernel", default=4)
        n_group = _num(cfg, "mamba_n_groups", "n_groups", default=1)
    return max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner


def _weights_from_siblings(siblings) -> int:
    """Sum of the *.safetensors files, else of the *.bin files. A Mistral-style repo carrying both
    consolidated.safetensors and model-*.safetensors counts the latter only."""
    files = [(s.rfilename, s.size or 0) for s in siblings or [] if getattr(s, "rfilename", None)]
    st = [(n, z) for n, z in files if n.endswith(".safetensors")]
    if st:
        main = [(n, z) for n, z in st if not os.path.basename(n).startswith("consolidated")]
        return sum(z for _, z in (main or st))
    return sum(z for n, z in files if n.endswith(".bin") and "training_args" not in n)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "on", "yes", "true")


def fetch_hf(repo: str, revision: str | None = None, *, token: str | None = None, timeout: float = 10,
             endpoint: str | None = None) -> tuple[dict, int]:
    """config.json (hf_hub_download) and the weights' size (model_info siblings) of a repository,
    through huggingface_hub. HF_ENDPOINT, HF_HUB_OFFLINE and HF_TOKEN are read at call time (the
    library reads them once, at import). huggingface_hub retries a failing connection with a
    backoff of up to ~25 s, so the whole fetch runs under a deadline of 3 x timeout."""
    import threading

    from huggingface_hub import constants as hf_constants

    if not isinstance(repo, str) or not repo.strip() or repo.count("/") > 1 or repo.strip() != repo:
        raise HFError(f"{repo!r} is not a Hugging Face repository name")
    token = token or os.environ.get("HF_TOKEN") or None
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")
    offline = hf_constants.HF_HUB_OFFLINE or _truthy(os.environ.get("HF_HUB_OFFLINE"))
    result: dict = {}

    def run():
        try:
            result["ok"] = _fetch(repo, revision, token, timeout, endpoint, offline)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=run, name=f"fetch_hf {repo}", daemon=True)
    worker.start()
    worker.join(3 * timeout)
    if worker.is_alive():
        raise HFError(f"{repo}: the hub at {endpoint} did not answer within {3 * timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["ok"]


def _fetch(repo: str, revision: str | None, token: str | None, timeout: float, endpoint: str,
           offline: bool) -> tuple[dict, int]:
    import json

    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        path = hf_hub_download(repo, "config.json", revision=revision, token=token, etag_timeout=timeout,
                               endpoint=endpoint, local_files_only=offline)
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as exc:
        why = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if offline else ""
        raise HFError(f"{repo}: config.json could not be fetched from {endpoint}{why}: {exc}") from None
    except HfHubHTTPError as exc:
        raise HFError(f"{repo}: config.json could not be fetched from {endpoint}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise HFError(f"{repo}: config.json could not be read: {exc}") from None
    except Exception as exc:  # huggingface_hub raises a zoo of errors (httpx, repository not found, ...)
        raise HFError(f"{repo}: config.json could not be fetched from {endpoint}: {type(exc).__name__}: {exc}") from None
    if not isinstance(config, dict):
        raise HFError(f"{repo}: config.json is not a JSON object")
    if offline:
        return config, 0  # the sizes are not in the local cache: unknown
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision, files_metadata=True,
                                                                 timeout=timeout)
        weights = _weights_from_siblings(info.siblings)
    except OfflineModeIsEnabled:
        weights = 0
    except Exception as exc:
        raise HFError(f"{repo}: its files could not be listed at {endpoint}: {type(exc).__name__}: {exc}") from None
    return config, weights
