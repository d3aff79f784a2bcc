"""Designer score math against hand-computed values and numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.curriculum import CurriculumConfig
from spade_jax.curriculum.scores import (
    DESIGNER_SCORES,
    ScoreInputs,
    designer_advantages,
    designer_scale,
    designer_scores,
    hint_regret,
    learnability,
    learning_potential,
    learning_potential_init,
    learning_potential_score,
    learning_potential_update,
    paired_regret,
    plateau,
    solve_rate_band,
    spade_blend,
)

W = [0.0, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 1.0]
# Worked by hand: 1 on [0.4, 0.6], 1 - distance / 0.25 outside, floored at 0.
PLATEAU = [0.0, 0.0, 0.0, 0.2, 0.6, 1.0, 1.0, 1.0, 0.6, 0.2, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("to_array", [np.asarray, jnp.asarray])
def test_plateau_hand_values(to_array):
    out = plateau(to_array(W))
    np.testing.assert_allclose(np.asarray(out), PLATEAU, atol=1e-6)
    np.testing.assert_allclose(np.asarray(solve_rate_band(to_array(W))), PLATEAU, atol=1e-6)
    assert isinstance(out, jax.Array) == (to_array is jnp.asarray)


def test_plateau_custom_band_and_zero_ramp():
    np.testing.assert_allclose(
        plateau([0.1, 0.3, 0.5, 0.9], low=0.2, high=0.4, ramp=0.5), [0.8, 1.0, 0.8, 0.0], atol=1e-6
    )
    np.testing.assert_allclose(plateau([0.39, 0.4, 0.6, 0.61], ramp=0.0), [0, 1, 1, 0])


def test_hint_regret_and_blend_hand_values():
    regret = hint_regret([0.575, 0.6, 0.1, 0.5], [0.5, 0.3, 0.2, 0.5])
    np.testing.assert_allclose(regret, [0.075, 0.3, -0.1, 0.0], atol=1e-6)
    win = [0.5, 0.3, 0.95, 0.7]
    # 0.4 * clip(r / 0.15, 0, 1) + 0.6 * plateau(w):
    # 0.4*0.5 + 0.6*1 = 0.8; 0.4*1 + 0.6*0.6 = 0.76; 0 + 0 = 0; 0 + 0.6*0.6 = 0.36
    np.testing.assert_allclose(spade_blend(regret, win), [0.8, 0.76, 0.0, 0.36], atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(spade_blend(jnp.asarray(regret), jnp.asarray(win))), [0.8, 0.76, 0.0, 0.36], atol=1e-6
    )


def test_learnability_and_paired():
    np.testing.assert_allclose(learnability([0.0, 0.125, 0.5, 0.875, 1.0]), [0.0, 0.875, 0.5, 0.125, 0.0])
    np.testing.assert_allclose(paired_regret([1.0, 0.2, 0.5], [0.25, 0.5, 0.5]), [0.75, 0.0, 0.0])


def _ema_reference(history, fast, slow):
    out = []
    for row in history:
        f = s = None
        for w in row:
            if np.isnan(w):
                continue
            f, s = (w, w) if f is None else (f + fast * (w - f), s + slow * (w - s))
        out.append(0.0 if f is None else abs(f - s))
    return np.array(out)


def test_learning_potential_matches_hand_and_loop_reference():
    # fast: 0.2 -> 0.3 -> 0.55; slow: 0.2 -> 0.22 -> 0.278; |0.55 - 0.278| = 0.272
    np.testing.assert_allclose(np.asarray(learning_potential([[0.2, 0.4, 0.8]])), [0.272], atol=1e-6)
    rng = np.random.default_rng(0)
    history = rng.random((5, 7))
    history[1, [0, 3]] = np.nan
    history[2, :] = np.nan
    np.testing.assert_allclose(np.asarray(learning_potential(history, 0.6, 0.05)),
                               _ema_reference(history, 0.6, 0.05), atol=1e-5)


def test_learning_potential_state_is_a_pytree():
    state = learning_potential_init(2)
    update = jax.jit(learning_potential_update)
    for w in ([0.0, 1.0], [1.0, 1.0]):
        state = update(state, jnp.asarray(w))
    assert jax.tree_util.tree_structure(state).num_leaves == 3
    np.testing.assert_allclose(np.asarray(learning_potential_score(state)), [0.4, 0.0], atol=1e-6)


def test_registry_names_and_invalid_and_hung():
    assert set(DESIGNER_SCORES) == {
        "spade_blend", "hint_regret", "solve_rate", "learning_potential", "learnability", "paired"
    }
    x = ScoreInputs(r_hint=[0.6, 0.6, 0.6], r_nohint=[0.5, 0.5, 0.5], win_rate=[0.5, 0.5, 0.5],
                    valid=[True, False, True], hung=[False, False, True])
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig(score="hint_regret")), [0.1, 0.0, -0.5], atol=1e-6)
    # The hung penalty belongs to the pure-regret variant only.
    blend = 0.4 * (0.1 / 0.15) + 0.6
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig()), [blend, 0.0, blend], atol=1e-6)
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig(score="learnability")), [0.5, 0.0, 0.5])
    paired = x._replace(r_hint_max=[1.0, 1.0, 0.2])
    np.testing.assert_allclose(designer_scores(paired, CurriculumConfig(score="paired")), [0.5, 0.0, 0.0])
    lp = x._replace(win_rate_history=[[0.2, 0.4, 0.8]] * 3)
    np.testing.assert_allclose(np.asarray(designer_scores(lp, CurriculumConfig(score="learning_potential"))),
                               [0.272, 0.0, 0.272], atol=1e-6)


def test_config_rejects_unknown_score():
    with pytest.raises(ValueError, match="unknown"):
        CurriculumConfig(score="regret")
    with pytest.raises(ValueError, match="band_low"):
        CurriculumConfig(band_low=0.7, band_high=0.6)


def test_designer_scale():
    assert designer_scale(768, 24, 4) == 50.0  # 768 / 24 * 4 = 128, capped
    assert designer_scale(12, 24, 4) == 2.0
    assert designer_scale(12, 24, 4, max_scale=1.5) == 1.5


def test_designer_advantages_per_skill_centring_no_std():
    scores = [0.8, 0.2, 0.5, 0.0]
    # skill a: mean 0.5 -> [0.3, -0.3]; skill b: mean 0.25 -> [0.25, -0.25]; scale 50
    expected = [15.0, -15.0, 12.5, -12.5]
    np.testing.assert_allclose(designer_advantages(scores, ["a", "a", "b", "b"], 768, 24, 4), expected, atol=1e-5)
    out = designer_advantages(jnp.asarray(scores), jnp.asarray([1, 1, 0, 0]), 768, 24, 4, num_skills=6)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
    # Interleaved labels and a singleton skill (advantage 0).
    np.testing.assert_allclose(designer_advantages([1.0, 0.0, 0.5, 0.2], ["x", "y", "x", "z"], 12, 24, 4),
                               [0.5, 0.0, -0.5, 0.0], atol=1e-6)


def test_pure_regret_floors_negative_regret_and_plateau_reads_the_mean_reward():
    # Reference: regret variant max(0, r_hint - r_nohint); the plateau's w is the mean raw reward
    # over the window (failed plays -1), not the share of plays won.
    x = ScoreInputs(r_hint=[0.2, 0.5], r_nohint=[0.5, 0.2], win_rate=[0.5, 0.5], mean_reward=[0.5, -0.1])
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig(score="hint_regret")), [0.0, 0.3], atol=1e-6)
    # Blend: regret_norm = clip(-0.3 / 0.15) = 0 and clip(0.3 / 0.15) = 1; plateau(0.5) = 1,
    # plateau(-0.1) = 1 - 0.5 / 0.25 -> 0.
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig()), [0.6, 0.4], atol=1e-6)
    np.testing.assert_allclose(designer_scores(x, CurriculumConfig(plateau_input="win_rate")), [0.6, 1.0], atol=1e-6)


def test_scores_and_advantages_trace_under_jit():
    cfg = CurriculumConfig()
    score = jax.jit(lambda a, b, w, v: designer_scores(ScoreInputs(a, b, w, valid=v), cfg))
    out = score(jnp.asarray([0.6, 0.6]), jnp.asarray([0.5, 0.5]), jnp.asarray([0.5, 0.5]), jnp.asarray([True, False]))
    np.testing.assert_allclose(np.asarray(out), [0.4 * (0.1 / 0.15) + 0.6, 0.0], atol=1e-6)
    advantages = jax.jit(lambda s, k: designer_advantages(s, k, 12, 24, 4, num_skills=6))
    np.testing.assert_allclose(np.asarray(advantages(jnp.asarray([0.8, 0.2, 0.5, 0.0]), jnp.asarray([1, 1, 0, 0]))),
                               [0.6, -0.6, 0.5, -0.5], atol=1e-6)
