"""GRPO loss, its gradient and per-token logprobs against numpy references and finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_testing import TINY, tiny_decoder

from spade_jax.rl import (
    RLConfig,
    TrainBatch,
    grpo_loss,
    kl_penalty,
    loss_normalisers,
    token_logprobs,
    truncated_importance_weights,
)

B, T = 6, 9


def ref_terms(logp, behaviour, adv_bt, stale, old, ref, cfg):
    """Per-token loss and d loss / d logp, one token at a time (decoupled PPO + TIS + k1 or k3 KL)."""
    loss = np.zeros_like(logp)
    grad = np.zeros_like(logp)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            lp, a = logp[b, t], adv_bt[b, t]
            prox = lp if stale[b] else (old[b, t] if old is not None else behaviour[b, t])
            r = np.exp(lp - prox)
            w = 1.0 if cfg.tis_cap is None else min(np.exp(prox - behaviour[b, t]), cfg.tis_cap)
            clipped = min(max(r, 1 - cfg.eps_low), 1 + cfg.eps_high)
            uses_unclipped = r * a <= clipped * a
            loss[b, t] = -w * min(r * a, clipped * a)
            grad[b, t] = -w * a * r if uses_unclipped else 0.0
            if ref is not None and cfg.kl_estimator == "k1":
                loss[b, t] += cfg.kl_coef * (lp - ref[b, t])
                grad[b, t] += cfg.kl_coef
            elif ref is not None:
                d = ref[b, t] - lp
                loss[b, t] += cfg.kl_coef * (np.exp(d) - d - 1)
                grad[b, t] += cfg.kl_coef * (1 - np.exp(d))
    return loss, grad


def ref_aggregate(x, mask, cfg):
    """Batch loss and the per-token weights that produce it."""
    seq_len = mask.sum(1)
    n_seq = (seq_len > 0).sum()
    if cfg.aggregation == "token":
        w = mask / mask.sum()
    elif cfg.aggregation == "sequence":
        w = mask / np.maximum(seq_len, 1)[:, None] / n_seq
    else:
        budget = cfg.dr_grpo_tokens or mask.shape[1]
        w = mask / (n_seq * budget)
    return float((x * w).sum()), w


def make_batch(seed, *, per_token_adv=False, stale=False, old=False, ref=False):
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 0.9, (B, T)))
    behaviour = logp + rng.normal(0, 0.3, (B, T))  # ratios on both sides of the clip range
    loss_mask = rng.random((B, T)) > 0.3
    loss_mask[2] = False  # a sequence without loss tokens (e.g. cut by the turn limit)
    valid = np.ones((B, T), bool)
    valid[4, -3:] = False  # right padding
    batch = TrainBatch(
        tokens_bt=np.zeros((B, T), np.int32),
        positions_bt=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
        valid_bt=valid,
        loss_mask_bt=loss_mask,
        behaviour_logprobs_bt=behaviour.astype(np.float32),
        advantages_b=None if per_token_adv else rng.normal(0, 1, B).astype(np.float32),
        advantages_bt=rng.normal(0, 1, (B, T)).astype(np.float32) if per_token_adv else None,
        old_logprobs_bt=(logp + rng.normal(0, 0.2, (B, T))).astype(np.float32) if old else None,
        ref_logprobs_bt=(logp + rng.normal(0, 0.5, (B, T))).astype(np.float32) if ref else None,
        role_b=np.array([0, 1, 0, 1, 0, 0], np.int32),
        is_stale_b=np.array([False, True, False, True, False, False]) if stale else None,
    )
    mask = loss_mask & valid
    mask[:, 0] = False
    return logp.astype(np.float32), batch, mask


CASES = [
    dict(),
    dict(per_token_adv=True),
    dict(stale=True),
    dict(stale=True, old=True),
    dict(ref=True),
    dict(ref=True, stale=True, kl_estimator="k1"),
]


@pytest.mark.parametrize("aggregation", ["token", "sequence", "dr_grpo"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_loss_and_grad_match_numpy(aggregation, case):
    opts = CASES[case]
    opts = dict(opts)
    cfg = RLConfig(aggregation=aggregation, kl_coef=0.05 if opts.get("ref") else 0.0, dr_grpo_tokens=16,
                   kl_estimator=opts.pop("kl_estimator", "k3"))
    logp, batch, mask = make_batch(case, **opts)
    if batch.advantages_b is not None:
        adv_bt = np.broadcast_to(np.asarray(batch.advantages_b)[:, None], (B, T))
    else:
        adv_bt = batch.advantages_bt
    stale = batch.is_stale_b if batch.is_stale_b is not None else np.zeros(B, bool)
    per_tok, per_tok_grad = ref_terms(
        logp.astype(np.float64), batch.behaviour_logprobs_bt, adv_bt, stale,
        batch.old_logprobs_bt, batch.ref_logprobs_bt, cfg,
    )
    want, w = ref_aggregate(per_tok, mask, cfg)

    def loss_of(lp):
        return grpo_loss(lp, jax.tree.map(jnp.asarray, batch), cfg)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(jnp.asarray(logp))
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), per_tok_grad * w, rtol=1e-4, atol=1e-6)
    # Metrics are token means over the loss mask.
    n = mask.sum()
    prox = np.where(stale[:, None], logp, batch.old_logprobs_bt if opts.get("old") else batch.behaviour_logprobs_bt)
    r = np.exp(logp - prox)
    clipped = ((r < 0.8) & (adv_bt < 0)) | ((r > 1.28) & (adv_bt > 0))
    np.testing.assert_allclose(float(metrics["clip_frac"]), (clipped & mask).sum() / n, atol=1e-6)
    np.testing.assert_allclose(float(metrics["entropy"]), -(logp * mask).sum() / n, rtol=1e-5)
    if stale.any():
        assert not clipped[stale].any()  # stale rows are clipped around the current policy (ratio 1)
    role = np.asarray(batch.role_b)
    for r_id, name in enumerate(["agent", "designer"]):
        sel = mask & (role == r_id)[:, None]
        np.testing.assert_allclose(
            float(metrics[f"{name}/advantage_mean"]), (adv_bt * sel).sum() / sel.sum(), rtol=1e-5
        )


def test_tis_weight_is_truncated():
    logp, batch, mask = make_batch(0, stale=True)
    cfg = RLConfig(tis_cap=1.5)
    behaviour = np.asarray(batch.behaviour_logprobs_bt)
    _, metrics = grpo_loss(jnp.asarray(logp), jax.tree.map(jnp.asarray, batch), cfg)
    w = np.where(np.asarray(batch.is_stale_b)[:, None], np.minimum(np.exp(logp - behaviour), 1.5), 1.0)
    np.testing.assert_allclose(float(metrics["tis_weight"]), (w * mask).sum() / mask.sum(), rtol=1e-5)
    assert float(metrics["tis_weight"]) < 1.5


def test_truncated_importance_weights_values_mask_cap_and_no_gradient():
    current = jnp.log(jnp.asarray([0.5, 0.2, 0.9, 0.3]))
    behaviour = jnp.log(jnp.asarray([0.5, 0.4, 0.3, 0.1]))
    capped_2 = truncated_importance_weights(current, behaviour, 2.0)
    np.testing.assert_allclose(np.asarray(capped_2), [1.0, 0.5, 2.0, 2.0], atol=1e-6)
    capped_5 = truncated_importance_weights(current, behaviour, 5.0)
    np.testing.assert_allclose(np.asarray(capped_5), [1.0, 0.5, 3.0, 3.0], rtol=1e-6)
    masked = truncated_importance_weights(current, behaviour, 2.0, mask=[True, False, True, False])
    np.testing.assert_allclose(np.asarray(masked), [1.0, 0.0, 2.0, 0.0], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(truncated_importance_weights(current, behaviour, None)), 1.0)
    grad = jax.grad(lambda c: truncated_importance_weights(c, behaviour).sum())(current)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)


def test_kl_estimators_match_numpy():
    rng = np.random.default_rng(3)
    logp = np.log(rng.uniform(0.01, 1.0, (4, 5)))
    ref = np.log(rng.uniform(0.01, 1.0, (4, 5)))
    d = ref - logp
    np.testing.assert_allclose(np.asarray(kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k1")), logp - ref, rtol=1e-5)
    k3 = np.asarray(kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"))
    np.testing.assert_allclose(k3, np.exp(d) - d - 1, rtol=1e-5, atol=1e-6)
    assert (k3 >= 0).all()
    np.testing.assert_array_equal(np.asarray(kl_penalty(jnp.asarray(logp), jnp.asarray(logp), "k3")), 0.0)


def test_micro_batch_contributions_add_up():
    """With the full batch's normalisers, per-half losses sum to the full loss for every aggregation."""
    logp, batch, _ = make_batch(5, stale=True)
    batch = jax.tree.map(jnp.asarray, batch)
    for aggregation in ("token", "sequence", "dr_grpo"):
        cfg = RLConfig(aggregation=aggregation)
        norm = loss_normalisers(batch, cfg)
        full, _ = grpo_loss(jnp.asarray(logp), batch, cfg)
        halves = [
            grpo_loss(jnp.asarray(logp[s]), jax.tree.map(lambda x: x[s], batch), cfg, norm)[0]  # noqa: B023 (called within this iteration)
            for s in (slice(0, 3), slice(3, None))
        ]
        np.testing.assert_allclose(float(sum(halves)), float(full), rtol=1e-6)


