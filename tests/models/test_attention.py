"""The attention implementations (`model.attention`): each against a numpy reference and against the einsum
path, with causal masks, left padding, GQA, a sliding window and decoding over a KV cache; then whole models
against transformers."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spade_jax.config import ConfigError, ModelConfig
from spade_jax.models.attention import ATTENTION, AttnMask, attend, check_attention
from spade_jax.models.presets import get_preset, init_decoder

TOL = 2e-5


def numpy_attention(q_bthd, k_bskd, v_bskd, mask_bts):
    """Plain softmax attention in float64; GQA by repeating each KV head over its group of query heads.
    Rows with no visible key return zeros (the caller never compares them)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q_bthd, k_bskd, v_bskd))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(mask_bts[:, None], scores, -np.inf)
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top)
    weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhts,bshd->bthd", weights, v)


def _inputs(b, t, s, heads, kv_heads, d, seed=0):
    rng = np.random.default_rng(seed)
    shapes = ((b, t, heads, d), (b, s, kv_heads, d), (b, s, kv_heads, d))
    return tuple(rng.normal(size=shape).astype(np.float32) for shape in shapes)


def _ours(impl, q_bthd, k_bskd, v_bskd, mask: AttnMask, chunk=None):
    b, t, h, d = q_bthd.shape
    kvh = k_bskd.shape[2]
    q = jnp.asarray(q_bthd).reshape(b, t, kvh, h // kvh, d)
    k = jnp.asarray(k_bskd).transpose(0, 2, 3, 1)  # the cache layouts
    v = jnp.asarray(v_bskd).transpose(0, 2, 1, 3)
    out = jax.jit(attend, static_argnums=(0, 5))(impl, q, k, v, mask, chunk)
    return np.asarray(out).reshape(b, t, h, d)


def _left_padded_valid(b, t):
    valid = np.ones((b, t), bool)
    for i in range(b):
        valid[i, : 3 * i] = False
    return valid


@pytest.mark.parametrize("impl", ATTENTION)
@pytest.mark.parametrize("window", [None, 5])
def test_self_attention_matches_numpy_with_left_padding_and_gqa(impl, window):
    b, t, heads, kv_heads, d = 3, 37, 6, 2, 16  # 37: splash pads to its 128 block
    q, k, v = _inputs(b, t, t, heads, kv_heads, d)
    valid = _left_padded_valid(b, t)
    slot = np.arange(t)
    mask_bts = (slot[None, :] <= slot[:, None])[None] & valid[:, None, :]
    if window is not None:
        mask_bts = mask_bts & (slot[None, :] > slot[:, None] - window)[None]
    mask = AttnMask(jnp.asarray(mask_bts), jnp.asarray(valid), window=window, self_attention=True)
    want = numpy_attention(q, k, v, mask_bts)
    got = _ours(impl, q, k, v, mask)
    assert np.isfinite(got).all()  # padding rows included
    assert np.abs(got - want)[valid].max() <= TOL
    chunked = _ours(impl, q, k, v, mask, chunk=8)
    assert np.abs(chunked - want)[valid].max() <= TOL


@pytest.mark.parametrize("impl", ATTENTION)
def test_decode_over_a_cache_matches_numpy(impl):
    """Two new tokens over 12 cache slots, some empty (left padding) and some not yet written."""
    b, t, s, heads, kv_heads, d = 2, 2, 12, 4, 1, 8  # MQA
    q, k, v = _inputs(b, t, s, heads, kv_heads, d, seed=1)
    valid_bs = np.zeros((b, s), bool)
    valid_bs[0, :9] = True
    valid_bs[1, 4:9] = True
    q_slot = 7 + np.arange(t)
    mask_bts = (np.arange(s)[None, :] <= q_slot[:, None])[None] & valid_bs[:, None, :]
    mask = AttnMask(jnp.asarray(mask_bts), jnp.asarray(valid_bs), self_attention=False)
    got = _ours(impl, q, k, v, mask)
    assert np.abs(got - numpy_attention(q, k, v, mask_bts)).max() <= TOL


def test_splash_gradients_match_einsum():
    b, t, heads, kv_heads, d = 2, 20, 4, 2, 16
    q, k, v = _inputs(b, t, t, heads, kv_heads, d, seed=2)
    valid = _left_padded_valid(b, t)
    slot = np.arange(t)
    mask_bts = (slot[None, :] <= slot[:, None])[None] & valid[:, None, :]
    mask = AttnMask(jnp.asarray(mask_bts), jnp.asarray(valid), self_attention=True)
    weight = jnp.asarray(np.random.default_rng(3).normal(size=(b, t, heads, d)) * valid[:, :, None, None], jnp.float32)

    def loss(impl, q, k, v):
        out = attend(impl, q.reshape(b, t, kv_heads, heads // kv_heads, d), k.transpose(0, 2, 3, 1),
                     v.transpose(0, 2, 1, 3), mask)
        return jnp.sum(out.reshape(b, t, heads, d) * weight)

    grads = {impl: jax.jit(jax.grad(loss, argnums=(1, 2, 3)), static_argnums=0)(impl, q, k, v)
             for impl in ("einsum", "splash")}
    for want, got in zip(grads["einsum"], grads["splash"]):
        assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-4


def test_bad_attention_names_fail_in_one_line():
    with pytest.raises(ValueError, match="choose one of einsum, dot_product, splash"):
        check_attention("flash")
    with pytest.raises(ConfigError, match="model.attention='flash' is not allowed"):
        ModelConfig(attention="flash")
    model = init_decoder("tiny")
    with pytest.raises(ValueError, match="attention='cudnn' is not supported"):
        model.set_attention("cudnn")


@nnx.jit
def _forward(model, tokens, positions, valid):
    return model(tokens, positions, valid)[0]


@nnx.jit
def _step(model, tokens, positions, valid, cache):
    return model(tokens, positions, valid, cache)


@pytest.mark.parametrize("impl,scan_layers", [("dot_product", False), ("splash", False), ("splash", True)])
def test_tiny_model_logits_and_cached_decode_match_einsum(impl, scan_layers):
    spec = get_preset("tiny").replace(sliding_window=4, sliding_layers=(1,))  # one local, one global layer
    rng = np.random.default_rng(0)
    b, t = 3, 10
    tokens = jnp.asarray(rng.integers(3, spec.vocab_size, (b, t)), jnp.int32)
    valid = jnp.asarray(_left_padded_valid(b, t))
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    results = {}
    for name in ("einsum", impl):
        model = init_decoder(spec, scan_layers=scan_layers)
        model.set_attention(name)
        logits = _forward(model, tokens, positions, valid)
        cache = model.new_cache(b, t + 2)
        prefill, cache = _step(model, tokens, positions, valid, cache)
        nxt = jnp.argmax(prefill[:, -1], -1)[:, None]
        decoded, _ = _step(model, nxt, positions[:, -1:] + 1, jnp.ones((b, 1), bool), cache)
        results[name] = [np.asarray(a) for a in (logits, prefill, decoded)]
    mask = np.asarray(valid)
    for want, got in zip(results["einsum"], results[impl]):
        rows = mask if want.shape[1] == t else np.ones(want.shape[:2], bool)
        assert np.abs(got - want)[rows].max() <= 1e-4


def test_packed_prefill_sampling_is_the_same_with_dot_product():
    from spade_jax.sampling import Sampler, SamplingConfig

    model = init_decoder("tiny")
    prompts = [[5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24, 25, 26, 27]]
    config = SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    tokens = {}
    for name in ("einsum", "dot_product"):
        model.set_attention(name)
        tokens[name] = Sampler(model).generate(prompts, config, 0).tokens
    assert tokens["einsum"] == tokens["dot_product"]


@pytest.mark.slow
def test_splash_under_a_mesh_matches_einsum():
    """shard_map runs the kernel per shard (rows over data/fsdp, heads over tensor) on 8 CPU devices."""
    script = Path(__file__).with_name("splash_mesh_check.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count(" ok") == 2, done.stdout


@pytest.mark.parametrize("impl", ATTENTION)
def test_packed_rows_attend_only_within_their_segment(impl):
    """Segment ids (packed train rows): the dense mask and splash's SegmentIds keep each sequence to itself."""
    b, t, heads, kv_heads, d = 2, 21, 4, 2, 8
    q, k, v = _inputs(b, t, t, heads, kv_heads, d, seed=4)
    segments = np.zeros((b, t), np.int32)
    segments[0, :7], segments[0, 7:16], segments[0, 16:20] = 1, 2, 3  # one padding slot at the end
    segments[1, :21] = 1
    valid = segments > 0
    slot = np.arange(t)
    mask_bts = (slot[None, :] <= slot[:, None])[None] & valid[:, None, :] & (segments[:, :, None] == segments[:, None])
    mask = AttnMask(jnp.asarray(mask_bts), jnp.asarray(valid), segments_bs=jnp.asarray(segments), self_attention=True)
    got = _ours(impl, q, k, v, mask)
    assert np.abs(got - numpy_attention(q, k, v, mask_bts))[valid].max() <= TOL
