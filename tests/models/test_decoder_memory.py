"""Chunked attention and per-block remat change memory, never results: values and gradients match."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spade_jax.models.decoder import Decoder
from spade_jax.models.presets import get_preset


@pytest.mark.parametrize("scan_layers", [False, True])
def test_chunked_remat_decoder_matches_plain_values_and_gradients(scan_layers):
    spec = get_preset("tiny")
    plain = Decoder(spec, rngs=nnx.Rngs(0), scan_layers=scan_layers, attn_chunk=None)
    lean = Decoder(spec, rngs=nnx.Rngs(0), scan_layers=scan_layers, attn_chunk=5, remat=True)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, spec.vocab_size, (2, 23)))
    positions = jnp.broadcast_to(jnp.arange(23), (2, 23))
    valid = jnp.ones((2, 23), bool).at[0, :4].set(False)

    def loss(model):
        return jnp.sum(model(tokens, positions, valid)[0] ** 2) * 1e-3

    value_plain, grads_plain = nnx.value_and_grad(loss)(plain)
    value_lean, grads_lean = nnx.value_and_grad(loss)(lean)
    np.testing.assert_allclose(value_lean, value_plain, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(nnx.state(grads_plain)), jax.tree.leaves(nnx.state(grads_lean))):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_attn_chunk_must_be_positive():
    with pytest.raises(ValueError, match="attn_chunk"):
        Decoder(get_preset("tiny"), rngs=nnx.Rngs(0), attn_chunk=0)
