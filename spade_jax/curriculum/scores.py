"""Designer scores: hint regret, win-rate band, SPADE's blend and the ablation alternatives, and the
per-skill centred, scaled designer advantages: the one implementation the pipeline and tests use.
(The truncated importance weights of the delayed update live with the loss, in spade_jax.rl.losses.)"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def _xp(*arrays: Any):
    """jax.numpy when any input is a jax array (traced or concrete), numpy otherwise."""
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


def _asarray(xp, x, dtype=None):
    return xp.asarray(x, dtype=dtype if dtype is not None else xp.float32)


# ---------------------------------------------------------------------------------------------
# Elementary scores (pure, elementwise, numpy or jax)
# ---------------------------------------------------------------------------------------------


def hint_regret(r_hint, r_nohint):
    """SPADE's regret estimate: mean return with the privileged hint minus mean return without."""
    xp = _xp(r_hint, r_nohint)
    return _asarray(xp, r_hint) - _asarray(xp, r_nohint)


def plateau(w, low: float = 0.4, high: float = 0.6, ramp: float = 0.25):
    """1 for win rate w in [low, high], falling linearly to 0 over `ramp` on each side."""
    xp = _xp(w)
    w = _asarray(xp, w)
    distance = xp.maximum(xp.maximum(low - w, w - high), 0.0)
    if ramp <= 0:
        return (distance == 0).astype(w.dtype)
    return xp.clip(1.0 - distance / ramp, 0.0, 1.0)


def solve_rate_band(win_rate, low: float = 0.4, high: float = 0.6, ramp: float = 0.25):
    """Band-only designer score (SPADE ablation): the plateau of the agent's win rate."""
    return plateau(win_rate, low, high, ramp)


def spade_blend(
    regret,
    win_rate,
    regret_scale: float = 0.15,
    regret_weight: float = 0.4,
    band_weight: float = 0.6,
    low: float = 0.4,
    high: float = 0.6,
    ramp: float = 0.25,
):
    """SPADE's designer score: regret_weight * clip(regret / regret_scale, 0, 1) + band_weight * plateau(w)."""
    xp = _xp(regret, win_rate)
    regret_norm = xp.clip(_asarray(xp, regret) / regret_scale, 0.0, 1.0)
    return regret_weight * regret_norm + band_weight * plateau(win_rate, low, high, ramp)


def learnability(p):
    """Absolute Zero's proposer reward: 1 - p for a solve rate 0 < p < 1, else 0 (never or always solved)."""
    xp = _xp(p)
    p = _asarray(xp, p)
    return xp.where((p > 0.0) & (p < 1.0), 1.0 - p, 0.0)


def paired_regret(max_antagonist, mean_protagonist):
    """PAIRED's regret: max(best antagonist return - mean protagonist return, 0)."""
    xp = _xp(max_antagonist, mean_protagonist)
    return xp.maximum(_asarray(xp, max_antagonist) - _asarray(xp, mean_protagonist), 0.0)


# ---------------------------------------------------------------------------------------------
# Learning potential: |fast EMA - slow EMA| of the win rate
# ---------------------------------------------------------------------------------------------


@struct.dataclass
class LearningPotentialState:
    """Fast and slow exponential moving averages of each environment's win rate."""

    fast: jax.Array  # EMA with the large step (tracks recent win rate)
    slow: jax.Array  # EMA with the small step (tracks long-run win rate)
    count: jax.Array  # observations seen so far per environment (0 means uninitialised)


def learning_potential_init(num_envs: int) -> LearningPotentialState:
    zeros = jnp.zeros((num_envs,), jnp.float32)
    return LearningPotentialState(fast=zeros, slow=zeros, count=jnp.zeros((num_envs,), jnp.int32))


def learning_potential_update(
    state: LearningPotentialState, win_rate, fast_rate: float = 0.5, slow_rate: float = 0.1, mask=None
) -> LearningPotentialState:
    """Feed one win-rate observation per environment; the first observation initialises both EMAs."""
    w = jnp.asarray(win_rate, jnp.float32)
    seen = jnp.ones_like(state.count, bool) if mask is None else jnp.asarray(mask, bool)
    first = state.count == 0
    fast = jnp.where(first, w, state.fast + fast_rate * (w - state.fast))
    slow = jnp.where(first, w, state.slow + slow_rate * (w - state.slow))
    return LearningPotentialState(
        fast=jnp.where(seen, fast, state.fast),
        slow=jnp.where(seen, slow, state.slow),
        count=state.count + seen.astype(jnp.int32),
    )


def learning_potential_score(state: LearningPotentialState) -> jax.Array:
    return jnp.abs(state.fast - state.slow)


def learning_potential(win_rate_history, fast_rate: float = 0.5, slow_rate: float = 0.1):
    """|fast EMA - slow EMA| after feeding a [num_envs, T] win-rate history (NaN = not observed)."""
    history = jnp.asarray(win_rate_history, jnp.float32)
    if history.ndim == 1:
        history = history[:, None]
    state = learning_potential_init(history.shape[0])

    def step(state, w):
        return learning_potential_update(state, jnp.nan_to_num(w), fast_rate, slow_rate, mask=~jnp.isnan(w)), None

    state, _ = jax.lax.scan(step, state, history.T)
    return learning_potential_score(state)


# ---------------------------------------------------------------------------------------------
# Registry: designer score chosen by config name
# ---------------------------------------------------------------------------------------------


