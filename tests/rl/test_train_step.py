"""The jitted GRPO train step: micro-batching, sharding on 8 CPU devices, bf16 compute, AdamW, write-back."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx
from rl_testing import make_train_batch, split_by_width, tiny_decoder, with_empty_rows

from spade_jax.rl import RLConfig, make_optimizer, make_train_step, token_logprobs

# A large Adam epsilon makes the first update ~ lr * grad, so params compare gradients closely.
CFG = RLConfig(lr=1e-2, adam_eps=1.0, kl_coef=0.01)


def _run(cfg, steps=2, model=None):
    model = model or tiny_decoder(0)
    init, step = make_train_step(model, cfg, verbose=False)
    state = init(model)
    history = []
    for i in range(steps):
        old = state
        state, metrics = step(state, make_train_batch(i, ref=True))
        assert jax.tree.leaves(old.params)[0].is_deleted()  # the state was donated
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def _assert_same_updates(history, state, expected_history, expected_state):
    """Same metrics each step (keys and values) and the same params at the end."""
    for a, b in zip(history, expected_history):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.fixture(scope="module")
def single():
    return _run(CFG)


def test_micro_batched_step_equals_single_batch(single):
    state1, hist1 = single
    state4, hist4 = _run(CFG.replace(micro_batches=4))
    _assert_same_updates(hist4, state4, hist1, state1)
    assert int(state4.step) == 2


def test_metrics_count_roles_and_tokens(single):
    _, hist = single
    batch = make_train_batch(1, ref=True)
    mask = np.asarray(batch.loss_mask_bt) & np.asarray(batch.valid_bt)
    mask[:, 0] = False
    role = np.asarray(batch.role_b)
    assert hist[1]["tokens"] == mask.sum()
    assert hist[1]["designer/tokens"] == mask[role == 1].sum()
    assert hist[1]["agent/tokens"] == mask[role == 0].sum()
    assert hist[1]["sequences"] == mask.any(1).sum()
    adv = np.asarray(batch.advantages_b)
    for r, name in enumerate(["agent", "designer"]):
        tok = mask.sum(1) * (role == r)
        np.testing.assert_allclose(hist[1][f"{name}/advantage_mean"], (adv * tok).sum() / tok.sum(), rtol=1e-5)
    for k in ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "entropy", "grad_norm", "tis_weight"):
        assert np.isfinite(hist[1][k]), k
    assert hist[1]["kl"] > 0 and hist[1]["grad_norm"] > 0


def test_update_follows_the_advantage_sign():
    """After a few steps, completions with positive advantage gain probability, negative ones lose it."""
    model = tiny_decoder(1)
    cfg = RLConfig(lr=3e-3)
    init, step = make_train_step(model, cfg, verbose=False)
    state = init(model)
    batch = make_train_batch(7)
    batch = batch.replace(is_stale_b=None, advantages_b=np.array([1, -1] * 4, np.float32))

    def mean_logp(params):
        m = nnx.merge(nnx.split(model, nnx.Param)[0], params)
        lp = np.asarray(token_logprobs(
            m, jnp.asarray(batch.tokens_bt), jnp.asarray(batch.positions_bt), jnp.asarray(batch.valid_bt)
        ))
        mask = np.asarray(batch.loss_mask_bt)
        return (lp * mask).sum(1) / np.maximum(mask.sum(1), 1)

    before = mean_logp(state.params)
    for _ in range(3):
        state, _ = step(state, batch)
    delta = mean_logp(state.params) - before
    assert np.all(delta[0:6:2] > 0) and np.all(delta[1:7:2] < 0), delta


def test_bf16_compute_keeps_fp32_master_params(single):
    state, hist = _run(CFG.replace(compute_dtype="bfloat16"), steps=1)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    np.testing.assert_allclose(hist[0]["loss"], single[1][0]["loss"], rtol=0.05, atol=0.02)
    # A bfloat16-stored model also trains fp32 masters, and writes bfloat16 back.
    model = tiny_decoder(0, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    init, step = make_train_step(model, CFG, verbose=False)
    state = init(model)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    state, _ = step(state, make_train_batch(0, ref=True))
    step.write_params(model, state)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_write_params_copies_into_the_model(single):
    state, _ = single
    model = tiny_decoder(0)
    _, step = make_train_step(model, CFG, verbose=False)
    step.write_params(model, state)
    got = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a is not b  # a copy: the next step may donate the state's buffers
    shared = step.sampling_model(state, model)
    assert jax.tree.leaves(nnx.state(shared, nnx.Param))[0] is jax.tree.leaves(state.params)[0]


def test_batch_must_divide_into_micro_batches():
    model = tiny_decoder(0)
    _, step = make_train_step(model, RLConfig(micro_batches=3), verbose=False)
    with pytest.raises(ValueError, match="multiple of micro_batches"):
        step.place_batch(make_train_batch(0, batch=8))
    with pytest.raises(ValueError, match="exactly one of advantages_b"):
        step.place_batch(make_train_batch(0).replace(advantages_bt=np.zeros((8, 12), np.float32)))


def test_optimizer_matches_torch_adamw_with_clipping():
    """Clip-by-global-norm + AdamW (SPADE's betas and decay; 1-D params not decayed) vs torch."""
    cfg = RLConfig(lr=1e-2, grad_clip=0.5)
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(3, 4)).astype(np.float32), "norm": rng.normal(size=(4,)).astype(np.float32)}
    grads = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()} for _ in range(3)]
    opt = make_optimizer(cfg)
    state = opt.init(params)
    p = params
    for g in grads:
        upd, state = opt.update(g, state, p)
        p = optax.apply_updates(p, upd)
    tw = torch.nn.Parameter(torch.tensor(params["w"]))
    tn = torch.nn.Parameter(torch.tensor(params["norm"]))
    topt = torch.optim.AdamW(
        [{"params": [tw], "weight_decay": 0.1}, {"params": [tn], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.98), eps=1e-8,
    )
    for g in grads:
        tw.grad, tn.grad = torch.tensor(g["w"]), torch.tensor(g["norm"])
        torch.nn.utils.clip_grad_norm_([tw, tn], 0.5)
        topt.step()
    np.testing.assert_allclose(np.asarray(p["w"]), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(p["norm"]), tn.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_sharded_step_on_8_cpu_devices_equals_unsharded(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "sharded_train_check.py")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, script, str(tmp_path / "ckpt")], capture_output=True, text=True, env=env,
                         timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(script))))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sharded_params"] > 0  # the check really sharded something
    assert result["param_diff"] < 1e-6, result
    assert result["metric_diff"] < 1e-5, result
    assert result["fixed_rows_param_diff"] < 1e-6 and result["fixed_rows_metric_diff"] < 1e-5, result
    assert result["split_param_diff"] < 1e-6 and result["split_metric_diff"] < 1e-5, result
    assert result["kl"][0] == 0.0 and result["kl"][1] > 0.0, result  # reference = starting weights


