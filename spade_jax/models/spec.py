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
  qkv_bias: bool = False  # Qwen2: bias on q, k, v projections
  qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
  num_experts: int = 0  # Qwen3-MoE: routed experts per layer (0 = dense)
  experts_per_token: int = 0  # Qwen3-MoE: top-k
  moe_intermediate_size: int = 0  # Qwen3-MoE: expert SwiGLU width
  norm_topk_prob: bool = True  # Qwen3-MoE: renormalise the top-k router weights
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

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return dict(self.rope_scaling) if self.rope_scaling else None

  def replace(self, **changes) -> "ModelSpec":
    return dataclasses.replace(self, **changes)
