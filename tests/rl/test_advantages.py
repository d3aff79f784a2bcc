"""Advantage estimators against loop-based numpy references written here."""

import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.rl import advantages as adv


def _groups(rewards, group_ids, mask):
    out = {}
    for i, g in enumerate(group_ids):
        if mask[i]:
            out.setdefault(g, []).append(rewards[i])
    return out


def ref_zscore(rewards, group_ids, mask, eps=1e-8, ddof=0):
    groups = _groups(rewards, group_ids, mask)
    out = np.zeros(len(rewards))
    for i, g in enumerate(group_ids):
        vals = np.array(groups.get(g, []))
        if mask[i] and len(vals) > ddof:
            out[i] = (rewards[i] - vals.mean()) / (vals.std(ddof=ddof) + eps)
    return out


def ref_centered(rewards, group_ids, mask, scale=1.0):
    groups = _groups(rewards, group_ids, mask)
    return np.array([(r - np.mean(groups[g])) * scale if m else 0.0
                     for r, g, m in zip(rewards, group_ids, mask)])


def ref_rloo(rewards, group_ids, mask):
    out = np.zeros(len(rewards))
    for i, g in enumerate(group_ids):
        others = [rewards[j] for j in range(len(rewards)) if j != i and group_ids[j] == g and mask[j]]
        if mask[i] and others:
            out[i] = rewards[i] - np.mean(others)
    return out


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    group_ids = rng.choice([7, -2, 40, 5], size=37)  # arbitrary, non-contiguous ids
    group_ids[-1] = 99  # a group of one
    rewards = rng.choice([0.0, 1.0, 0.5, -1.0], size=37)
    rewards[group_ids == 40] = 1.0  # a group with no spread
    mask = rng.random(37) > 0.15
    mask[-1] = True
    return rewards, group_ids, mask


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("backend", [np.asarray, jnp.asarray])
def test_estimators_match_numpy_reference(data, use_mask, backend):
    rewards, group_ids, mask = data
    mask_ref = mask if use_mask else np.ones_like(mask)
    kw = {"mask": backend(mask)} if use_mask else {}
    r, g = backend(rewards), backend(group_ids)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.grpo_zscore(r, g, **kw), ref_zscore(rewards, group_ids, mask_ref), **tol)
    np.testing.assert_allclose(
        adv.grpo_zscore(r, g, ddof=1, eps=1e-6, **kw), ref_zscore(rewards, group_ids, mask_ref, eps=1e-6, ddof=1), **tol
    )
    np.testing.assert_allclose(adv.rloo(r, g, **kw), ref_rloo(rewards, group_ids, mask_ref), **tol)
    np.testing.assert_allclose(adv.dr_grpo(r, g, **kw), ref_centered(rewards, group_ids, mask_ref), **tol)


def test_output_type_follows_input(data):
    rewards, group_ids, _ = data
    assert isinstance(adv.grpo_zscore(rewards, group_ids), np.ndarray)
    assert not isinstance(adv.grpo_zscore(jnp.asarray(rewards), jnp.asarray(group_ids)), np.ndarray)


def test_degenerate_groups_get_zero(data):
    rewards, group_ids, _ = data
    for name in ("grpo_zscore", "rloo"):
        out = adv.compute_advantages(name, rewards, group_ids)
        assert out[-1] == 0.0  # group of one
        assert np.all(out[group_ids == 40] == 0.0)  # no spread
        assert np.all(np.isfinite(out))


def test_registry_by_name_and_errors():
    assert {"grpo_zscore", "rloo", "dr_grpo"} <= set(adv.ADVANTAGE_ESTIMATORS)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        adv.get_advantage_estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        adv.register_advantage_estimator("rloo")(lambda r, g: r)
    with pytest.raises(ValueError, match="same length"):
        adv.grpo_zscore(np.zeros(3), np.zeros(4))
