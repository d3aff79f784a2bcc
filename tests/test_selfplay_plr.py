"""The PLR replay buffer inside the self-play loop: measured environments enter it, replays come out
of it with their slot, and the whole trainer state survives a JSON round trip (as in checkpoints)."""

import json
import types

import numpy as np
import pytest

from spade_jax.config import load_config
from spade_jax.envs.backends.sandbox import SandboxPool
from spade_jax.envs.library import library_program
from spade_jax.selfplay import PoolEnv, SelfPlay


@pytest.fixture(scope="module")
def sandbox():
    pool = SandboxPool(load_config("tiny").sandbox)
    yield pool
    pool.close()


def test_measured_envs_enter_the_buffer_and_replays_come_back(sandbox):
    config = load_config("tiny", ["curriculum.plr=true", "backend=sandbox", "curriculum.plr_min_fill=0.0",
                                  "curriculum.plr_replay_prob=1.0"])
    learner = types.SimpleNamespace(sandbox=sandbox)
    selfplay = SelfPlay(config, None, learner, None, None)
    program = library_program("knapsack")
    selfplay.pool = [PoolEnv("env00001", program.skill, "designer", program.source, True, r_hint=0.8, r_nohint=0.2,
                             wins=[0.5, 0.5])]
    selfplay.iteration = config.regen_interval
    selfplay.remember_pool()
    assert int(selfplay.plr.size) == 1
    np.testing.assert_allclose(float(selfplay.plr.scores[0]), 0.6, rtol=1e-6)  # hint regret 0.8 - 0.2

    replays = selfplay.replay_envs()
    assert len(replays) == 1
    replay = replays[0]
    assert replay.origin == "replay" and replay.valid and replay.plr_slot == 0 and replay.source == program.source

    # A replay is rescored when its window closes, not inserted twice.
    replay.r_hint, replay.r_nohint, replay.wins = 0.3, 0.3, [0.9]
    selfplay.pool = [replay]
    selfplay.remember_pool()
    assert int(selfplay.plr.size) == 1 and float(selfplay.plr.scores[0]) == 0.0

    restored = SelfPlay(config, None, learner, None, None)
    restored.load_state_dict(json.loads(json.dumps(selfplay.state_dict())))
    for a, b in zip(vars(selfplay.plr).values(), vars(restored.plr).values()):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored.plr_levels == selfplay.plr_levels and restored.pool[0].plr_slot == 0
