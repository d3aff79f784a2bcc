"""HF config.json <-> ModelSpec for the supported families (llama, qwen2, qwen3, qwen3_moe), with
transformers' own config classes supplying the defaults a config.json leaves out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from spade_jax.models.spec import ARCHS, ModelSpec

_HF_ARCH_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_ROPE_KINDS = ("default", "linear", "llama3", "yarn")


def spec_from_hf_config(config: dict[str, Any]) -> ModelSpec:
    """ModelSpec from a parsed HF config.json (llama, qwen2, qwen3, qwen3_moe).

    Defaults come from transformers' own config class, so a config.json that omits fields means
    what transformers would make of it.
    """
    model_type = config.get("model_type")
    if model_type not in ARCHS:
        raise ValueError(
            f"HF model_type {model_type!r} is not supported; supported families: {', '.join(ARCHS)}"
        )
    from transformers import CONFIG_MAPPING  # slow import, only needed here

    cfg = CONFIG_MAPPING[model_type].from_dict(dict(config))
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; these families use silu (SwiGLU)")
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    if any(isinstance(v, dict) for v in rope.values()):
        raise ValueError("per-layer-type rope_parameters are not supported for these families")
    rope_theta = float(rope.pop("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in _ROPE_KINDS:
        raise ValueError(f"rope type {kind!r} is not supported; supported: {', '.join(_ROPE_KINDS)}")
    if float(rope.pop("partial_rotary_factor", None) or 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported for these families")
    rope.pop("type", None)
    rope["rope_type"] = kind
    rope_scaling = None if kind == "default" else tuple(sorted(rope.items()))
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    num_layers = cfg.num_hidden_layers
    sliding_window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if model_type == "llama" or sliding_window is None:
        sliding_layers: tuple[int, ...] = ()
    elif layer_types:
        sliding_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    else:  # Qwen3-MoE applies the window to every layer when it is set
        sliding_layers = tuple(range(num_layers))
    moe: dict[str, Any] = {}
    if model_type == "qwen3_moe":
        sparse_step = max(int(getattr(cfg, "decoder_sparse_step", 1) or 1), 1)
        mlp_only = set(getattr(cfg, "mlp_only_layers", None) or ())
        moe = dict(
            num_experts=int(cfg.num_experts),
            experts_per_token=int(cfg.num_experts_per_tok),
            moe_intermediate_size=int(cfg.moe_intermediate_size),
            norm_topk_prob=bool(cfg.norm_topk_prob),
            dense_layers=tuple(
                i for i in range(num_layers) if i in mlp_only or (i + 1) % sparse_step != 0
            ),
        )
    eos = getattr(cfg, "eos_token_id", None)
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    return ModelSpec(
        arch=model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_eps=float(cfg.rms_norm_eps),
        tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)) if model_type == "llama" else False,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        sliding_window=sliding_window if sliding_layers else None,
        sliding_layers=sliding_layers,
        max_position=int(getattr(cfg, "max_position_embeddings", 8192) or 8192),
        bos_token_id=getattr(cfg, "bos_token_id", None),
        eos_token_ids=eos_ids,
        **moe,
    )


def hf_config_from_spec(spec: ModelSpec, extra: dict[str, Any] | None = None, dtype=jnp.float32):
    """A transformers config object for `spec` (what `export_hf` writes as config.json)."""
    from transformers import CONFIG_MAPPING

    rope = {"rope_type": "default", **(spec.rope_scaling_dict or {}), "rope_theta": spec.rope_theta}
    eos = list(spec.eos_token_ids)
    kw: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        hidden_act="silu",
        max_position_embeddings=spec.max_position,
        rms_norm_eps=spec.rms_eps,
        tie_word_embeddings=spec.tie_embeddings,
        rope_parameters=rope,
        bos_token_id=spec.bos_token_id,
        eos_token_id=(eos[0] if len(eos) == 1 else eos) if eos else None,
    )
    if spec.arch == "qwen2":
        if not spec.qkv_bias or spec.o_bias:
            raise ValueError("a qwen2 export needs qkv_bias=True and o_bias=False (Qwen2's fixed layout)")
    elif spec.qkv_bias != spec.o_bias:
        raise ValueError(f"{spec.arch} has one attention_bias flag: qkv_bias and o_bias must agree")
    else:
        kw["attention_bias"] = spec.qkv_bias
    if spec.mlp_bias:
        if spec.arch != "llama":
            raise ValueError("mlp_bias is only expressible in a llama config")
        kw["mlp_bias"] = True
    if spec.sliding_layers:
        if spec.arch == "llama":
            raise ValueError("llama configs have no sliding window")
        kw.update(use_sliding_window=True, sliding_window=spec.sliding_window)
        if spec.arch != "qwen3_moe":
            kw["layer_types"] = [
                "sliding_attention" if i in spec.sliding_layers else "full_attention"
                for i in range(spec.num_layers)
            ]
        elif len(spec.sliding_layers) != spec.num_layers:
            raise ValueError("qwen3_moe applies a sliding window to all layers or none")
    if spec.is_moe:
        kw.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.experts_per_token,
            moe_intermediate_size=spec.moe_intermediate_size,
            norm_topk_prob=spec.norm_topk_prob,
            mlp_only_layers=list(spec.dense_layers),
            decoder_sparse_step=1,
        )
    kw.update(extra or {})
    cfg = CONFIG_MAPPING[spec.arch](**kw)
    cfg.architectures = [_HF_ARCH_CLASS[spec.arch]]
    cfg.dtype = jnp.dtype(dtype).name
    return cfg


def read_hf_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not an HF model directory: config.json is missing")
    return json.loads(config_file.read_text())


def spec_from_hf_dir(path: str | Path) -> ModelSpec:
    """ModelSpec from a directory's config.json; generation_config.json's eos ids win when present."""
    path = Path(path)
    spec = spec_from_hf_config(read_hf_config(path))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        if eos is not None:
            ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
            spec = spec.replace(eos_token_ids=tuple(dict.fromkeys(spec.eos_token_ids + ids)))
    return spec
