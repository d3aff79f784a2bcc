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
