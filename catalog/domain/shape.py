"""A model's shape: what sizes its context. Pure data, read from a GGUF header
(catalog.domain.gguf + shape_from_gguf) or a Hugging Face config (catalog.domain.hf),
and turned into bytes per engine by catalog.domain.kv."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class Shape:
    architecture: str
    layers: int  # decoder layers that serve the main context (MTP / nextn layers excluded)
    heads: int
    kv_heads: int  # the largest per-layer KV head count (for display and tp splitting); 0 = none
    trained_context: int  # tokens the model was trained for (rope-scaling aware); 0 = unknown
    head_k: int  # K width per head of full-attention layers (llama.cpp: key_length; MLA: latent + rope)
    head_v: int  # V width per head (MLA: 0 — the latent is stored once, as K)
    # Per-layer facts, len == layers. kv_heads_per_layer[i] == 0 means the layer has no KV cache.
    kv_heads_per_layer: tuple[int, ...] = ()
    swa_layers: tuple[bool, ...] = ()  # True where the layer attends to a sliding window only
    recurrent_layers: tuple[bool, ...] = ()  # True where the layer keeps a recurrent state
    sliding_window: int = 0  # tokens; 0 = no sliding window
    head_k_swa: int = 0  # K/V widths on SWA layers when they differ (0 = same as full)
    head_v_swa: int = 0
    mla: bool = False
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    # Recurrent state per recurrent layer, in F32 elements per sequence (llama.cpp's n_embd_r, n_embd_s).
    state_r: int = 0
    state_s: int = 0
    dtype_bytes: int = 2  # the weights' dtype: vLLM's and SGLang's KV dtype when "auto"
    weights_bytes: int = 0  # sum of the weights' files; 0 = unknown
    source_kind: str = ""  # "gguf" or "hf"
    rope_scaling: str = ""  # e.g. "yarn x4 from 32768" — shown to the admin
    extra: dict = field(default_factory=dict, compare=False)  # anything else worth showing

    @property
    def kv_per_token(self) -> int:
        """Bytes per token of the full-attention layers at f16/bf16 — the seed's figure."""
        total = 0
        for i in range(self.layers):
            if self.is_full_attention(i):
                kvh = self.kv_heads_at(i)
                total += (self.head_k * kvh + self.head_v * kvh) * 2
        return total

    def kv_heads_at(self, i: int) -> int:
        return self.kv_heads_per_layer[i] if self.kv_heads_per_layer else self.kv_heads

    def is_swa(self, i: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[i] and self.sliding_window > 0

    def is_recurrent(self, i: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[i]

    def has_kv(self, i: int) -> bool:
        return self.kv_heads_at(i) > 0

    def is_full_attention(self, i: int) -> bool:
        return self.has_kv(i) and not self.is_swa(i)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("kv_heads_per_layer", "swa_layers", "recurrent_layers"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Shape:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        for k in ("kv_heads_per_layer", "swa_layers", "recurrent_layers"):
            if k in kwargs:
                kwargs[k] = tuple(kwargs[k])
        return cls(**kwargs)
