"""A tiny llama model as a GGUF file, for the demo fleet and the tests.

2 layers, width 64, 4 heads, 2 KV heads, a 260-token SentencePiece vocabulary (3 control
tokens, 256 byte tokens, one word piece), random f16 weights and a chat template: llama.cpp's
`llama-server` loads it in a few milliseconds and answers (nonsense) at once."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


VOCAB = 260


def add_vocab(w) -> None:
    """The 260-token SentencePiece vocabulary and the chat template, into a GGUFWriter."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([int(t) for t in types])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_tiny_llama(
    path: str | Path,
    *,
    context_length: int = 4096,
    layers: int = 2,
    width: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    seed: int = 0,
    name: str = "tiny-llama",
) -> Path:
    """Write the model to path (parents created) and return the path."""
    import gguf
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    head_dim = width // heads

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(width)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(VOCAB)
    add_vocab(w)

    def f16(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    # numpy shapes are (rows, cols) = ggml's (ne1, ne0): out_features first.
    w.add_tensor("token_embd.weight", f16(VOCAB, width))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(width))
        w.add_tensor(f"blk.{i}.attn_q.weight", f16(heads * head_dim, width))
        w.add_tensor(f"blk.{i}.attn_k.weight", f16(kv_heads * head_dim, width))
        w.add_tensor(f"blk.{i}.attn_v.weight", f16(kv_heads * head_dim, width))
        w.add_tensor(f"blk.{i}.attn_output.weight", f16(width, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones(width))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", f16(ffn, width))
        w.add_tensor(f"blk.{i}.ffn_up.weight", f16(ffn, width))
        w.add_tensor(f"blk.{i}.ffn_down.weight", f16(width, ffn))
    w.add_tensor("output_norm.weight", ones(width))
    w.add_tensor("output.weight", f16(VOCAB, width))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
