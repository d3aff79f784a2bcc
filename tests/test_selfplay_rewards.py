"""The agent's training reward in self-play: the episode reward, plus the optional format bonus for
replies that hold a complete \\boxed{...} action; GRPO advantages are z-scores within each group."""

import types

import numpy as np
import pytest

from spade_jax.config import load_config
from spade_jax.rollout import Trajectory
from spade_jax.selfplay import SelfPlay, boxed_share


def _trajectory(actions, won, group=("env1", "nohint")):
    n = len(actions)
    return Trajectory(
        tokens=[1, 2, 3], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -1.0, -1.0],
        observations=["o"] * (n + 1), actions=list(actions), rewards=[0.0] * (n - 1) + [1.0 if won else 0.0],
        group=group, terminated=True,
    )


def test_boxed_share_counts_complete_boxed_actions():
    assert boxed_share(_trajectory(["\\boxed{3}", "no action", "\\boxed{4", "so \\boxed {x}"], False)) == 0.5
    assert boxed_share(_trajectory([], False)) == 0.0


@pytest.mark.parametrize("bonus", [0.0, 0.2])
def test_format_bonus_enters_the_agent_advantage(bonus):
    config = load_config("tiny", [f"rl.format_bonus={bonus}", "train_on_hinted=false"])
    selfplay = SelfPlay(config, None, types.SimpleNamespace(sandbox=None), None, None)
    trajectories = [
        _trajectory(["\\boxed{1}", "\\boxed{2}"], won=True),
        _trajectory(["\\boxed{1}", "nothing"], won=False),
        _trajectory(["nothing", "nothing"], won=False),
    ]
    samples = selfplay.agent_samples(trajectories)
    rewards = np.array([1.0 + bonus, 0.5 * bonus, 0.0])
    want = (rewards - rewards.mean()) / (rewards.std(ddof=0) + 1e-8)  # SPADE's z-score (numpy, ddof=0)
    got = [round(s.advantage, 4) for s in samples]
    assert got == [round(float(a), 4) for a in want]