@pytest.mark.parametrize("aggregation", ["token", "sequence", "dr_grpo"])
def test_anchor_rows_add_their_mean_nll_and_leave_the_policy_gradient_alone(aggregation):
    """PPO-ptx: anchor rows (role 2) add coef x their mean -logp per token (numpy) to the loss of the other
    rows, which is what it is without them; gradients likewise; and the halves still add up."""
    cfg = RLConfig(aggregation=aggregation, dr_grpo_tokens=16, anchor_coef=0.3)
    logp, batch, mask = make_batch(7)
    role = np.array([0, 2, 0, 1, 2, 0], np.int32)  # rows 1 and 4 become anchor rows
    anchored = batch.replace(role_b=role)
    policy_rows = role != 2
    without = jax.tree.map(lambda x: np.asarray(x)[policy_rows], batch)
    anchor_mask = mask & (role == 2)[:, None]
    want_nll = -(logp * anchor_mask).sum() / anchor_mask.sum()

    def loss_of(b):
        return jax.value_and_grad(lambda lp: grpo_loss(lp, jax.tree.map(jnp.asarray, b), cfg), has_aux=True)

    (loss, metrics), grad = loss_of(anchored)(jnp.asarray(logp))
    (base, base_metrics), base_grad = loss_of(without)(jnp.asarray(logp[policy_rows]))
    np.testing.assert_allclose(float(loss), float(base) + 0.3 * want_nll, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["anchor/nll"]), want_nll, rtol=1e-6)
    grad = np.asarray(grad)
    np.testing.assert_allclose(grad[policy_rows], np.asarray(base_grad), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad[~policy_rows], -0.3 * anchor_mask[~policy_rows] / anchor_mask.sum(), rtol=1e-5)
    for key in ("pg_loss", "entropy", "clip_frac", "ratio", "agent/advantage_mean", "designer/advantage_mean"):
        np.testing.assert_allclose(float(metrics[key]), float(base_metrics[key]), rtol=1e-5, err_msg=key)
    norm = loss_normalisers(jax.tree.map(jnp.asarray, anchored), cfg)
    assert float(norm.tokens) == mask[policy_rows].sum() and float(norm.role_tokens[2]) == anchor_mask.sum()
    halves = [
        grpo_loss(jnp.asarray(logp[s]), jax.tree.map(lambda x: jnp.asarray(x)[s], anchored), cfg, norm)[0]  # noqa: B023
        for s in (slice(0, 3), slice(3, None))
    ]
    np.testing.assert_allclose(float(sum(halves)), float(loss), rtol=1e-6)


