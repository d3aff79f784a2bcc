"""The HF-name <-> parameter mapping table: where each HF tensor goes in our Decoder, the layout change
each way (views only on load), and the HF shape of every exported tensor."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from spade_jax.models.spec import ModelSpec

# Each rule maps one HF tensor (per layer) to one of our parameters, with `to_ours` (HF layout -> ours;
# views only, so memory-mapped tensors are not copied) and `to_hf`.

_Fn = Callable[[np.ndarray, ModelSpec], np.ndarray]


def _q_in(w, s):  # [H*D, E] -> [E, H, D]
    return w.reshape(s.num_heads, s.head_dim, -1).transpose(2, 0, 1)


def _kv_in(w, s):  # [KVH*D, E] -> [E, KVH, D]
    return w.reshape(s.num_kv_heads, s.head_dim, -1).transpose(2, 0, 1)


def _heads_out(p, s):  # [E, H, D] -> [H*D, E]
    return p.transpose(1, 2, 0).reshape(-1, p.shape[0])


def _o_in(w, s):  # [E, H*D] -> [H, D, E]
    return w.reshape(-1, s.num_heads, s.head_dim).transpose(1, 2, 0)


def _o_out(p, s):  # [H, D, E] -> [E, H*D]
    return p.transpose(2, 0, 1).reshape(p.shape[2], -1)


def _bias_in(n_heads_attr):
    return lambda b, s: b.reshape(getattr(s, n_heads_attr), s.head_dim)


def _flat(p, s):
    return p.reshape(-1)


def _same(x, s):
    return x


def _t(x, s):
    return x.T


# (HF suffix inside a layer, our path inside a Block, to_ours, to_hf)
LAYER_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
    ("input_layernorm.weight", ("attn_norm", "weight"), _same, _same),
    ("post_attention_layernorm.weight", ("mlp_norm", "weight"), _same, _same),
    ("self_attn.q_proj.weight", ("attn", "q"), _q_in, _heads_out),
    ("self_attn.k_proj.weight", ("attn", "k"), _kv_in, _heads_out),
    ("self_attn.v_proj.weight", ("attn", "v"), _kv_in, _heads_out),
    ("self_attn.o_proj.weight", ("attn", "o"), _o_in, _o_out),
    ("self_attn.q_proj.bias", ("attn", "q_bias"), _bias_in("num_heads"), _flat),
    ("self_attn.k_proj.bias", ("attn", "k_bias"), _bias_in("num_kv_heads"), _flat),
    ("self_attn.v_proj.bias", ("attn", "v_bias"), _bias_in("num_kv_heads"), _flat),
    ("self_attn.o_proj.bias", ("attn", "o_bias"), _same, _same),
    ("self_attn.q_norm.weight", ("attn", "q_norm", "weight"), _same, _same),
    ("self_attn.k_norm.weight", ("attn", "k_norm", "weight"), _same, _same),
    ("mlp.gate_proj.weight", ("mlp", "gate"), _t, _t),
    ("mlp.up_proj.weight", ("mlp", "up"), _t, _t),
    ("mlp.down_proj.weight", ("mlp", "down"), _t, _t),
    ("mlp.gate_proj.bias", ("mlp", "gate_bias"), _same, _same),
    ("mlp.up_proj.bias", ("mlp", "up_bias"), _same, _same),
    ("mlp.down_proj.bias", ("mlp", "down_bias"), _same, _same),
    ("mlp.gate.weight", ("mlp", "router"), _t, _t),
)
# Per-expert tensors (how transformers 5 saves Qwen3-MoE, and what vLLM/SGLang read).
EXPERT_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
    ("gate_proj.weight", ("mlp", "gate"), _t, _t),
    ("up_proj.weight", ("mlp", "up"), _t, _t),
    ("down_proj.weight", ("mlp", "down"), _t, _t),
)
# Fused expert tensors (transformers 5's in-memory layout, accepted on load too).
FUSED_EXPERT_RULES: tuple[tuple[str, tuple[str, ...], _Fn], ...] = (
    ("mlp.experts.gate_up_proj", ("mlp", "gate"), lambda w, s: w[:, : w.shape[1] // 2].transpose(0, 2, 1)),
    ("mlp.experts.gate_up_proj", ("mlp", "up"), lambda w, s: w[:, w.shape[1] // 2 :].transpose(0, 2, 1)),
    ("mlp.experts.down_proj", ("mlp", "down"), lambda w, s: w.transpose(0, 2, 1)),
)
TOP_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
    ("embed_tokens.weight", ("embed",), _same, _same),
    ("norm.weight", ("final_norm", "weight"), _same, _same),
)
_LAYER_RE = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(.+)$")
_IGNORED_RE = re.compile(r"(rotary_emb\.inv_freq|\.rotary_emb\.)")

Target = tuple[tuple[Any, ...], tuple[int, ...], Callable[[np.ndarray], np.ndarray]]


def hf_name_targets(name: str, spec: ModelSpec, *, scan_layers: bool = False) -> list[Target] | None:
    """Where HF tensor `name` goes: [(our param path, stack index, to_ours)], [] to skip, None if unknown.

    The stack index addresses leading stacked dims of the target: (layer,) under scan_layers,
    (expert,) for per-expert tensors, both when both apply.
    """
    if _IGNORED_RE.search(name):
        return []
    if name == "lm_head.weight":
        return [] if spec.tie_embeddings else [(("lm_head",), (), lambda w: w.T)]
    short = name.removeprefix("model.")
    for suffix, path, to_ours, _ in TOP_RULES:
        if short == suffix:
            return [(path, (), lambda w, f=to_ours: f(w, spec))]
    match = _LAYER_RE.match(name)
    if not match:
        return None
    layer, rest = int(match.group(1)), match.group(2)
    if layer >= spec.num_layers:
        return None
    prefix, stack = (("layers",), (layer,)) if scan_layers else (("layers", layer), ())
    expert = _EXPERT_RE.match(rest)
    if expert:
        j, expert_suffix = int(expert.group(1)), expert.group(2)
        for suffix, path, to_ours, _ in EXPERT_RULES:
            if expert_suffix == suffix and j < spec.num_experts:
                return [(prefix + path, stack + (j,), lambda w, f=to_ours: f(w, spec))]
        return None
    fused = [
        (prefix + path, stack, lambda w, f=to_ours: f(w, spec))
        for suffix, path, to_ours in FUSED_EXPERT_RULES
        if rest == suffix
    ]
    if fused:
        return fused
    for suffix, path, to_ours, _ in LAYER_RULES:
        if rest == suffix:
            return [(prefix + path, stack, lambda w, f=to_ours: f(w, spec))]
    return None


def hf_shape(name: str, spec: ModelSpec) -> tuple[int, ...]:
    e, h, kvh, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
    i, mi, x, v = spec.intermediate_size, spec.moe_intermediate_size, spec.num_experts, spec.vocab_size
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (v, e)
    if name == "model.norm.weight":
        return (e,)
    rest = _LAYER_RE.match(name).group(2)
    expert = _EXPERT_RE.match(rest)
    if expert:
        return {"gate_proj.weight": (mi, e), "up_proj.weight": (mi, e), "down_proj.weight": (e, mi)}[
            expert.group(2)
        ]
    return {
        "input_layernorm.weight": (e,),
        "post_attention_layernorm.weight": (e,),
        "self_attn.q_proj.weight": (h * d, e),
        "self_attn.k_proj.weight": (kvh * d, e),
        "self_attn.v_proj.weight": (kvh * d, e),
        "self_attn.o_proj.weight": (e, h * d),
        "self_attn.q_proj.bias": (h * d,),
        "self_attn.k_proj.bias": (kvh * d,),
        "self_attn.v_proj.bias": (kvh * d,),
        "self_attn.o_proj.bias": (e,),
        "self_attn.q_norm.weight": (d,),
        "self_attn.k_norm.weight": (d,),
        "mlp.gate_proj.weight": (i, e),
        "mlp.up_proj.weight": (i, e),
        "mlp.down_proj.weight": (e, i),
        "mlp.gate_proj.bias": (i,),
        "mlp.up_proj.bias": (i,),
        "mlp.down_proj.bias": (e,),
        "mlp.gate.weight": (x, e),
    }[rest]
