"""What the decoder's modules and the MoE block both build on: a parameter created with its logical
axes (`logical_axes` metadata), which `spade_jax.mesh` maps to mesh axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def param(rngs: nnx.Rngs, shape, axes, param_dtype, scale: float | None = None, init="normal") -> nnx.Param:
    """A parameter of `shape` named by logical `axes`: normal(0, scale or 0.02), ones or zeros."""
    if init == "ones":
        value = jnp.ones(shape, param_dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, param_dtype)
    else:
        std = 0.02 if scale is None else scale
        value = std * jax.random.normal(rngs.params(), shape, param_dtype)
    return nnx.Param(value, logical_axes=axes)
