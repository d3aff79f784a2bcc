"""Hugging Face checkpoints: config.json -> ModelSpec, the HF-name -> parameter mapping, streaming
safetensors shards straight into (sharded) device arrays, and export back to an HF directory.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from spade_jax import mesh as mesh_lib
from spade_jax.models.decoder import Decoder
from spade_jax.models.spec import ARCHS, ModelSpec

_HF_ARCH_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_ROPE_KINDS = ("default", "linear", "llama3", "yarn")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
SHARD_BYTES = 2 * 1024**3  # export splits model.safetensors into files of about this size

# ---------------------------------------------------------------------------------------------
# config.json <-> ModelSpec


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
    from transformers import CONFIG_MAPPING  # noqa: PLC0415 (slow import, only needed here)

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
    from transformers import CONFIG_MAPPING  # noqa: PLC0415

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


# ---------------------------------------------------------------------------------------------
# The name-mapping table. Each rule maps one HF tensor (per layer) to one of our parameters, with
# `to_ours` (HF layout -> ours; views only, so memory-mapped tensors are not copied) and `to_hf`.

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
_LAYER_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
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
_EXPERT_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
    ("gate_proj.weight", ("mlp", "gate"), _t, _t),
    ("up_proj.weight", ("mlp", "up"), _t, _t),
    ("down_proj.weight", ("mlp", "down"), _t, _t),
)
# Fused expert tensors (transformers 5's in-memory layout, accepted on load too).
_FUSED_EXPERT_RULES: tuple[tuple[str, tuple[str, ...], _Fn], ...] = (
    ("mlp.experts.gate_up_proj", ("mlp", "gate"), lambda w, s: w[:, : w.shape[1] // 2].transpose(0, 2, 1)),
    ("mlp.experts.gate_up_proj", ("mlp", "up"), lambda w, s: w[:, w.shape[1] // 2 :].transpose(0, 2, 1)),
    ("mlp.experts.down_proj", ("mlp", "down"), lambda w, s: w.transpose(0, 2, 1)),
)
_TOP_RULES: tuple[tuple[str, tuple[str, ...], _Fn, _Fn], ...] = (
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
    for suffix, path, to_ours, _ in _TOP_RULES:
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
        for suffix, path, to_ours, _ in _EXPERT_RULES:
            if expert_suffix == suffix and j < spec.num_experts:
                return [(prefix + path, stack + (j,), lambda w, f=to_ours: f(w, spec))]
        return None
    fused = [
        (prefix + path, stack, lambda w, f=to_ours: f(w, spec))
        for suffix, path, to_ours in _FUSED_EXPERT_RULES
        if rest == suffix
    ]
    if fused:
        return fused
    for suffix, path, to_ours, _ in _LAYER_RULES:
        if rest == suffix:
            return [(prefix + path, stack, lambda w, f=to_ours: f(w, spec))]
    return None


# ---------------------------------------------------------------------------------------------
# Loading


def _abstract_decoder(spec, dtype, param_dtype, scan_layers) -> Decoder:
    return nnx.eval_shape(
        lambda: Decoder(
            spec, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0), scan_layers=scan_layers
        )
    )


def _path_key(path) -> tuple[Any, ...]:
    return tuple(int(p) if isinstance(p, str) and p.isdigit() else p for p in path)


class _Pending:
    """Pieces of one target parameter, assembled shard by shard when all have arrived."""

    def __init__(self, path: tuple[Any, ...], var: nnx.Variable):
        self.path, self.var = path, var
        self.pieces: dict[tuple[int, ...], np.ndarray] = {}

    def complete(self) -> bool:
        if () in self.pieces:
            return True
        if not self.pieces:
            return False
        depth = len(next(iter(self.pieces)))
        return len(self.pieces) == math.prod(self.var.shape[:depth])

    def build(self, sharding, np_dtype) -> jax.Array:
        shape = tuple(self.var.shape)
        depth = len(next(iter(self.pieces)))
        for key, piece in self.pieces.items():
            if tuple(piece.shape) != shape[depth:]:
                raise ValueError(
                    f"checkpoint tensor for {'/'.join(map(str, self.path))}{list(key) or ''} has shape "
                    f"{tuple(piece.shape)}, expected {shape[depth:]}: the config does not match the weights"
                )

        def fill(index):
            # Only this shard's rows are read from the (memory-mapped) pieces and copied.
            lead, rest = index[:depth], index[depth:]
            ranges = [range(*sl.indices(n)) for sl, n in zip(lead, shape[:depth])]
            rows = [np.asarray(self.pieces[combo][rest], dtype=np_dtype) for combo in itertools.product(*ranges)]
            lead_shape = tuple(len(r) for r in ranges)
            if not lead_shape:
                return rows[0]
            return np.stack(rows).reshape(lead_shape + rows[0].shape)

        return jax.make_array_from_callback(shape, sharding, fill)


def state_dict_items_to_model(
    items: Iterable[tuple[str, np.ndarray]],
    spec: ModelSpec,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    scan_layers: bool = False,
    strict: bool = True,
) -> Decoder:
    """Builds a Decoder from HF-named tensors, streamed: the shared mapping for safetensors and GGUF.

    `items` yields (HF name, array in HF layout, e.g. `model.layers.0.self_attn.q_proj.weight`
    [heads*head_dim, hidden]); arrays may be memory-mapped views. Each parameter goes to its
    sharding (from its logical axes, `rules` and `mesh`; the default device without a mesh) as soon
    as all its pieces have arrived, so at most one parameter's pieces wait on the host. Unknown
    names raise with `strict`; missing parameters always raise.
    """
    model = _abstract_decoder(spec, dtype, param_dtype, scan_layers)
    targets = {
        _path_key(path): var for path, var in nnx.iter_graph(model) if isinstance(var, nnx.Param)
    }
    np_dtype = np.dtype(jnp.dtype(param_dtype))
    default_sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    pending: dict[tuple[Any, ...], _Pending] = {}
    done: set[tuple[Any, ...]] = set()
    unknown: list[str] = []
    for name, array in items:
        found = hf_name_targets(name, spec, scan_layers=scan_layers)
        if found is None or any(path not in targets for path, _, _ in found):
            unknown.append(name)
            continue
        for path, stack, to_ours in found:
            if path in done:
                raise ValueError(f"checkpoint has two tensors for {'/'.join(map(str, path))} ({name})")
            if path not in pending:
                pending[path] = _Pending(path, targets[path])
            entry = pending[path]
            entry.pieces[stack] = to_ours(array)
            if entry.complete():
                var = entry.var
                if mesh is None:
                    sharding = default_sharding
                else:
                    sharding = mesh_lib.logical_sharding(
                        var.get_metadata()["logical_axes"], mesh, rules, tuple(var.shape)
                    )
                var.set_value(entry.build(sharding, np_dtype))
                del pending[path]
                done.add(path)
    if unknown and strict:
        raise ValueError(
            f"checkpoint has {len(unknown)} tensors this {spec.arch} spec has no place for, e.g. "
            f"{unknown[:3]}: the config does not match the weights"
        )
    missing = sorted("/".join(map(str, p)) for p in targets if p not in done)
    if missing:
        raise ValueError(
            f"checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}: the weights are "
            "incomplete or belong to another architecture"
        )
    return model


_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return header, 8 + size


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, memory-mapped array) for each tensor of a safetensors file, in storage order.

    Our own reader rather than `safetensors.safe_open(framework="numpy")`: that one cannot return
    bfloat16, the dtype most released checkpoints use.
    """
    path = Path(path)
    header, data_start = _safetensors_header(path)
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = data[data_start + begin : data_start + end]
        yield name, raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def safetensors_files(path: str | Path) -> list[Path]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in dict.fromkeys(weight_map.values())]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors files; export or download the weights first")
    return files


