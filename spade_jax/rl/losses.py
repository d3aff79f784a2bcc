"""GRPO policy loss: asymmetric clipped surrogate, truncated importance sampling, KL to a reference, aggregation.

Pure functions of per-token arrays; `token_logprobs` turns a model and tokens into those arrays.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.rl.batch import ANCHOR, ROLE_NAMES, TrainBatch
from spade_jax.rl.config import KL_ESTIMATORS, RLConfig

_MAX_LOG_RATIO = 20.0  # exp() stays finite; masked positions may hold arbitrary logprobs


@flax.struct.dataclass
class LossNormalisers:
    """Counts over the FULL batch, so micro-batch contributions add up to the full-batch loss."""

    tokens: jax.Array  # policy-gradient loss tokens in the batch (anchor tokens apart)
    sequences: jax.Array  # sequences with at least one of them
    dr_grpo_denominator: jax.Array  # sequences * Dr.GRPO token budget
    role_tokens: jax.Array  # [len(ROLE_NAMES)] loss tokens per role (the anchor's too)


def effective_loss_mask(batch: TrainBatch) -> jax.Array:
    """Loss tokens: generated, real, and not first in their sequence (column 0 or, packed, where a new
    sequence starts): nothing of their own sequence scores them."""
    mask = jnp.asarray(batch.loss_mask_bt, bool) & jnp.asarray(batch.valid_bt, bool)
    if batch.segment_ids_bt is not None:
        seg = jnp.asarray(batch.segment_ids_bt)
        mask = mask & jnp.pad(seg[:, 1:] == seg[:, :-1], ((0, 0), (1, 0)))
    return mask.at[:, 0].set(False)


def policy_and_anchor_masks(batch: TrainBatch) -> tuple[jax.Array, jax.Array]:
    """The loss tokens split in two: the policy gradient's (agent and designer) and the anchor's
    (`RLConfig.anchor_coef`), which only the likelihood term reads."""
    mask = effective_loss_mask(batch)
    anchor = mask & (batch.token_roles() == ANCHOR)
    return mask & ~anchor, anchor


def _segment_loss_tokens(mask_bt: jax.Array, segment_ids_bt: jax.Array) -> jax.Array:
    """[B, T + 1] float32: loss tokens per (row, segment id); id 0 (padding) holds none."""
    seg = jnp.asarray(segment_ids_bt, jnp.int32)
    rows = jnp.arange(seg.shape[0])[:, None]
    return jnp.zeros((seg.shape[0], seg.shape[1] + 1), jnp.float32).at[rows, seg].add(mask_bt.astype(jnp.float32))


def _sequence_tokens(mask_bt: jax.Array, segment_ids_bt: jax.Array | None) -> jax.Array:
    """[B, T] float32: the loss tokens of the sequence each column belongs to (its row, or its segment)."""
    if segment_ids_bt is None:
        return jnp.broadcast_to(mask_bt.astype(jnp.float32).sum(axis=1, keepdims=True), mask_bt.shape)
    per_segment = _segment_loss_tokens(mask_bt, segment_ids_bt)
    return jnp.take_along_axis(per_segment, jnp.asarray(segment_ids_bt, jnp.int32), axis=1)


def _sequence_count(mask_bt: jax.Array, segment_ids_bt: jax.Array | None) -> jax.Array:
    """Sequences (rows, or packed segments) with at least one loss token."""
    if segment_ids_bt is None:
        return mask_bt.any(axis=1).sum().astype(jnp.float32)
    return (_segment_loss_tokens(mask_bt, segment_ids_bt) > 0).sum().astype(jnp.float32)


def loss_normalisers(batch: TrainBatch | tuple[TrainBatch, ...], cfg: RLConfig) -> LossNormalisers:
    """The batch's counts; given several batches (one update's rows at different widths, `TrainStep`),
    their sums, with the Dr.GRPO budget of the widest: the counts of one batch holding all their rows."""
    parts = batch if isinstance(batch, tuple) else (batch,)
    tokens = sequences = 0.0
    role_tokens = jnp.zeros((len(ROLE_NAMES),), jnp.float32)
    for part in parts:
        mask, anchor = policy_and_anchor_masks(part)
        tokens = tokens + mask.sum().astype(jnp.float32)
        sequences = sequences + _sequence_count(mask, part.segment_ids_bt)
        roles = part.token_roles()
        role_tokens = role_tokens + jnp.stack(
            [((mask | anchor) & (roles == r)).sum() for r in range(len(ROLE_NAMES))]
        ).astype(jnp.float32)
    # Dr.GRPO's budget defaults to the row width; packed rows are as wide as the unpacked ones would be
    # (collate packs into the longest sample's bucketed width), so packing leaves it unchanged.
    width = max(part.tokens_bt.shape[1] for part in parts)
    budget = cfg.dr_grpo_tokens if cfg.dr_grpo_tokens is not None else width
    return LossNormalisers(
        tokens=jnp.asarray(tokens, jnp.float32),
        sequences=jnp.asarray(sequences, jnp.float32),
        dr_grpo_denominator=sequences * float(budget),
        role_tokens=role_tokens,
    )


def aggregation_weights(
    mask_bt: jax.Array, norm: LossNormalisers, aggregation: str, segment_ids_bt: jax.Array | None = None
) -> jax.Array:
    """w_bt such that the batch loss is sum(w_bt * loss_bt); zero off the loss mask.

    token: 1 / (loss tokens in the batch); sequence: 1 / (tokens of that sequence * sequences);
    dr_grpo: 1 / (sequences * constant budget), so long answers are not down-weighted. A sequence is a
    row, or with `segment_ids_bt` one packed segment of a row.
    """
    m = mask_bt.astype(jnp.float32)
    if aggregation == "token":
        return m / jnp.maximum(norm.tokens, 1.0)
    if aggregation == "sequence":
        seq_tokens = _sequence_tokens(mask_bt, segment_ids_bt)
        return m / jnp.maximum(seq_tokens, 1.0) / jnp.maximum(norm.sequences, 1.0)
    if aggregation == "dr_grpo":
        return m / jnp.maximum(norm.dr_grpo_denominator, 1.0)
    raise ValueError(f"aggregation {aggregation!r} is not one of token, sequence, dr_grpo")


def truncated_importance_weights(logp_current, logp_behaviour, cap: float | None = 2.0, mask=None) -> jax.Array:
    """TIS weights min(exp(logp_current - logp_behaviour), cap) with no gradient; 0 off `mask`.

    Corrects a sample drawn by an older (behaviour) policy toward the current one without unbounded
    variance (the delayed designer update). `cap=None` turns the correction off (weights 1).
    """
    current = jnp.asarray(logp_current, jnp.float32)
    if cap is None:
        weights = jnp.ones_like(current)
    else:
        log_ratio = jnp.clip(current - jnp.asarray(logp_behaviour, jnp.float32), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        weights = jnp.minimum(jnp.exp(log_ratio), cap)
    if mask is not None:
        weights = jnp.where(jnp.asarray(mask, bool), weights, 0.0)
    return jax.lax.stop_gradient(weights)


def kl_penalty(logp_bt: jax.Array, ref_logprobs_bt: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token estimate of KL(pi || ref) from the sampled tokens' logprobs (Schulman's estimators).

    k1 = logp - ref: unbiased, can be negative, and as a loss its gradient is just grad logp.
    k3 = exp(ref - logp) - (ref - logp) - 1 >= 0: unbiased, low variance (GRPO's KL term).
    """
    logp = logp_bt.astype(jnp.float32)
    ref = ref_logprobs_bt.astype(jnp.float32)
    if estimator == "k1":
        return logp - ref
    if estimator == "k3":
        d = jnp.clip(ref - logp, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return jnp.exp(d) - d - 1.0
    raise ValueError(f"kl_estimator {estimator!r} is not one of {KL_ESTIMATORS}")


def grpo_token_terms(
    logp_bt: jax.Array,
    behaviour_logprobs_bt: jax.Array,
    advantages_bt: jax.Array,
    cfg: RLConfig,
    *,
    stale_b: jax.Array | None = None,
    old_logprobs_bt: jax.Array | None = None,
    ref_logprobs_bt: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """Per-token loss pieces (unmasked), decoupled-PPO style.

    The clip is measured against a proximal policy: `old_logprobs_bt` if given, else the behaviour
    policy; for stale rows it is the current policy (detached), whose ratio is 1 in value. The
    surrogate is then multiplied by the truncated importance weight min(pi_prox / pi_behaviour,
    tis_cap), which is exactly 1 for fresh rows without `old_logprobs_bt` and corrects stale rows.
    With `ref_logprobs_bt`, `kl` is `kl_penalty(logp, ref, cfg.kl_estimator)`; else 0.
    """
    logp = logp_bt.astype(jnp.float32)
    behaviour = behaviour_logprobs_bt.astype(jnp.float32)
    prox = behaviour if old_logprobs_bt is None else old_logprobs_bt.astype(jnp.float32)
    if stale_b is not None:
        stale = stale_b if stale_b.ndim == 2 else stale_b[:, None]  # per token ([B, T]) or per row ([B])
        prox = jnp.where(stale, jax.lax.stop_gradient(logp), prox)
    log_ratio = jnp.clip(logp - prox, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = jnp.exp(log_ratio)
    tis_weight = truncated_importance_weights(prox, behaviour, cfg.tis_cap)
    adv = advantages_bt.astype(jnp.float32)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    pg = -tis_weight * jnp.minimum(unclipped, clipped)
    is_clipped = ((ratio < 1.0 - cfg.eps_low) & (adv < 0)) | ((ratio > 1.0 + cfg.eps_high) & (adv > 0))
    if ref_logprobs_bt is None:
        kl = jnp.zeros_like(logp)
    else:
        kl = kl_penalty(logp, ref_logprobs_bt, cfg.kl_estimator)
    neg = jax.lax.stop_gradient(-log_ratio)
    approx_kl = jnp.exp(neg) - neg - 1.0  # k3 of KL(pi_prox || pi), a drift monitor
    return {
        "pg": pg,
        "kl": kl,
        "loss": pg + cfg.kl_coef * kl,
        "ratio": jax.lax.stop_gradient(ratio),
        "is_clipped": is_clipped,
        "tis_weight": tis_weight,
        "approx_kl": approx_kl,
        "entropy": jax.lax.stop_gradient(-logp),  # Monte Carlo estimate from the sampled tokens
    }


def grpo_loss(
    logp_bt: jax.Array, batch: TrainBatch, cfg: RLConfig, norm: LossNormalisers | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of one (micro-)batch; every metric is a sum that adds up over micro-batches.

    `norm` holds the full batch's counts; None computes them from this batch (no micro-batching).
    Anchor rows (role ANCHOR) add `cfg.anchor_coef` times their mean negative log-likelihood per token
    (InstructGPT's PPO-ptx term, on the starting policy's own replies: docs/rl.md, "The anchor") and take
    no part in the policy-gradient terms or metrics.
    """
    if cfg.kl_coef > 0 and batch.ref_logprobs_bt is None:
        raise ValueError(
            "kl_coef > 0 needs TrainBatch.ref_logprobs_bt; the train step fills it from its reference "
            "params (TrainStep.reference_params(model), held by the Learner)"
        )
    if norm is None:
        norm = loss_normalisers(batch, cfg)
    mask, anchor = policy_and_anchor_masks(batch)
    terms = grpo_token_terms(
        logp_bt,
        batch.behaviour_logprobs_bt,
        batch.token_advantages(),
        cfg,
        stale_b=batch.token_stale(),
        old_logprobs_bt=batch.old_logprobs_bt,
        ref_logprobs_bt=batch.ref_logprobs_bt,
    )
    w = aggregation_weights(mask, norm, cfg.aggregation, batch.segment_ids_bt)
    per_token = mask.astype(jnp.float32) / jnp.maximum(norm.tokens, 1.0)

    def wsum(x, weights):
        return jnp.sum(jnp.where(mask, x.astype(jnp.float32) * weights, 0.0))

    anchor_nll = jnp.sum(jnp.where(anchor, -logp_bt.astype(jnp.float32), 0.0)) / jnp.maximum(
        norm.role_tokens[ANCHOR], 1.0
    )
    loss = wsum(terms["loss"], w) + cfg.anchor_coef * anchor_nll
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "pg_loss": jax.lax.stop_gradient(wsum(terms["pg"], w)),
        "kl": jax.lax.stop_gradient(wsum(terms["kl"], per_token)),
        "clip_frac": wsum(terms["is_clipped"], per_token),
        "approx_kl": wsum(terms["approx_kl"], per_token),
        "entropy": wsum(terms["entropy"], per_token),
        "tis_weight": wsum(terms["tis_weight"], per_token),
        "ratio": wsum(terms["ratio"], per_token),
        "anchor/nll": jax.lax.stop_gradient(anchor_nll),
    }
    adv = batch.token_advantages()
    roles = batch.token_roles()
    for r, name in enumerate(ROLE_NAMES):
        if r == ANCHOR:  # no advantage: trained by likelihood
            continue
        in_role = roles == r
        role_weight = mask.astype(jnp.float32) / jnp.maximum(norm.role_tokens[r], 1.0)
        metrics[f"{name}/advantage_mean"] = wsum(jnp.where(in_role, adv, 0.0), role_weight)
    return loss, metrics


def _score(model, hidden_bke, targets_bk, chunk: int | None = None) -> jax.Array:
    """log-softmax of the output projection at `targets_bk`, [B, K] float32; with `chunk`, `chunk`
    columns at a time under `jax.checkpoint`, so neither pass holds the full [B, K, V] logits."""

    def score(h_bke, y_bk):
        logits = model.logits(h_bke)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, y_bk[..., None], axis=-1)[..., 0]
        return picked - lse

    b, k = targets_bk.shape
    if chunk is None or chunk >= k:
        return score(hidden_bke, targets_bk)
    n = -(-k // chunk)
    pad = n * chunk - k
    h = jnp.pad(hidden_bke, ((0, 0), (0, pad), (0, 0)))
    y = jnp.pad(targets_bk, ((0, 0), (0, pad)))
    h = h.reshape(b, n, chunk, -1).swapaxes(0, 1)
    y = y.reshape(b, n, chunk).swapaxes(0, 1)
    logp = jax.lax.map(lambda args: jax.checkpoint(score)(*args), (h, y))
    return logp.swapaxes(0, 1).reshape(b, n * chunk)[:, :k]


def token_logprobs(
    model, tokens_bt, positions_bt, valid_bt, chunk: int | None = None, segment_ids_bt=None, prefix_ids_bt=None
) -> jax.Array:
    """log p(tokens_bt[:, t] | tokens_bt[:, :t]) as [B, T] float32, column 0 set to 0.

    Every column is scored (see `token_logprobs_at` for the loss columns only). With `chunk`, the output
    projection and log-softmax run over `chunk` time steps at a time under `jax.checkpoint`, so neither
    pass holds the full [B, T, V] logits. `segment_ids_bt`, `prefix_ids_bt`: packed rows and their shared
    prompts (`TrainBatch`).
    """
    hidden, _ = model.hidden_states(tokens_bt, positions_bt, valid_bt, segment_ids_bt=segment_ids_bt,
                                    prefix_ids_bt=prefix_ids_bt)
    logp = _score(model, hidden[:, :-1], tokens_bt[:, 1:], chunk)
    return jnp.pad(logp, ((0, 0), (1, 0)))


def token_logprobs_at(
    model, tokens_bt, positions_bt, valid_bt, index_bk, chunk: int | None = None, segment_ids_bt=None,
    prefix_ids_bt=None,
) -> jax.Array:
    """`token_logprobs` at the columns `index_bk` only ([B, K], 0 = none), zeros elsewhere, [B, T] float32.

    Every position still runs through the decoder (it is context), but the output projection (the tied
    49152 x 576 embedding is a fifth of SmolLM2's forward) and the log-softmax run on K columns per row.
    The columns are picked and put back by one-hot matmuls, exact (one nonzero term per output): as a
    gather and its scatter-add gradient inside the update's scan, XLA:CPU compiled SmolLM2's update for
    over 6 minutes without finishing.
    """
    hidden, _ = model.hidden_states(tokens_bt, positions_bt, valid_bt, segment_ids_bt=segment_ids_bt,
                                    prefix_ids_bt=prefix_ids_bt)
    hidden = jnp.where(jnp.asarray(valid_bt, bool)[..., None], hidden, 0)  # 0 x a padded NaN is NaN
    index = jnp.asarray(index_bk, jnp.int32)
    width = tokens_bt.shape[1]
    exact = jax.lax.Precision.HIGHEST  # no bf16 passes for float32 operands (TPU's default)
    pick = jax.nn.one_hot(jnp.maximum(index - 1, 0), width, dtype=hidden.dtype)  # the state that predicts t
    h = jnp.einsum("bkt,btd->bkd", pick, hidden, precision=exact)
    targets = jnp.take_along_axis(jnp.asarray(tokens_bt, jnp.int32), index, axis=1)  # no gradient flows here
    logp = jnp.where(index > 0, _score(model, h, targets, chunk), 0.0)
    place = jax.nn.one_hot(index, width, dtype=jnp.float32)
    return jnp.einsum("bk,bkt->bt", logp, place, precision=exact)


def score_index(loss_mask_bt, valid_bt, minimum: int = 8) -> np.ndarray:
    """Host side: `TrainBatch.score_index_bk` for these masks, K a power of two (few compiled shapes)."""
    mask = np.asarray(loss_mask_bt, bool) & np.asarray(valid_bt, bool)
    mask[:, 0] = False
    counts = mask.sum(axis=1)
    k = max(minimum, 1 << max(0, (int(counts.max(initial=0)) - 1).bit_length()))
    index = np.zeros((mask.shape[0], k), np.int32)
    for row in range(mask.shape[0]):
        cols = np.flatnonzero(mask[row])
        index[row, : len(cols)] = cols
    return index