def _host_copy(tree):
    return [np.array(x, copy=True) for x in jax.tree.leaves(tree)]


def _assert_bitwise_equal(before, tree):
    after = jax.tree.leaves(tree)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        assert a.dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(b), a)  # NaN nowhere, value for value


def test_a_non_finite_step_is_skipped_inside_the_donated_step():
    model = tiny_decoder(0)
    init, step = make_train_step(model, CFG, verbose=False)
    state = init(model)
    state, metrics = step(state, make_train_batch(0, ref=True))
    assert float(metrics["train/skipped"]) == 0.0 and int(state.step) == 1
    params, opt_state = _host_copy(state.params), _host_copy(state.opt_state)

    bad = make_train_batch(1, ref=True)
    bad = bad.replace(advantages_b=np.where(np.arange(8) == 2, np.nan, bad.advantages_b).astype(np.float32))
    old = state
    state, metrics = step(state, bad)
    assert jax.tree.leaves(old.params)[0].is_deleted()  # still donated
    assert float(metrics["train/skipped"]) == 1.0 and not np.isfinite(float(metrics["loss"]))
    _assert_bitwise_equal(params, state.params)
    _assert_bitwise_equal(opt_state, state.opt_state)
    assert int(state.step) == 1  # a skipped step is not an optimizer step

    state, metrics = step(state, make_train_batch(2, ref=True))  # training goes on from the kept state
    assert float(metrics["train/skipped"]) == 0.0 and int(state.step) == 2
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(params, jax.tree.leaves(state.params)))


