"""Environment failures during self-play: counted by kind in the iteration's metrics, logged with the
environment's id, and a play phase in which every play failed stops the run before any update."""

import logging
import types

import pytest

from spade_jax.config import load_config
from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import Generation, Trajectory
from spade_jax.run import PhaseTimer
from spade_jax.selfplay import AllPlaysFailed, PoolEnv, SelfPlay, env_error_metrics

pytestmark = pytest.mark.timeout(120)

# Passes validation (its probes never say "zap"); step raises when the agent does.
PROGRAM = """
class ZapEnv:
    def reset(self, seed=None):
        self.turn = 0
        return "Say something as \\\\boxed{word}.", {}

    def step(self, action):
        self.turn += 1
        if "zap" in action:
            FAIL
        return "Go on.", 0.0, False, self.turn >= 5, {}
"""
RAISES = PROGRAM.replace("FAIL", "raise ValueError('zapped')")
HANGS = PROGRAM.replace("FAIL", "while True: pass")
CALM = PROGRAM.replace("FAIL", "pass")


@pytest.fixture(scope="module")
def sandbox():
    with SandboxPool(SandboxConfig(call_timeout_s=1.0, workers=0)) as pool:
        yield pool


def _selfplay(sandbox, programs, update=None):
    config = load_config("tiny", ["mode=fixed_pool", "backend=sandbox", "group_size=2", "rollout.max_turns=2"])
    tokenizer = byte_tokenizer()
    policy = types.SimpleNamespace(tokenizer=tokenizer, sampler=types.SimpleNamespace(forget=lambda: None))
    learner = types.SimpleNamespace(sandbox=sandbox, update=update)
    selfplay = SelfPlay(config, policy, learner, None, PhaseTimer())
    reply = tokenizer.encode("\\boxed{zap}", add_special_tokens=False) + [tokenizer.eos_token_ids[0]]
    selfplay._agent_generate = lambda prompts: [Generation(reply, [-0.5] * len(reply), "eos") for _ in prompts]
    selfplay.pool = [PoolEnv(env_id, "unknown", "file", source, True, backend="sandbox")
                     for env_id, source in programs.items()]
    return selfplay


def test_failed_plays_are_counted_by_kind_and_logged_with_the_env_id(sandbox, caplog):
    selfplay = _selfplay(sandbox, {"file-raises": RAISES, "file-hangs": HANGS, "file-calm": CALM})
    with caplog.at_level(logging.WARNING, logger="spade_jax.selfplay"):
        trajectories = selfplay.play(hinted=False)
    metrics = selfplay.measure(trajectories, hinted=False)
    assert metrics["agent/episodes"] == 6
    assert metrics["agent/env_errors"] == 4
    assert metrics["agent/env_errors/exception"] == 2 and metrics["agent/env_errors/timeout"] == 2
    assert metrics["agent/env_errors/sandbox_died"] == 0
    by_env = {t.group[0]: t for t in trajectories}
    assert by_env["file-hangs"].meta["env_error"] == "timeout"  # kept for the designer's hung-step penalty
    assert by_env["file-raises"].episode_reward == -1.0 and by_env["file-calm"].episode_reward == 0.0
    # a fixed pool gets a curve per environment
    assert metrics["pool/file-raises/mean_reward"] == -1.0 and metrics["pool/file-calm/win_rate"] == 0.0
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2  # one line per environment and kind, not one per play
    assert any("file-raises" in m and "2 of 2 plays failed (exception)" in m and "zapped" in m for m in lines)
    assert any("file-hangs" in m and "(timeout)" in m for m in lines)


def test_every_play_failing_stops_the_iteration_before_the_update(sandbox):
    def update(samples):
        raise AssertionError("no update may run on plays that all failed")

    selfplay = _selfplay(sandbox, {"file-raises": RAISES}, update=update)
    with pytest.raises(AllPlaysFailed) as raised:
        selfplay.step()
    message = str(raised.value)
    assert "\n" not in message and "all 2 plays of iteration 0 failed" in message
    assert "exception 2, timeout 0, sandbox_died 0" in message and "file-raises" in message
    assert selfplay.iteration == 0


def test_metric_keys_exist_when_nothing_failed():
    """The device loop's JAX environments cannot fail at play time: the keys are there, at 0."""
    played = Trajectory([1, 2], [0, 1], [0.0, -0.1], [1.0], ["a", "b"], ["x"], terminated=True, group=("e", "nohint"))
    assert env_error_metrics([played]) == {
        "agent/env_errors": 0, "agent/env_errors/exception": 0, "agent/env_errors/timeout": 0,
        "agent/env_errors/sandbox_died": 0,
    }