def test_kl_needs_reference():
    logp, batch, _ = make_batch(0)
    with pytest.raises(ValueError, match="ref_logprobs_bt"):
        grpo_loss(jnp.asarray(logp), batch, RLConfig(kl_coef=0.1))


def test_config_validation():
    with pytest.raises(ValueError, match="aggregation"):
        RLConfig(aggregation="mean")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        RLConfig(agent_advantage="ppo")
    with pytest.raises(ValueError, match="anchor_coef"):
        RLConfig(anchor_coef=-0.1)
    with pytest.raises(ValueError, match="tis_cap"):
        RLConfig(tis_cap=0.5)
    cfg = RLConfig()
    assert (cfg.eps_low, cfg.eps_high, cfg.lr, cfg.weight_decay, cfg.b1, cfg.b2) == (0.2, 0.28, 1e-6, 0.1, 0.9, 0.98)


def _jit_logprobs(model, chunk=None):
    """Jitted token_logprobs (eager NNX dispatch is slow on a busy CPU)."""
    graphdef, params = nnx.split(model, nnx.Param)

    @jax.jit
    def run(params, tokens, pos, valid):
        return token_logprobs(nnx.merge(graphdef, params), tokens, pos, valid, chunk)

    return lambda tokens, pos, valid=None: run(params, jnp.asarray(tokens), jnp.asarray(pos),
                                               None if valid is None else jnp.asarray(valid))


