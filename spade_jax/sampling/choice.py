"""Token choice inside a compiled loop: greedy, or temperature / top-k / top-p sampling by inverse
CDF, with the temperature-1 and sampled-distribution logprobs of each chosen token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from spade_jax.sampling.config import SamplingConfig

_SAMPLE_BLOCK = 128  # vocabulary block for two-level inverse-CDF sampling (no sort, no Gumbel noise)


def _first_max_index(x_bv):
    """argmax over the last axis via two plain reductions (XLA:CPU's variadic argmax is slower)."""
    iota = jnp.arange(x_bv.shape[-1], dtype=jnp.int32)
    top = jnp.max(x_bv, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x_bv == top, iota, x_bv.shape[-1]), axis=-1)


def _bisect_floor(probs_bv, enough, iters: int = 32):
    """Largest t in (0, max p] with enough(p >= t) true, by bisection over t (an XLA:CPU sort of the
    vocabulary costs ~200 ms at batch 16; 32 masked reductions cost a few ms).
    """
    lo = jnp.zeros(probs_bv.shape[:-1], probs_bv.dtype)
    hi = jnp.max(probs_bv, axis=-1) * (1 + 1e-6) + 1e-30

    def halve(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        ok = enough(probs_bv >= mid[:, None])
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iters, halve, (lo, hi))
    return lo


def _top_k_floor(probs_bv, top_k):
    """Probability of the k-th most likely token (ties at it are kept, as transformers' warper does)."""
    return _bisect_floor(probs_bv, lambda keep: jnp.sum(keep, axis=-1) >= top_k)


def _top_p_floor(probs_bv, top_p):
    """Smallest kept probability of the nucleus: the largest t with mass(p >= t) >= top_p, which is
    transformers' sorted-cumulative rule up to ties and float32 resolution.
    """
    return _bisect_floor(
        probs_bv, lambda keep: jnp.sum(jnp.where(keep, probs_bv, 0.0), axis=-1) >= top_p * (1 - 1e-6)
    )


def _inverse_cdf(weights_bv, uniform_b):
    """Index drawn with probability proportional to `weights_bv`, via block sums then one block's
    prefix sums: O(V) work without a sort or V random numbers (both are slow on XLA:CPU).
    """
    b, v = weights_bv.shape
    blocks = -(-v // _SAMPLE_BLOCK)
    w = jnp.pad(weights_bv, ((0, 0), (0, blocks * _SAMPLE_BLOCK - v))).reshape(b, blocks, _SAMPLE_BLOCK)
    block_cum = jnp.cumsum(w.sum(-1), axis=-1)  # [B, blocks]
    target = uniform_b * block_cum[:, -1]
    block = jnp.minimum(jnp.sum(block_cum <= target[:, None], axis=-1), blocks - 1)
    before = jnp.where(
        block > 0, jnp.take_along_axis(block_cum, jnp.maximum(block - 1, 0)[:, None], 1)[:, 0], 0.0
    )
    inner = jnp.take_along_axis(w, block[:, None, None], 1)[:, 0]  # [B, block]
    inner_cum = jnp.cumsum(inner, axis=-1) + before[:, None]
    # Zero-weight entries never win: step past positions whose cumulative sum does not exceed target.
    within = jnp.minimum(jnp.sum(inner_cum <= target[:, None], axis=-1), _SAMPLE_BLOCK - 1)
    index = block * _SAMPLE_BLOCK + within
    # Float rounding at the very end can land on padding; fall back to the last real token with weight.
    return jnp.minimum(index, v - 1)


@dataclasses.dataclass(frozen=True)
class SamplingMode:
    """The compile-time part of a sampling config; the numbers themselves are traced arguments."""

    greedy: bool
    top_k: bool  # filter by top_k
    top_p: bool  # filter by top_p

    @classmethod
    def of(cls, config: SamplingConfig) -> "SamplingMode":
        return cls(config.greedy, config.top_k > 0 and not config.greedy,
                   config.top_p < 1.0 and not config.greedy)


def sampling_knobs(config: SamplingConfig):
    """Traced sampling numbers: changing them never recompiles."""
    return (jnp.float32(max(config.temperature, 1e-6)), jnp.int32(config.top_k),
            jnp.float32(config.top_p))


def choose(logits_bv, key, step, row_ids, mode: SamplingMode, knobs):
    """Next token per row, its temperature-1 logprob, and its logprob under the sampled distribution."""
    temperature, top_k, top_p = knobs
    logp = jax.nn.log_softmax(logits_bv, axis=-1)
    if mode.greedy:
        token = _first_max_index(logits_bv)
        return token, jnp.take_along_axis(logp, token[:, None], 1)[:, 0], jnp.zeros_like(logp[:, 0])
    scaled = logits_bv / temperature
    weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
    if mode.top_k or mode.top_p:
        probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
        if mode.top_k:  # transformers' order: temperature, then top-k, then top-p on the renormalised rest
            probs = jnp.where(probs >= _top_k_floor(probs, top_k)[:, None], probs, 0.0)
            probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        if mode.top_p:
            probs = jnp.where(probs >= _top_p_floor(probs, top_p)[:, None], probs, 0.0)
        weights = jnp.where(probs > 0, weights, 0.0)
    # One uniform per row from (key, row, step): a row's draw does not depend on its batch neighbours.
    step_key = jax.random.fold_in(key, step)
    uniform = jax.vmap(lambda r: jax.random.uniform(jax.random.fold_in(step_key, r)))(row_ids)
    token = _inverse_cdf(weights, uniform)
    chosen = jnp.take_along_axis(weights, token[:, None], 1)[:, 0]
    sampling_logp = jnp.log(chosen) - jnp.log(jnp.sum(weights, axis=-1))
    return token, jnp.take_along_axis(logp, token[:, None], 1)[:, 0], sampling_logp
