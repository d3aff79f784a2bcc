"""Advantage estimators for GRPO-style updates, registered by name and chosen per role by config.

Each estimator maps per-sample rewards and integer group ids to per-sample advantages, with numpy or jnp.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

AdvantageFn = Callable[..., "np.ndarray | jax.Array"]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage_estimator(name: str):
    """Decorator: make `fn(rewards, group_ids, *, mask=None, **kw)` selectable by `name` in configs."""

    def wrap(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered; pick another name")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


def get_advantage_estimator(name: str) -> AdvantageFn:
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(name: str, rewards, group_ids, **kwargs):
    """Runs the estimator registered as `name` (e.g. `RLConfig.agent_advantage`)."""
    return get_advantage_estimator(name)(rewards, group_ids, **kwargs)


def _group_stats(rewards, group_ids, mask):
    """Per-sample group count, mean and the array module, over samples with mask True.

    Groups are compared pairwise ([N, N] membership), which keeps shapes static under jit and
    accepts arbitrary integer ids; N is a rollout batch (hundreds to a few thousand samples).
    """
    xp = jnp if isinstance(rewards, jax.Array) or isinstance(group_ids, jax.Array) else np
    rewards = xp.asarray(rewards)
    rewards = rewards.astype(xp.float32 if xp is jnp else np.float64)
    group_ids = xp.asarray(group_ids)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D of the same length, got {rewards.shape} and {group_ids.shape}"
        )
    mask = xp.ones(rewards.shape, bool) if mask is None else xp.asarray(mask, bool)
    member = (group_ids[:, None] == group_ids[None, :]) & mask[None, :]
    member_f = member.astype(rewards.dtype)
    count = member_f.sum(axis=1)
    r = xp.where(mask, rewards, 0.0)
    mean = (member_f @ r) / xp.maximum(count, 1.0)
    return xp, rewards, mask, member_f, count, mean


@register_advantage_estimator("grpo_zscore")
def grpo_zscore(rewards, group_ids, *, mask=None, eps: float = 1e-8, ddof: int = 0):
    """GRPO (agent): (r - group mean) / (group std + eps); ddof=0 and eps=1e-8 as SPADE's reference
    (trajectory_build.py); TRL/verl use ddof=1 (torch.std).

    Groups of one (or with zero spread) get advantage 0. Samples with mask False are left out of
    the statistics and get 0.
    """
    xp, r, mask, member_f, count, mean = _group_stats(rewards, group_ids, mask)
    dev = xp.where(mask, r - mean, 0.0)
    sq = member_f @ (dev * dev)
    var = sq / xp.maximum(count - ddof, 1.0)
    std = xp.sqrt(var)
    return xp.where(mask & (count > ddof), dev / (std + eps), 0.0)


@register_advantage_estimator("rloo")
def rloo(rewards, group_ids, *, mask=None):
    """REINFORCE leave-one-out: r_i minus the mean of the other samples of its group."""
    xp, r, mask, _, count, mean = _group_stats(rewards, group_ids, mask)
    # r_i - (G * mean - r_i) / (G - 1) == G / (G - 1) * (r_i - mean)
    factor = count / xp.maximum(count - 1.0, 1.0)
    return xp.where(mask & (count > 1), factor * (r - mean), 0.0)


@register_advantage_estimator("dr_grpo")
def dr_grpo(rewards, group_ids, *, mask=None):
    """Dr.GRPO: r - group mean without the std division; pair it with `aggregation="dr_grpo"`."""
    xp, r, mask, _, _, mean = _group_stats(rewards, group_ids, mask)
    return xp.where(mask, r - mean, 0.0)
