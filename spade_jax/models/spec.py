"""Architecture description shared by every model family (Llama, Qwen2, Qwen3, Qwen3-MoE).

A `ModelSpec` is pure data: the decoder reads it, loaders fill it from HF config.json or GGUF metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Any

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    arch: str  # one of ARCHS
    vocab_size: int  # rows of the token embedding
    hidden_size: int  # model width
    intermediate_size: int  # SwiGLU width of dense layers
    num_layers: int  # decoder blocks
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA when < num_heads)
    head_dim: int  # per-head width (Qwen3 sets it explicitly)
    rope_theta: float = 10000.0  # RoPE base
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # HF rope_scaling as sorted items
    rms_eps: float = 1e-6  # RMSNorm epsilon
    tie_embeddings: bool = False  # output projection shares the embedding
    qkv_bias: bool = False  # Qwen2 (and Llama/Qwen3 attention_bias): bias on q, k, v projections
    o_bias: bool = False  # Llama/Qwen3 attention_bias: bias on the output projection too
    mlp_bias: bool = False  # Llama mlp_bias: bias on gate, up and down projections
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    num_experts: int = 0  # Qwen3-MoE: routed experts per layer (0 = dense)
    experts_per_token: int = 0  # Qwen3-MoE: top-k
    moe_intermediate_size: int = 0  # Qwen3-MoE: expert SwiGLU width
    norm_topk_prob: bool = True  # Qwen3-MoE: renormalise the top-k router weights
    dense_layers: tuple[int, ...] = ()  # Qwen3-MoE: layers with a dense MLP (HF mlp_only_layers, sparse step)
    sliding_window: int | None = None  # keys older than this many slots are masked in sliding_layers
    sliding_layers: tuple[int, ...] = ()  # layers that use the sliding window (HF layer_types)
    max_position: int = 8192  # longest context the weights were trained for
    bos_token_id: int | None = None  # beginning-of-sequence id, if the tokenizer uses one
    eos_token_ids: tuple[int, ...] = ()  # ids that end a generation

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"model arch {self.arch!r} is not supported; choose one of {ARCHS}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.arch == "qwen3_moe" and not (self.num_experts and self.experts_per_token):
            raise ValueError("qwen3_moe needs num_experts and experts_per_token > 0")
        if self.is_moe and not (0 < self.experts_per_token <= self.num_experts):
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be in [1, num_experts={self.num_experts}]"
            )
        if self.is_moe and self.moe_intermediate_size <= 0:
            raise ValueError("an MoE spec needs moe_intermediate_size > 0")
        for name in ("dense_layers", "sliding_layers"):
            bad = [i for i in getattr(self, name) if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(f"{name} has layer indices {bad} outside [0, {self.num_layers})")
        if self.sliding_layers and not self.sliding_window:
            raise ValueError("sliding_layers needs a positive sliding_window")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, layer: int) -> bool:
        """Whether decoder block `layer` routes through experts (False for every layer of a dense model)."""
        return self.is_moe and layer not in self.dense_layers

    @property
    def uniform_layers(self) -> bool:
        """All blocks have the same parameter structure (needed to stack them for `scan_layers`)."""
        return not (self.is_moe and self.dense_layers)

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)
