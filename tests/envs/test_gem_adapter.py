"""Tests of spade_jax.envs.gem_adapter: GEM environments behind our API with private global-RNG
state, GEM's offline ids, and our library registered in GEM's registry."""

import random

import numpy as np
import pytest

from spade_jax.envs.api import TextEnv, run_episode
from spade_jax.envs.gem_adapter import GemEnv, _gem, gem_offline_ids, make_gem_env, register_library_in_gem

GUESS = "game:GuessTheNumber-v0-easy"
pytestmark = pytest.mark.timeout(120)


def test_matches_raw_gem_episode():
    gem = _gem()
    raw = gem.make(GUESS)
    wrapped = make_gem_env(GUESS)
    assert isinstance(wrapped, TextEnv)
    for seed in (0, 3):
        assert wrapped.reset(seed=seed)[0] == raw.reset(seed=seed)[0]
        for action in ("\\boxed{10}", "\\boxed{5}", "\\boxed{7}"):
            got, want = wrapped.step(action), raw.step(action)
            assert got[:4] == tuple(want[:4])
            if got[2] or got[3]:
                break


def test_callers_global_rng_is_untouched():
    env = make_gem_env(GUESS)
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    env.reset(seed=123)  # GEM reseeds the global generators here
    env.step("\\boxed{3}")
    assert (random.random(), np.random.rand()) == expected


def test_interleaved_envs_do_not_change_each_others_episodes():
    gem = _gem()

    def alone():
        env = GemEnv(gem.make(GUESS), GUESS, entropy=11)
        return [env.reset()[0] for _ in range(3)]

    reference = alone()
    a = GemEnv(gem.make(GUESS), GUESS, entropy=11)
    b = GemEnv(gem.make(GUESS), GUESS, entropy=99)
    interleaved = []
    for i in range(3):
        b.reset(seed=i)  # reseeds the global generators inside b's private copy only
        interleaved.append(a.reset()[0])
        b.reset()
    assert interleaved == reference


def test_offline_ids_include_games_and_reasoning_gym():
    ids = gem_offline_ids()
    assert GUESS in ids
    assert any(i.startswith("rg:") for i in ids)
    assert not any(i.startswith("game:Wordle") for i in ids)


def test_reasoning_gym_env_through_our_api():
    env_id = next(i for i in gem_offline_ids() if i.startswith("rg:") and "leg_counting" in i)
    env = make_gem_env(env_id)
    episode = run_episode(env, lambda obs: "\\boxed{4}", seed=0, max_turns=3)
    assert episode.observations[0] and episode.turns >= 1


def test_library_registered_in_gem():
    from spade_jax.envs.library import library_programs, load_library_env

    ids = register_library_in_gem()
    assert register_library_in_gem() == ids  # idempotent
    assert len(ids) == len(library_programs())
    program = library_programs()[0]
    env_id = "spade:" + program.class_name[: -len("Env")]
    assert env_id in ids
    via_gem = _gem().make(env_id)
    direct = load_library_env(program.name)
    assert via_gem.reset(seed=4)[0] == direct.reset(seed=4)[0]
    wrapped = make_gem_env(env_id)
    assert wrapped.reset(seed=4)[0] == direct.reset(seed=4)[0]


def test_unknown_id_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown GEM environment id"):
        make_gem_env("game:NoSuchGame-v0")
    with pytest.raises(ValueError, match="needs downloads"):
        make_gem_env("game:Wordle-v0-easy")
