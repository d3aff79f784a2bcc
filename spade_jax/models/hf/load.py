"""Loading HF-named tensors into a Decoder, streamed: each parameter goes to its shard as soon as its
pieces have arrived, so the host never holds the whole model (safetensors directories and GGUF)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax import mesh as mesh_lib
from spade_jax.models.decoder import Decoder
from spade_jax.models.hf.config import spec_from_hf_dir
from spade_jax.models.hf.names import hf_name_targets
from spade_jax.models.hf.safetensors_io import iter_safetensors, safetensors_files
from spade_jax.models.spec import ModelSpec


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
