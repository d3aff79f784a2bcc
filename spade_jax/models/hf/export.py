"""Export to an HF directory that transformers, vLLM and SGLang load: config.json (with the spellings
transformers 4 reads), safetensors shards of a chosen dtype, and the tokenizer's files."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from spade_jax.models.decoder import Decoder
from spade_jax.models.hf.config import hf_config_from_spec
from spade_jax.models.hf.names import EXPERT_RULES, LAYER_RULES, hf_shape
from spade_jax.models.hf.safetensors_io import write_safetensors
from spade_jax.models.spec import ModelSpec

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
        for suffix, path, _, to_hf in LAYER_RULES:
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
                for suffix, path, _, to_hf in EXPERT_RULES:
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
        shape = hf_shape(name, spec)
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
        write_safetensors(out / "model.safetensors", shards[0])
    else:
        weight_map = {}
        for k, shard in enumerate(shards):
            fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(out / fname, shard)
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
