"""PLR buffer: insertion, replay distribution against a numpy re-implementation of Robust PLR, staleness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.curriculum import plr


def _np_replay_probs(scores, timestamps, clock, beta, rho):
    """Robust PLR (Jiang et al. 2021): P_S = h(S_i)^(1/beta) / sum, h = 1 / rank; P_C = (c - C_i) / sum."""
    scores = np.asarray(scores, float)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    rank = np.empty(len(scores))
    for r, i in enumerate(order, 1):
        rank[i] = r
    h = (1.0 / rank) ** (1.0 / beta)
    p_score = h / h.sum()
    stale = clock - np.asarray(timestamps, float)
    p_stale = stale / stale.sum() if stale.sum() > 0 else np.full(len(scores), 1 / len(scores))
    return (1 - rho) * p_score + rho * p_stale


def _filled_state(scores, timestamps, clock, capacity):
    state = plr.plr_init(capacity)
    state, _ = plr.insert_batch(state, jnp.arange(len(scores)) + 100, jnp.asarray(scores))
    ts = jnp.zeros((capacity,), jnp.int32).at[: len(timestamps)].set(jnp.asarray(timestamps))
    return state.replace(timestamps=ts, replay_count=jnp.asarray(clock, jnp.int32))


@pytest.mark.parametrize("beta,rho", [(0.3, 0.3), (1.0, 0.0), (0.1, 0.5)])
def test_replay_weights_match_numpy_reference(beta, rho):
    scores = [0.2, 0.9, -0.1, 0.5, 0.45]
    timestamps = [0, 3, 5, 1, 5]
    state = _filled_state(scores, timestamps, clock=6, capacity=8)
    got = np.asarray(plr.replay_weights(state, beta, rho))
    np.testing.assert_allclose(got[:5], _np_replay_probs(scores, timestamps, 6, beta, rho), atol=1e-6)
    np.testing.assert_array_equal(got[5:], 0.0)  # empty slots are never replayed
    assert got.sum() == pytest.approx(1.0, abs=1e-6)


def test_staleness_is_uniform_when_everything_is_fresh():
    state = _filled_state([0.1, 0.2, 0.3], [4, 4, 4], clock=4, capacity=4)
    np.testing.assert_allclose(np.asarray(plr.staleness_weights(state)), [1 / 3, 1 / 3, 1 / 3, 0.0], atol=1e-6)


def test_insert_fills_then_replaces_the_weakest_only_when_better():
    state = plr.plr_init(3)
    for level, score in [(10, 0.5), (11, 0.1), (12, 0.7)]:
        state, slot = plr.insert(state, level, score)
    assert int(state.size) == 3 and int(slot) == 2
    state, slot = plr.insert(state, 13, 0.05)  # worse than the weakest (0.1): rejected
    assert int(slot) == -1 and list(np.asarray(state.level_ids)) == [10, 11, 12]
    state, slot = plr.insert(state, 14, 0.3)  # replaces level 11
    assert int(slot) == 1 and list(np.asarray(state.level_ids)) == [10, 14, 12]
    np.testing.assert_allclose(np.asarray(state.scores), [0.5, 0.3, 0.7])


def test_update_scores_ignores_negative_slots():
    state, _ = plr.insert_batch(plr.plr_init(4), jnp.arange(3), jnp.asarray([0.1, 0.2, 0.3]))
    state = plr.update_scores(state, jnp.asarray([2, -1, 0]), jnp.asarray([0.9, 5.0, 0.0]))
    np.testing.assert_allclose(np.asarray(state.scores), [0.0, 0.2, 0.9, 0.0])


def test_sample_replay_stamps_and_draws_distinct_filled_slots():
    state = _filled_state([0.3, 0.1, 0.8, 0.4], [0, 0, 0, 0], clock=2, capacity=6)
    new, slots, levels = jax.jit(plr.sample_replay, static_argnums=2)(jax.random.key(0), state, 3)
    slots = np.asarray(slots)
    assert len(set(slots.tolist())) == 3 and slots.max() < 4
    np.testing.assert_array_equal(np.asarray(levels), slots + 100)
    assert int(new.replay_count) == 3
    assert all(int(new.timestamps[s]) == 3 for s in slots)


def test_sample_frequencies_follow_the_replay_distribution():
    scores, timestamps = [0.3, 0.1, 0.8, 0.4], [0, 2, 1, 3]
    state = _filled_state(scores, timestamps, clock=4, capacity=4)
    keys = jax.random.split(jax.random.key(1), 20_000)
    _, slots, _ = jax.vmap(lambda k: plr.sample_replay(k, state, 1, 0.5, 0.3))(keys)
    freq = np.bincount(np.asarray(slots)[:, 0], minlength=4) / len(keys)
    np.testing.assert_allclose(freq, _np_replay_probs(scores, timestamps, 4, 0.5, 0.3), atol=0.015)


def test_should_replay_needs_min_fill():
    state = plr.plr_init(10)
    key = jax.random.key(0)
    assert not bool(plr.should_replay(key, state, replay_prob=1.0, min_fill=0.0))  # empty: at least one needed
    state, _ = plr.insert_batch(state, jnp.arange(4), jnp.ones(4))
    assert not bool(plr.should_replay(key, state, replay_prob=1.0, min_fill=0.5))
    assert bool(plr.should_replay(key, state, replay_prob=1.0, min_fill=0.4))
    draws = jax.vmap(lambda k: plr.should_replay(k, state, 0.25, 0.4))(jax.random.split(key, 4000))
    assert abs(float(draws.mean()) - 0.25) < 0.03


def test_state_round_trips_through_orbax(tmp_path):
    import orbax.checkpoint as ocp

    state, _ = plr.insert_batch(plr.plr_init(5), jnp.arange(3) + 7, jnp.asarray([0.1, 0.5, 0.2]))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "plr", state)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "plr", plr.plr_init(5))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert isinstance(restored, plr.PLRState)