def load_hf(
    path: str | Path,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    scan_layers: bool = False,
) -> Decoder:
    """Decoder from an HF directory (config.json + safetensors), streamed onto `mesh`.

    The model is built abstractly, tensors are memory-mapped, and each device receives only its
    shard of each parameter: the host never holds a full copy of the model.
    """
    path = Path(path)
    spec = spec_from_hf_dir(path)
    items = itertools.chain.from_iterable(iter_safetensors(f) for f in safetensors_files(path))
    return state_dict_items_to_model(
        items, spec, mesh=mesh, rules=rules, dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers
    )


# ---------------------------------------------------------------------------------------------
# Export


def model_to_hf_items(model: Decoder) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(HF name, thunk returning the tensor in HF layout) for every parameter; thunks fetch lazily."""
    spec = model.spec

    def fetch(value, index=()):
        return lambda: np.asarray(jax.device_get(value[index] if index else value))

    yield "model.embed_tokens.weight", fetch(model.embed[...])
    for i in range(spec.num_layers):
        if model.scan_layers:
            block, index = model.layers, (i,)
        else:
            block, index = model.layers[i], ()
        for suffix, path, _, to_hf in _LAYER_RULES:
            # An MoE layer's `mlp` holds the router plus experts; a dense layer's the SwiGLU projections.
            if path[0] == "mlp" and spec.layer_is_moe(i) != (suffix == "mlp.gate.weight"):
                continue
            var = _get_path(block, path)
            if var is None:  # a bias or norm this spec does not have
                continue
            get = fetch(var[...], index)
            yield f"model.layers.{i}.{suffix}", (lambda g=get, f=to_hf: np.ascontiguousarray(f(g(), spec)))
        if spec.layer_is_moe(i):
            for j in range(spec.num_experts):
                for suffix, path, _, to_hf in _EXPERT_RULES:
                    get = fetch(_get_path(block, path)[...], index + (j,))
                    yield (
                        f"model.layers.{i}.mlp.experts.{j}.{suffix}",
                        (lambda g=get, f=to_hf: np.ascontiguousarray(f(g(), spec))),
                    )
    yield "model.norm.weight", fetch(model.final_norm.weight[...])
    if not spec.tie_embeddings:
        get = fetch(model.lm_head[...])
        yield "lm_head.weight", lambda g=get: np.ascontiguousarray(g().T)


def _get_path(module, path):
    node = module
    for part in path:
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _write_safetensors(path: Path, entries: list[tuple[str, tuple[int, ...], np.dtype, Callable]]):
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dt, _ in entries:
        nbytes = math.prod(shape) * dt.itemsize
        header[name] = {"dtype": _ST_NAMES[dt], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keeps tensor data 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape, dt, get in entries:
            array = np.ascontiguousarray(get(), dtype=dt)
            if array.shape != tuple(shape):
                raise AssertionError(f"{name}: produced {array.shape}, declared {shape}")
            f.write(array.tobytes())


def export_hf(
    model: Decoder,
    out_dir: str | Path,
    *,
    tokenizer=None,
    hf_config_extra: dict[str, Any] | None = None,
    dtype=None,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Writes config.json, safetensors (split past `shard_bytes`) and tokenizer files to `out_dir`.

    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` (and vLLM/SGLang) load the result.
    `tokenizer` is an object with `save_pretrained` or a directory whose tokenizer files are copied.
    `dtype` (default: the parameters' dtype) is the stored weight dtype.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = model.spec
    store = np.dtype(jnp.dtype(dtype or model.embed[...].dtype))
    # Shapes first (without fetching any weights) so files can be planned and headers written.
    entries = []
    for name, get in model_to_hf_items(model):
        shape = _hf_shape(name, spec)
        entries.append((name, shape, store, get))
    shards: list[list] = [[]]
    size = 0
    for entry in entries:
        nbytes = math.prod(entry[1]) * store.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    if len(shards) == 1:
        _write_safetensors(out / "model.safetensors", shards[0])
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            _write_safetensors(out / fname, shard)
            weight_map.update({name: fname for name, *_ in shard})
        total = sum(math.prod(e[1]) * store.itemsize for e in entries)
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    hf_config_from_spec(spec, hf_config_extra, dtype=store).save_pretrained(out)
    _add_legacy_config_keys(out / "config.json", spec, store)
    if tokenizer is not None:
        if hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(out)
        else:
            src = Path(tokenizer)
            for fname in TOKENIZER_FILES:
                if (src / fname).is_file() and src.resolve() != out.resolve():
                    shutil.copy(src / fname, out / fname)
    if not (out / "generation_config.json").is_file() and spec.eos_token_ids:
        gen = {"bos_token_id": spec.bos_token_id, "eos_token_id": list(spec.eos_token_ids)}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out


def _add_legacy_config_keys(config_file: Path, spec: ModelSpec, store: np.dtype):
    """Adds the pre-transformers-5 spellings (num_experts, rope_theta, rope_scaling, torch_dtype),
    which serving stacks pinned to transformers 4 (vLLM, SGLang) read; transformers 5 accepts both.
    """
    config = json.loads(config_file.read_text())
    config.setdefault("rope_theta", spec.rope_theta)
    scaling = spec.rope_scaling_dict
    config.setdefault("rope_scaling", scaling)
    config.setdefault("torch_dtype", "bfloat16" if store == ml_dtypes.bfloat16 else store.name)
    if spec.is_moe:
        config.setdefault("num_experts", spec.num_experts)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _hf_shape(name: str, spec: ModelSpec) -> tuple[int, ...]:
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
