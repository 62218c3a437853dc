"""Tiny GGUF models that the real llama.cpp loads, written with gguf-py's GGUFWriter.

Each writer returns the path it wrote. Weights are random f16 (1-D norms and biases f32), the
vocabulary is a 260-token SPM one (3 specials, 256 byte tokens, one word piece) with a chat
template — what /work/shared/reference/environment.md found llama-server to load. Tensor names
and shapes follow each arch's `load_arch_tensors` in llama.cpp's src/models/<arch>.cpp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from catalog.fleet.tiny_gguf import VOCAB, add_vocab, write_tiny_llama


class _Tensors:
    def __init__(self, w: GGUFWriter, seed: int):
        self.w = w
        self.rng = np.random.default_rng(seed)

    def add(self, name: str, ne: tuple[int, ...], *, f32: bool = False, value: float | None = None) -> None:
        """ne in GGML order (ne[0] innermost); numpy takes it reversed."""
        shape = tuple(reversed(ne))
        if value is not None:
            data = np.full(shape, value, dtype=np.float32)
        else:
            data = (self.rng.standard_normal(shape) * 0.02).astype(np.float32)
        if not f32 and len(ne) > 1:
            data = data.astype(np.float16)
        self.w.add_tensor(name, data)


def _start(path: Path, arch: str, *, n_embd: int, n_layer: int, n_ctx: int, n_ff: int) -> GGUFWriter:
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(1)  # MOSTLY_F16
    add_vocab(w)
    return w


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _embd_and_output(t: _Tensors, n_embd: int) -> None:
    t.add("token_embd.weight", (n_embd, VOCAB))
    t.add("output_norm.weight", (n_embd,), f32=True, value=1.0)


def _attn(t: _Tensors, i: int, n_embd: int, n_head: int, n_head_kv: int, hd: int) -> None:
    t.add(f"blk.{i}.attn_norm.weight", (n_embd,), f32=True, value=1.0)
    t.add(f"blk.{i}.attn_q.weight", (n_embd, n_head * hd))
    t.add(f"blk.{i}.attn_k.weight", (n_embd, n_head_kv * hd))
    t.add(f"blk.{i}.attn_v.weight", (n_embd, n_head_kv * hd))
    t.add(f"blk.{i}.attn_output.weight", (n_head * hd, n_embd))


def _ffn(t: _Tensors, i: int, n_embd: int, n_ff: int) -> None:
    t.add(f"blk.{i}.ffn_norm.weight", (n_embd,), f32=True, value=1.0)
    t.add(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff))
    t.add(f"blk.{i}.ffn_up.weight", (n_embd, n_ff))
    t.add(f"blk.{i}.ffn_down.weight", (n_ff, n_embd))


def write_llama(path: Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                n_ctx: int = 8192, n_ff: int = 128, seed: int = 1) -> Path:
    """A GQA llama (src/models/llama.cpp): the demo's tiny model, sized as asked."""
    return write_tiny_llama(path, context_length=n_ctx, layers=n_layer, width=n_embd, heads=n_head,
                            kv_heads=n_head_kv, ffn=n_ff, seed=seed)