class ScoreInputs(NamedTuple):
    """What the curriculum measured for each of n environments (arrays of shape [n])."""

    r_hint: Any  # mean episode return with the hint, at the regeneration step
    r_nohint: Any  # mean episode return without the hint, at the regeneration step
    win_rate: Any  # agent's mean win rate (no hint) over the delay window
    valid: Any = None  # program passed validation; invalid -> score 0
    hung: Any = None  # some step() exceeded its time budget
    r_hint_max: Any = None  # best hinted episode return (PAIRED's antagonist); defaults to r_hint
    win_rate_history: Any = None  # [n, T] per-step win rates over the window (learning potential)
    mean_reward: Any = None  # mean raw episode reward over the window, failed plays -1 (SPADE's plateau input)


def plateau_input(x: ScoreInputs, cfg) -> Any:
    """The plateau's w: SPADE's mean raw episode reward over the window, or the share of plays won."""
    if getattr(cfg, "plateau_input", "win_rate") == "mean_reward" and x.mean_reward is not None:
        return x.mean_reward
    return x.win_rate


def _score_spade_blend(x: ScoreInputs, cfg) -> Any:
    return spade_blend(
        hint_regret(x.r_hint, x.r_nohint), plateau_input(x, cfg), cfg.regret_scale, cfg.regret_weight,
        cfg.band_weight, cfg.band_low, cfg.band_high, cfg.band_ramp,
    )


def _score_hint_regret(x: ScoreInputs, cfg) -> Any:
    """The pure-regret variant: negative regret is unreliable and floored at 0 (as the reference does)."""
    regret = hint_regret(x.r_hint, x.r_nohint)
    return _xp(regret).maximum(regret, 0.0)


def _score_solve_rate(x: ScoreInputs, cfg) -> Any:
    return solve_rate_band(plateau_input(x, cfg), cfg.band_low, cfg.band_high, cfg.band_ramp)


def _score_learning_potential(x: ScoreInputs, cfg) -> Any:
    history = x.win_rate_history if x.win_rate_history is not None else x.win_rate
    out = learning_potential(history, cfg.lp_fast_rate, cfg.lp_slow_rate)
    return out if _xp(x.win_rate, history) is jnp else np.asarray(out)


def _score_learnability(x: ScoreInputs, cfg) -> Any:
    return learnability(x.win_rate)


def _score_paired(x: ScoreInputs, cfg) -> Any:
    antagonist = x.r_hint_max if x.r_hint_max is not None else x.r_hint
    return paired_regret(antagonist, x.r_nohint)


DESIGNER_SCORES: dict[str, Callable[[ScoreInputs, Any], Any]] = {
    "spade_blend": _score_spade_blend,
    "hint_regret": _score_hint_regret,
    "solve_rate": _score_solve_rate,
    "learning_potential": _score_learning_potential,
    "learnability": _score_learnability,
    "paired": _score_paired,
}


def designer_scores(x: ScoreInputs, cfg) -> Any:
    """Score each environment with cfg.score; invalid programs score 0, hung ones cfg.hung_penalty
    in the pure-regret variant (SPADE), the score otherwise."""
    if cfg.score not in DESIGNER_SCORES:
        raise ValueError(f"unknown designer score {cfg.score!r}; choose one of {sorted(DESIGNER_SCORES)}")
    score = DESIGNER_SCORES[cfg.score](x, cfg)
    xp = _xp(score)
    score = _asarray(xp, score)
    if x.hung is not None and cfg.score == "hint_regret":
        score = xp.where(_asarray(xp, x.hung, bool), cfg.hung_penalty, score)
    if x.valid is not None:
        score = xp.where(_asarray(xp, x.valid, bool), score, 0.0)
    return score


# ---------------------------------------------------------------------------------------------
# Designer advantages and the delayed update
# ---------------------------------------------------------------------------------------------


def designer_scale(agent_samples: int, designer_samples: int, regen_interval: int, max_scale: float = 50.0) -> float:
    """SPADE's designer advantage scale: min(agent / designer samples * regen_interval, max_scale).
    It puts the few designer samples on a footing with the many agent samples in the shared batch."""
    if designer_samples <= 0:
        raise ValueError("designer_samples must be positive; a regeneration with no designs has no update")
    return float(min(agent_samples / designer_samples * regen_interval, max_scale))


def designer_advantages(
    scores,
    skills,
    agent_samples: int,
    designer_samples: int,
    regen_interval: int,
    max_scale: float = 50.0,
    num_skills: int | None = None,
):
    """(score - mean score of the same skill) * scale; no division by the std.

    `skills` holds one label per score: any hashables for numpy inputs, ints in [0, num_skills)
    for jax inputs. Every score passed takes part in its skill's mean (SPADE passes the kept, valid
    designs only).
    """
    scale = designer_scale(agent_samples, designer_samples, regen_interval, max_scale)
    if isinstance(scores, jax.Array) or isinstance(skills, jax.Array):
        scores = jnp.asarray(scores, jnp.float32)
        skill_ids = jnp.asarray(skills, jnp.int32)
        segments = num_skills if num_skills is not None else scores.shape[0]
        total = jax.ops.segment_sum(scores, skill_ids, num_segments=segments)
        count = jax.ops.segment_sum(jnp.ones_like(scores), skill_ids, num_segments=segments)
        baseline = (total / jnp.maximum(count, 1.0))[skill_ids]
        return (scores - baseline) * scale
    scores = np.asarray(scores, np.float32)
    labels = np.empty(len(skills), dtype=object)
    labels[:] = list(skills)
    _, skill_ids = np.unique(labels, return_inverse=True)
    skill_ids = skill_ids.reshape(-1)
    total = np.bincount(skill_ids, weights=scores)
    count = np.bincount(skill_ids)
    baseline = (total / np.maximum(count, 1.0))[skill_ids]
    return ((scores - baseline) * scale).astype(np.float32)
