"""Token choice (spade_jax.sampling.choice): the top-k/top-p support against transformers' logits
warpers, and inverse-CDF draws against softmax frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from spade_jax.sampling import SamplingConfig, SamplingMode, choose, sampling_knobs


def _draws(logits, cfg, steps):
    """Tokens drawn at `steps` sampling steps for each row of `logits` (one compiled call)."""
    mode, knobs = SamplingMode.of(cfg), sampling_knobs(cfg)
    rows = jnp.arange(logits.shape[0])
    fn = jax.jit(jax.vmap(lambda s: choose(logits, jax.random.key(11), s, rows, mode, knobs)[0]))
    return np.asarray(fn(jnp.arange(steps)))  # [steps, rows]


def test_top_k_top_p_support_matches_transformers_warpers():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 1000)).astype(np.float32) * 3
    for top_k, top_p in [(0, 0.9), (20, 1.0), (40, 0.5), (0, 0.3)]:
        warped = torch.tensor(logits)
        if top_k:
            warped = transformers.TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1:
            warped = transformers.TopPLogitsWarper(top_p)(None, warped)
        allowed = np.isfinite(warped.numpy())
        draws = _draws(jnp.asarray(logits), SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p), 400)
        seen = np.zeros_like(allowed)
        seen[np.arange(6)[None, :].repeat(400, 0), draws] = True
        assert not (seen & ~allowed).any(), (top_k, top_p)
        probs = torch.softmax(warped, -1).numpy()
        assert seen[probs > 0.05].all()  # the frequent allowed tokens show up


def test_inverse_cdf_sampling_matches_softmax_frequencies():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05] + [0.0] * 300]) + 1e-30)
    draws = _draws(logits, SamplingConfig(temperature=1.0), 4000)[:, 0]
    freq = np.bincount(draws, minlength=4)[:4] / 4000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)
