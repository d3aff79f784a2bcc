"""spade_jax.evaluation.suites: the suites are valid, fixed and free of the training library's families."""

from __future__ import annotations

import pytest

from spade_jax import evaluation as ev
from spade_jax.evaluation import EvalTask


def test_suites_are_valid_and_fixed():
    heldout = ev.get_suite("heldout")
    ids = [t.env_id for t in heldout.tasks]
    assert "game:TowerofHanoi-v0-easy" in ids and "rg:zebra_puzzles" in ids
    # Puzzle families of the training library (KnightsKnavesEnv, GridMazeEnv) are not held out.
    assert "rg:knights_knaves" not in ids and "rg:maze" not in ids
    assert all(len(t.episode_seeds) == t.episodes for t in heldout.tasks)
    assert ev.get_suite("heldout").tasks[0].episode_seeds == heldout.tasks[0].episode_seeds
    assert all(t.episodes == 3 for t in ev.get_suite("quick", episodes=3).tasks)
    with pytest.raises(ValueError, match="choose one of"):
        ev.get_suite("nope")
    with pytest.raises(ValueError, match="must look like"):
        EvalTask("TowerofHanoi", 1, 1)
    with pytest.raises(ValueError, match="one seed per episode"):
        EvalTask("rg:maze", 2, 1, (1,))


def test_train_suite_plays_the_pool_programs_at_their_constants():
    """The `lib:` tasks are the library programs themselves: their own solution() wins at every seed,
    and the constants of the pool reach the game (2 rounds, not the default)."""
    import argparse

    from experiments.eval import UsageError, _train_suite
    from spade_jax.evaluation import TRAIN, train_suite
    from spade_jax.evaluation.environments import make_eval_env

    suite = train_suite("library:odd_one_out(ROUNDS=2, CHOICES=3), code_breaker", max_turns=8)
    assert suite.name == TRAIN
    assert [t.env_id for t in suite.tasks] == ["lib:odd_one_out(ROUNDS=2,CHOICES=3)", "lib:code_breaker"]
    assert all(t.episodes == 30 and t.max_turns == 8 for t in suite.tasks)
    for task in suite.tasks:
        for seed in task.episode_seeds[:3]:
            env = make_eval_env(task.env_id)
            env.reset(seed)
            actions = env._env.solution()
            for action in actions:
                _, reward, terminated, _ = env.step(action)
            assert env.success and terminated and reward == 1.0
    env = make_eval_env("lib:odd_one_out(ROUNDS=2,CHOICES=3)")
    env.reset(900_000)
    assert len(env._env.solution()) == 2
    wrong = [a for a in ("\\boxed{1}", "\\boxed{2}", "\\boxed{3}") if a != env._env.solution()[0]]
    env.step(wrong[0])
    _, reward, terminated, _ = env.step(wrong[1])  # two wrong picks: two lives gone
    assert terminated and not env.success and reward < 1.0

    with pytest.raises(ValueError, match="library:"):
        train_suite("envs/", max_turns=8)
    args = argparse.Namespace(run=None, env_pool=None, max_turns=None, episodes=None)
    with pytest.raises(UsageError, match="--env-pool"):
        _train_suite(args)


def test_train_suite_of_a_run_reads_its_pool_and_turn_cap(tmp_path):
    import argparse

    from experiments.eval import _train_suite

    (tmp_path / "config.yaml").write_text(
        "env_pool: 'library:switch_lights(COUNT=2, EXPERIMENTS=1)'\nrollout:\n  max_turns: 5\n")
    args = argparse.Namespace(run=str(tmp_path), env_pool=None, max_turns=None, episodes=4)
    (task,) = _train_suite(args).tasks
    assert (task.env_id, task.max_turns, task.episodes) == ("lib:switch_lights(COUNT=2,EXPERIMENTS=1)", 5, 4)
    args.max_turns, args.env_pool = 3, "library:code_breaker"
    (task,) = _train_suite(args).tasks
    assert (task.env_id, task.max_turns) == ("lib:code_breaker", 3)
