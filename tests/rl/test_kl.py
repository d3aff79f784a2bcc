"""KL to the initial policy inside the train step: reference logprobs from frozen params, k1 and k3
against numpy computed from the models' own logits, exactly 0 at step 0, micro-batched and not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_testing import TINY, tiny_decoder

from spade_jax.rl import RLConfig, TrainBatch, make_train_step

B, T, PROMPT = 8, 12, 4


def _batch(seed: int, model) -> TrainBatch:
    """Right-padded rows, completions from column PROMPT on, one row without loss, two stale rows;
    behaviour logprobs are `model`'s plus noise."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, TINY.vocab_size, (B, T)).astype(np.int32)
    lengths = np.array([T, T, T - 3, T, T - 1, T, T - 4, T])
    valid = np.arange(T)[None] < lengths[:, None]
    loss_mask = valid & (np.arange(T)[None] >= PROMPT)
    loss_mask[5] = False  # e.g. a trajectory cut by the turn limit
    behaviour = _numpy_logprobs(model, tokens) + rng.normal(0, 0.3, (B, T))  # ratios on both sides of the clip
    return TrainBatch(
        tokens_bt=tokens,
        positions_bt=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        valid_bt=valid,
        loss_mask_bt=loss_mask,
        behaviour_logprobs_bt=behaviour.astype(np.float32),
        advantages_b=rng.normal(0, 1, B).astype(np.float32),
        role_b=(np.arange(B) % 4 == 3).astype(np.int32),
        is_stale_b=np.arange(B) % 4 == 3,
    )


def _numpy_logprobs(model, tokens: np.ndarray) -> np.ndarray:
    """log p(tokens[:, t] | tokens[:, :t]) in float64 from the model's logits (column 0: 0)."""
    pos = np.tile(np.arange(tokens.shape[1], dtype=np.int32), (tokens.shape[0], 1))
    logits, _ = nnx.jit(lambda m, x, p: m(x, p))(model, jnp.asarray(tokens), jnp.asarray(pos))
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(-1, keepdims=True)
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    out = np.zeros(tokens.shape)
    out[:, 1:] = np.take_along_axis(log_softmax[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    return out


def _numpy_loss(logp, ref, batch: TrainBatch, cfg: RLConfig) -> dict:
    """Loss, pg loss and mean KL of one batch: decoupled PPO + TIS + KL, written out in numpy."""
    mask = np.asarray(batch.loss_mask_bt) & np.asarray(batch.valid_bt)
    mask[:, 0] = False
    behaviour = np.asarray(batch.behaviour_logprobs_bt, np.float64)
    adv = np.broadcast_to(np.asarray(batch.advantages_b, np.float64)[:, None], logp.shape)
    stale = np.asarray(batch.is_stale_b)[:, None]
    prox = np.where(stale, logp, behaviour)
    ratio = np.exp(logp - prox)
    tis = np.minimum(np.exp(prox - behaviour), cfg.tis_cap)
    pg = -tis * np.minimum(ratio * adv, np.clip(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv)
    if cfg.kl_estimator == "k1":
        kl = logp - ref
    else:
        kl = np.exp(ref - logp) - (ref - logp) - 1
    if cfg.aggregation == "token":
        weights = mask / mask.sum()
    else:  # sequence
        weights = mask / np.maximum(mask.sum(1, keepdims=True), 1) / mask.any(1).sum()
    return {
        "loss": float(((pg + cfg.kl_coef * kl) * weights).sum()),
        "pg_loss": float((pg * weights).sum()),
        "kl": float((kl * mask).sum() / mask.sum()),
    }


@pytest.mark.parametrize(
    "estimator, aggregation, micro_batches", [("k3", "token", 1), ("k1", "sequence", 2), ("k3", "sequence", 2)]
)
def test_step_kl_and_loss_match_numpy(estimator, aggregation, micro_batches):
    """Policy and reference differ (two models); the step's KL comes from the reference params alone."""
    policy, reference = tiny_decoder(0), tiny_decoder(1)
    cfg = RLConfig(kl_coef=0.3, kl_estimator=estimator, aggregation=aggregation, micro_batches=micro_batches)
    init, step = make_train_step(policy, cfg, verbose=False)
    state, ref_params = init(policy), step.reference_params(reference)
    batch = _batch(0, policy)
    logp, ref = _numpy_logprobs(policy, batch.tokens_bt), _numpy_logprobs(reference, batch.tokens_bt)
    want = _numpy_loss(logp, ref, batch, cfg)
    assert abs(want["kl"]) > 0.05 and abs(want["loss"] - want["pg_loss"]) > 0.01  # the KL term matters here
    _, metrics = step(state, batch, ref_params)
    for key in ("loss", "pg_loss", "kl"):
        np.testing.assert_allclose(float(metrics[key]), want[key], rtol=2e-5, atol=2e-6, err_msg=key)


@pytest.mark.parametrize("estimator", ["k3", "k1"])
def test_kl_is_exactly_zero_at_the_start_and_positive_after_an_update(estimator):
    model = tiny_decoder(2)
    cfg = RLConfig(lr=1e-2, kl_coef=0.005, kl_estimator=estimator, micro_batches=2)
    init, step = make_train_step(model, cfg, verbose=False)
    state, ref_params = init(model), step.reference_params(model)
    start = [np.array(x, copy=True) for x in jax.tree.leaves(ref_params)]
    batch = _batch(3, model)
    state, first = step(state, batch, ref_params)
    assert float(first["kl"]) == 0.0  # params == ref: the same forward, bit for bit
    np.testing.assert_allclose(float(first["loss"]), float(first["pg_loss"]), rtol=1e-6)
    state, second = step(state, batch, ref_params)
    assert float(second["train/skipped"]) == 0.0
    if estimator == "k3":
        assert float(second["kl"]) > 0.0
    else:
        assert float(second["kl"]) != 0.0  # k1 is signed
    for a, b in zip(start, jax.tree.leaves(ref_params)):  # the reference stays frozen (and undonated)
        np.testing.assert_array_equal(np.asarray(b), a)


def test_kl_alone_pulls_the_policy_back_to_the_reference():
    """With every advantage 0 only the k3 term has a gradient: the KL to the reference shrinks."""
    policy, reference = tiny_decoder(0), tiny_decoder(1)
    init, step = make_train_step(policy, RLConfig(lr=1e-3, kl_coef=1.0), verbose=False)
    state, ref_params = init(policy), step.reference_params(reference)
    batch = _batch(4, policy).replace(advantages_b=np.zeros(B, np.float32))
    kls = []
    for _ in range(4):
        state, metrics = step(state, batch, ref_params)
        kls.append(float(metrics["kl"]))
    assert all(b < a for a, b in zip(kls, kls[1:])) and kls[-1] < 0.8 * kls[0], kls


def test_reference_params_cost_nothing_without_kl_and_are_required_with_it():
    model = tiny_decoder(0)
    init, step = make_train_step(model, RLConfig(), verbose=False)
    assert step.reference_params(model) is None and step.jitted_ref is None
    init, step = make_train_step(model, RLConfig(kl_coef=0.01), verbose=False)
    ref_params = step.reference_params(model)
    model_params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(ref_params), jax.tree.leaves(model_params)):
        assert a is not b and a.dtype == b.dtype  # an own copy in the model's dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="reference_params"):
        step(init(model), _batch(0, model))


def test_config_knows_the_estimators():
    assert RLConfig().kl_estimator == "k3"
    with pytest.raises(ValueError, match="kl_estimator"):
        RLConfig(kl_estimator="k2")