def test_lr_nan_never_reaches_the_weights():
    """rl.lr=nan leaves the loss and gradients finite; the update itself is NaN and must be refused."""
    try:
        cfg = CFG.replace(lr=float("nan"))
    except ValueError:
        return  # the config refusing it outright is just as good
    model = tiny_decoder(0)
    init, step = make_train_step(model, cfg, verbose=False)
    state = init(model)
    params, opt_state = _host_copy(state.params), _host_copy(state.opt_state)
    state, metrics = step(state, make_train_batch(0, ref=True))
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert float(metrics["train/skipped"]) == 1.0
    _assert_bitwise_equal(params, state.params)
    _assert_bitwise_equal(opt_state, state.opt_state)


def test_scoring_only_loss_columns_equals_scoring_every_column(single):
    """rl.score_loss_only against the full [B, T, V] projection (the default): same metrics and params."""
    state_full, hist_full = single
    state_sparse, hist_sparse = _run(CFG.replace(score_loss_only=True, micro_batches=2))
    _assert_same_updates(hist_sparse, state_sparse, hist_full, state_full)


def test_fixed_update_rows_skip_padding_micro_batches_with_the_same_update(single):
    """rl.update_rows: every batch padded to one row count, its padding gathered into micro-batches the
    step skips; same metrics and params as the one-shot step, one compiled program for both batches."""
    from spade_jax.rl.collate import fill_micro_batches

    state_one, hist_one = single
    model = tiny_decoder(0)
    train_step = make_train_step(model, CFG.replace(micro_batches=4, update_rows=16), verbose=False)
    state, history = train_step.init(model), []
    for i in range(2):
        batch = fill_micro_batches(with_empty_rows(make_train_batch(i, ref=True), 16), 4)
        assert not np.asarray(batch.valid_bt)[np.arange(16) % 4 >= 2].any()  # micro-batches 2, 3: padding only
        state, metrics = train_step(state, batch)
        history.append({k: float(v) for k, v in metrics.items()})
    assert len(train_step._compiled) == 1
    _assert_same_updates(history, state, hist_one, state_one)


@pytest.mark.parametrize("changes", [
    {},  # token aggregation, KL from the batch
    {"aggregation": "sequence", "score_loss_only": True},
    {"aggregation": "dr_grpo", "dr_grpo_tokens": 16, "update_rows": 8},
])
def test_a_batch_given_as_two_batches_of_different_widths_gives_the_same_update(changes):
    """The Learner's long samples apart: rows split into a batch at the batch's width and a wider one
    (right-padded) make one step with the one-shot step's metrics and params."""
    cfg = CFG.replace(micro_batches=2, **changes)
    expected_state, expected = _run(cfg.replace(update_rows=None), model=tiny_decoder(0))
    model = tiny_decoder(0)
    train_step = make_train_step(model, cfg, verbose=False)
    state, history = train_step.init(model), []
    for i in range(2):
        state, metrics = train_step(state, split_by_width(make_train_batch(i, ref=True), 4, 20))
        history.append({k: float(v) for k, v in metrics.items()})
    _assert_same_updates(history, state, expected, expected_state)


def test_update_rows_must_split_into_micro_batches():
    with pytest.raises(ValueError, match="update_rows must be a positive multiple of micro_batches"):
        RLConfig(micro_batches=4, update_rows=10)
