"""Shared helpers for the RL tests: a tiny decoder with host-random weights (eager init is slow on CPU)."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.models.decoder import Decoder
from spade_jax.models.spec import ModelSpec

TINY = ModelSpec(arch="llama", vocab_size=48, hidden_size=16, intermediate_size=32, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=4)


def tiny_decoder(seed: int, spec: ModelSpec = TINY, std: float = 0.2, **kwargs) -> Decoder:
  """A Decoder whose params come from numpy (norm scales near 1), built without per-tensor compiles."""
  abstract = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0), **kwargs))
  graphdef, state = nnx.split(abstract)
  rng = np.random.default_rng(seed)
  pure = nnx.to_pure_dict(state)

  def fill(tree):
    out = {}
    for k, v in tree.items():
      if isinstance(v, dict):
        out[k] = fill(v)
      elif v.ndim == 1:
        out[k] = jnp.asarray(1.0 + 0.1 * rng.standard_normal(v.shape), v.dtype)
      else:
        out[k] = jnp.asarray(std * rng.standard_normal(v.shape), v.dtype)
    return out

  nnx.replace_by_pure_dict(state, fill(pure))
  return nnx.merge(graphdef, state)