def _tokens(seed, b=3, t=10):
    rng = np.random.default_rng(seed)
    return rng.integers(0, TINY.vocab_size, (b, t)).astype(np.int32)


@pytest.mark.parametrize("chunk", [None, 4])
def test_token_logprobs_match_numpy_log_softmax(chunk):
    model = tiny_decoder(1)
    tokens = _tokens(0)
    pos = np.tile(np.arange(10, dtype=np.int32), (3, 1))
    logits, _ = nnx.jit(lambda m, x, p: m(x, p))(model, jnp.asarray(tokens), jnp.asarray(pos))
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = np.zeros(tokens.shape)
    for b in range(3):
        for t in range(1, 10):
            want[b, t] = logsm[b, t - 1, tokens[b, t]]
    got = _jit_logprobs(model, chunk)(tokens, pos)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


def test_left_padding_scores_real_tokens_like_no_padding():
    model = tiny_decoder(2)
    tokens = _tokens(1, b=1, t=7)
    pos = np.arange(7, dtype=np.int32)[None]
    score = _jit_logprobs(model)
    plain = score(tokens, pos, np.ones((1, 7), bool))
    padded_tokens = np.concatenate([np.zeros((1, 3), np.int32), tokens], 1)
    padded_pos = np.concatenate([np.zeros((1, 3), np.int32), pos], 1)
    valid = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 7), bool)], 1)
    padded = score(padded_tokens, padded_pos, valid)
    np.testing.assert_allclose(np.asarray(padded)[:, 4:], np.asarray(plain)[:, 1:], atol=1e-5)


