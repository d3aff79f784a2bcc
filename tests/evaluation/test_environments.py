"""spade_jax.evaluation.environments: GEM games isolated from the global RNG and from each other,
reasoning-gym items as reasoning-gym makes and scores them."""

from __future__ import annotations

import random

import numpy as np

from spade_jax import evaluation as ev


def _gem_transcript(env_id, seed, actions):
    """Observations of one episode played on GEM directly, with nothing interleaved."""
    import gem

    env = gem.make(env_id)
    obs, info = env.reset(seed=seed)
    out = [(obs, info.get("suffix"))]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, info.get("suffix"), reward))
        if terminated or truncated:
            break
    return out



def test_rng_isolation_matches_gem_played_alone():
    env_id = "game:Minesweeper-v0-easy"
    actions = ["\\boxed{reveal 2 2}", "\\boxed{reveal 0 0}", "\\boxed{reveal 4 4}"]
    expected = {seed: _gem_transcript(env_id, seed, actions) for seed in (11, 12)}

    random.seed(123)
    np.random.seed(123)
    py_before, np_before = random.getstate(), np.random.get_state()[1].copy()
    # Two Minesweeper boards and a 2048 game (which draws tiles from the global RNG on every
    # step) played in lockstep must each see exactly what GEM shows when played alone.
    env_a, env_b = ev.make_eval_env(env_id), ev.make_eval_env(env_id)
    other = ev.make_eval_env("game:Game2048-v0-easy")
    first = [env_a.reset(11), env_b.reset(12), other.reset(99)]
    got = {11: [first[0]], 12: [first[1]]}
    done = {11: False, 12: False}
    for action in actions:
        for seed, env in ((11, env_a), (12, env_b)):
            if not done[seed]:
                obs, reward, terminated, truncated = env.step(action)
                got[seed].append((obs, reward))
                done[seed] = terminated or truncated
            other.step("\\boxed{left}")
    for seed in (11, 12):
        exp = expected[seed]
        assert got[seed][0] == f"{exp[0][0].strip()}\n{exp[0][1].strip()}"
        for (obs, reward), (e_obs, e_suffix, e_reward) in zip(got[seed][1:], exp[1:]):
            assert obs == f"{e_obs.strip()}\n{e_suffix.strip()}" and reward == e_reward
        assert len(got[seed]) == len(exp)
    # The caller's global generators are untouched.
    assert random.getstate() == py_before
    assert (np.random.get_state()[1] == np_before).all()



def test_rg_item_matches_reasoning_gym():
    import reasoning_gym

    env = ev.make_eval_env("rg:maze")
    text = env.reset(7)
    entry = reasoning_gym.create_dataset("maze", size=1, seed=7)[0]
    assert text.startswith(entry["question"].strip())
    _, score, terminated, _ = env.step(f"\\boxed{{{entry['answer']}}}")
    assert terminated and score == 1.0 and env.success
    env.reset(7)
    env.step(entry["answer"])  # not boxed: not read, as in GEM
    assert not env.success