def write_gemma2(path: Path, *, n_layer: int = 4, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                 n_ctx: int = 8192, n_ff: int = 128, window: int = 64, seed: int = 2) -> Path:
    """A gemma2 with a small sliding window: even layers SWA (src/models/gemma2.cpp)."""
    w = _start(path, "gemma2", n_embd=n_embd, n_layer=n_layer, n_ctx=n_ctx, n_ff=n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    hd = n_embd // n_head
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(window)
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
    t = _Tensors(w, seed)
    _embd_and_output(t, n_embd)
    for i in range(n_layer):
        _attn(t, i, n_embd, n_head, n_head_kv, hd)
        t.add(f"blk.{i}.post_attention_norm.weight", (n_embd,), f32=True, value=1.0)
        _ffn(t, i, n_embd, n_ff)
        t.add(f"blk.{i}.post_ffw_norm.weight", (n_embd,), f32=True, value=1.0)
    _finish(w)
    return path


def write_deepseek2(path: Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_ctx: int = 8192,
                    n_ff: int = 128, kv_lora: int = 64, rope: int = 32, nope: int = 32, v_dim: int = 32,
                    seed: int = 3) -> Path:
    """A deepseek2 with MLA as the converter writes it (conversion/deepseek.py): head_count_kv 1,
    key_length = kv_lora + rope, value_length = kv_lora, *_mla = the decompressed head dims. All
    layers dense (leading_dense_block_count = n_layer) so no experts are needed."""
    w = _start(path, "deepseek2", n_embd=n_embd, n_layer=n_layer, n_ctx=n_ctx, n_ff=n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v_dim)
    w.add_kv_lora_rank(kv_lora)
    w.add_q_lora_rank(0)
    w.add_rope_dimension_count(rope)
    w.add_leading_dense_block_count(n_layer)
    w.add_expert_feed_forward_length(n_ff)
    w.add_expert_shared_count(0)
    t = _Tensors(w, seed)
    _embd_and_output(t, n_embd)
    for i in range(n_layer):
        t.add(f"blk.{i}.attn_norm.weight", (n_embd,), f32=True, value=1.0)
        t.add(f"blk.{i}.attn_kv_a_norm.weight", (kv_lora,), f32=True, value=1.0)
        t.add(f"blk.{i}.attn_q.weight", (n_embd, n_head * (nope + rope)))
        t.add(f"blk.{i}.attn_kv_a_mqa.weight", (n_embd, kv_lora + rope))
        t.add(f"blk.{i}.attn_k_b.weight", (nope, kv_lora, n_head))
        t.add(f"blk.{i}.attn_v_b.weight", (kv_lora, v_dim, n_head))
        t.add(f"blk.{i}.attn_output.weight", (n_head * v_dim, n_embd))
        _ffn(t, i, n_embd, n_ff)
    _finish(w)
    return path


def write_mamba2(path: Path, *, n_layer: int = 3, n_embd: int = 64, n_ctx: int = 8192, d_conv: int = 4,
                 d_inner: int = 128, d_state: int = 16, n_group: int = 2, head_dim: int = 16, seed: int = 4) -> Path:
    """A pure mamba2 (src/models/mamba2.cpp): recurrent state only."""
    w = _start(path, "mamba2", n_embd=n_embd, n_layer=n_layer, n_ctx=n_ctx, n_ff=0)
    dt_rank = d_inner // head_dim  # the number of SSM heads
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_ssm_group_count(n_group)
    t = _Tensors(w, seed)
    _embd_and_output(t, n_embd)
    conv_dim = d_inner + 2 * n_group * d_state
    for i in range(n_layer):
        t.add(f"blk.{i}.attn_norm.weight", (n_embd,), f32=True, value=1.0)
        t.add(f"blk.{i}.ssm_in.weight", (n_embd, d_inner + conv_dim + dt_rank))
        t.add(f"blk.{i}.ssm_conv1d.weight", (d_conv, conv_dim), f32=True)
        t.add(f"blk.{i}.ssm_conv1d.bias", (conv_dim,), f32=True)
        t.add(f"blk.{i}.ssm_dt.bias", (dt_rank,), f32=True)
        t.add(f"blk.{i}.ssm_a", (1, dt_rank), f32=True, value=-1.0)
        t.add(f"blk.{i}.ssm_d", (1, dt_rank), f32=True, value=1.0)
        t.add(f"blk.{i}.ssm_norm.weight", (d_inner // n_group, n_group), f32=True, value=1.0)
        t.add(f"blk.{i}.ssm_out.weight", (d_inner, n_embd))
    _finish(w)
    return path


def write_granitehybrid(path: Path, *, kv_heads: tuple[int, ...] = (0, 2, 0, 0, 2, 0), n_embd: int = 64,
                        n_head: int = 4, n_ctx: int = 8192, n_ff: int = 128, d_conv: int = 4, d_state: int = 16,
                        n_group: int = 1, ssm_heads: int = 8, seed: int = 5) -> Path:
    """A hybrid: Mamba-2 layers where head_count_kv is 0, attention layers elsewhere
    (src/models/granite-hybrid.cpp; d_inner must be 2 x n_embd)."""
    n_layer = len(kv_heads)
    d_inner = 2 * n_embd
    w = _start(path, "granitehybrid", n_embd=n_embd, n_layer=n_layer, n_ctx=n_ctx, n_ff=n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(list(kv_heads))
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(ssm_heads)
    w.add_ssm_group_count(n_group)
    hd = n_embd // n_head
    w.add_rope_dimension_count(hd)
    t = _Tensors(w, seed)
    _embd_and_output(t, n_embd)
    conv_dim = d_inner + 2 * n_group * d_state
    for i, kvh in enumerate(kv_heads):
        if kvh == 0:
            t.add(f"blk.{i}.attn_norm.weight", (n_embd,), f32=True, value=1.0)
            t.add(f"blk.{i}.ssm_in.weight", (n_embd, 2 * d_inner + 2 * n_group * d_state + ssm_heads))
            t.add(f"blk.{i}.ssm_conv1d.weight", (d_conv, conv_dim), f32=True)
            t.add(f"blk.{i}.ssm_conv1d.bias", (conv_dim,), f32=True)
            t.add(f"blk.{i}.ssm_dt.bias", (ssm_heads,), f32=True)
            t.add(f"blk.{i}.ssm_a", (1, ssm_heads), f32=True, value=-1.0)
            t.add(f"blk.{i}.ssm_d", (1, ssm_heads), f32=True, value=1.0)
            t.add(f"blk.{i}.ssm_norm.weight", (d_inner // n_group, n_group), f32=True, value=1.0)
            t.add(f"blk.{i}.ssm_out.weight", (d_inner, n_embd))
        else:
            _attn(t, i, n_embd, n_head, kvh, hd)
        _ffn(t, i, n_embd, n_ff)
    _finish(w)
    return path


def write_gemma3(path: Path, *, n_layer: int = 6, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                 n_ctx: int = 8192, n_ff: int = 128, window: int = 64, pattern: int | list[bool] | None = None,
                 seed: int = 6) -> Path:
    """A gemma3 (src/models/gemma3.cpp): SWA only with a window; period 6 unless
    `{arch}.attention.sliding_window_pattern` says otherwise (a period or a bool per layer)."""
    w = _start(path, "gemma3", n_embd=n_embd, n_layer=n_layer, n_ctx=n_ctx, n_ff=n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    hd = n_embd // n_head
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(window)
    if isinstance(pattern, int):
        w.add_uint32("gemma3.attention.sliding_window_pattern", pattern)
    elif pattern is not None:
        w.add_array("gemma3.attention.sliding_window_pattern", [bool(x) for x in pattern])
    t = _Tensors(w, seed)
    _embd_and_output(t, n_embd)
    for i in range(n_layer):
        _attn(t, i, n_embd, n_head, n_head_kv, hd)
        t.add(f"blk.{i}.attn_q_norm.weight", (hd,), f32=True, value=1.0)
        t.add(f"blk.{i}.attn_k_norm.weight", (hd,), f32=True, value=1.0)
        t.add(f"blk.{i}.post_attention_norm.weight", (n_embd,), f32=True, value=1.0)
        _ffn(t, i, n_embd, n_ff)
        t.add(f"blk.{i}.post_ffw_norm.weight", (n_embd,), f32=True, value=1.0)
    _finish(w)
    return path