def test_model_gradient_matches_finite_differences():
    """d loss / d params of a tiny decoder (through logprobs, clip, TIS and KL) vs central differences."""
    model = tiny_decoder(3)
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    b, t = 4, 10
    tokens = _tokens(4, b, t)
    pos = np.tile(np.arange(t, dtype=np.int32), (b, 1))
    valid = np.ones((b, t), bool)
    rng = np.random.default_rng(9)
    base = np.asarray(_jit_logprobs(model)(tokens, pos, valid))
    loss_mask = np.zeros((b, t), bool)
    loss_mask[:, 4:] = True
    batch = jax.tree.map(jnp.asarray, TrainBatch(
        tokens_bt=tokens, positions_bt=pos, valid_bt=valid, loss_mask_bt=loss_mask,
        # Ratios well inside the clip range except one row far outside: no kink within the step.
        behaviour_logprobs_bt=(
            base + np.where(np.arange(b)[:, None] == 0, 0.6, rng.normal(0, 0.03, (b, t)))
        ).astype(np.float32),
        advantages_b=np.array([1.0, -0.5, 0.8, -1.2], np.float32),
        ref_logprobs_bt=(base + 0.3).astype(np.float32),
        role_b=np.array([0, 1, 0, 1], np.int32),
        is_stale_b=np.array([False, False, True, False]),
    ))
    cfg = RLConfig(kl_coef=0.1, aggregation="sequence")

    @jax.jit
    def loss_fn(p):
        m = nnx.merge(graphdef, p)
        lp = token_logprobs(m, batch.tokens_bt, batch.positions_bt, batch.valid_bt)
        return grpo_loss(lp, batch, cfg)[0]

    grads = jax.jit(jax.grad(loss_fn))(params)
    picks = [("embed",), ("lm_head",), ("layers", 0, "attn", "q"), ("layers", 1, "mlp", "down"),
             ("layers", 1, "attn_norm", "weight")]
    for path in picks:
        leaf = params
        g = grads
        for k in path:
            leaf, g = leaf[k], g[k]
        direction = np.random.default_rng(len(path)).normal(size=leaf.shape).astype(np.float32)
        direction /= np.linalg.norm(direction)

        def shifted(h, path=path, direction=direction):
            def put(tree, keys):
                if not keys:
                    return tree + h * direction
                return {**tree, keys[0]: put(tree[keys[0]], keys[1:])}
            return float(loss_fn(put(params, path)))

        h = 1e-2
        fd = (shifted(h) - shifted(-h)) / (2 * h)
        analytic = float(np.sum(np.asarray(g) * direction))
        assert abs(fd - analytic) <= 2e-3 * max(abs(analytic), 1e-2), (path, fd, analytic)


@pytest.mark.parametrize("chunk", [None, 3])
def test_logprobs_at_loss_columns_equal_the_full_computation_values_and_gradients(chunk):
    """token_logprobs_at (projection at the loss columns only) against token_logprobs at every column."""
    from spade_jax.rl import score_index, token_logprobs_at

    model = tiny_decoder(5)
    graphdef, params = nnx.split(model, nnx.Param)
    b, t = 4, 12
    tokens = _tokens(6, b, t)
    valid = np.arange(t)[None] >= np.array([0, 2, 0, 1])[:, None]  # some left padding
    pos = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    rng = np.random.default_rng(7)
    loss_mask = valid & (rng.uniform(size=(b, t)) < 0.4)
    loss_mask[3] = False  # a row with nothing to score
    index = score_index(loss_mask, valid)
    assert index.shape == (b, 8) and index.dtype == np.int32
    mask = loss_mask.copy()
    mask[:, 0] = False
    weights = jnp.asarray(np.where(mask, rng.normal(size=(b, t)), 0.0).astype(np.float32))

    def full(p):
        return token_logprobs(nnx.merge(graphdef, p), tokens, pos, valid, chunk)

    def sparse(p):
        return token_logprobs_at(nnx.merge(graphdef, p), tokens, pos, valid, index, chunk)

    want, got = jax.jit(full)(params), jax.jit(sparse)(params)
    np.testing.assert_allclose(np.asarray(got), np.where(mask, np.asarray(want), 0.0), atol=1e-6)
    g_full = jax.jit(jax.grad(lambda p: jnp.sum(full(p) * weights)))(params)
    g_sparse = jax.jit(jax.grad(lambda p: jnp.sum(sparse(p) * weights)))(params)
    for a, c in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_sparse)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), atol=1e-6, rtol=1e-5)
