"""Sharding constraints on the decoder's activations, by logical axis name (MaxText style).

The layers name logical axes (`activation_batch`, `activation_heads`, ...); ACTIVATION_RULES maps them
to mesh axes. A constraint applies only while the caller traces under `jax.set_mesh(mesh)` (see
`activation_mesh`): without a mesh, or on one device, `constrain` returns its input unchanged.
"""

from __future__ import annotations

import contextlib

import jax
from jax.sharding import NamedSharding

from spade_jax import mesh as mesh_lib

# Logical activation axis -> mesh axes. Rows go over the data-parallel axes (data, and fsdp whose
# parameters are gathered per layer), heads / MLP width / vocab over tensor (Megatron style), and the
# residual stream's width stays replicated over tensor (each tensor shard needs all of it).
ACTIVATION_RULES: dict[str, str | tuple[str, ...] | None] = {
    "activation_batch": ("data", "fsdp"),  # rows of the batch (and of the KV cache)
    "activation_lookup_batch": "data",  # rows of the embedding lookup, while the width is still fsdp-split
    "activation_length": None,  # sequence positions (no sequence parallelism)
    "activation_embed": None,  # residual-stream width
    "activation_heads": "tensor",  # query heads, and the flattened heads x head_dim before `o`
    "activation_kv_heads": "tensor",  # key / value heads
    "activation_head_dim": None,
    "activation_mlp": "tensor",  # SwiGLU width
    "activation_vocab": "tensor",  # logits
}

RULES = {**mesh_lib.LOGICAL_RULES, **ACTIVATION_RULES}

BTE = ("activation_batch", "activation_length", "activation_embed")  # the residual stream [B, T, E]


def constrain(x: jax.Array, axes, rules=None) -> jax.Array:
    """`x` with a sharding constraint from its logical `axes` on the mesh being traced under; `x` itself
    without one. Mesh axes that do not divide a dimension are dropped (a [1, N, E] packed prefill, 3 KV
    heads on tensor=2), so any shape is legal on any mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    spec = mesh_lib.logical_to_spec(axes, RULES if rules is None else rules, mesh=mesh, shape=x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def activation_mesh(mesh):
    """Context to trace (jit-lower) model code under so that `constrain` applies on `mesh`; a no-op for
    None. jit keys its cache on this context, so a function traced inside and outside is two entries."""
    if mesh is None:
        return contextlib.nullcontext()
    return jax.set_mesh(mesh)
