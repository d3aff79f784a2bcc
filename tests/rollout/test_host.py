"""Host-loop rollouts: exact chat token streams, loss masks on agent tokens only, SPADE rewards."""

import pytest

from spade_jax.envs.library import load_library_env
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import (
    ChatStream,
    Generation,
    RolloutConfig,
    play_episodes,
)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _reply(tokenizer, text, eos=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_ids[0]] if eos else [])


class _Scripted:
    """A policy that replays fixed action texts, one per turn and row."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts, self.turn = tokenizer, scripts, 0

    def __call__(self, prompts):
        out = []
        for row, _ in enumerate(prompts):
            text = self.scripts[row][min(self.turn, len(self.scripts[row]) - 1)]
            ids = _reply(self.tokenizer, text)
            out.append(Generation(ids, [-0.5] * len(ids), "eos"))
        self.turn += 1
        return out


def test_a_winning_episode_has_reward_one_and_loss_only_on_agent_tokens(tokenizer):
    env = load_library_env("grid_maze")
    env.reset(3)
    plan = env.solution()
    scripted = _Scripted(tokenizer, [list(plan)])
    (traj,) = play_episodes([env], [3], scripted, tokenizer, RolloutConfig(max_turns=40),
                            format_observation=lambda obs, hint: obs)
    assert traj.terminated and traj.won and traj.episode_reward == 1.0
    assert len(traj.actions) == len(plan)
    generated = sum(len(_reply(tokenizer, a)) for a in plan)
    assert sum(traj.loss_mask) == generated
    assert len(traj.tokens) == len(traj.loss_mask) == len(traj.behaviour_logprobs)
    assert all(lp == -0.5 for lp, m in zip(traj.behaviour_logprobs, traj.loss_mask) if m)
    assert all(lp == 0.0 for lp, m in zip(traj.behaviour_logprobs, traj.loss_mask) if not m)


def test_out_of_turns_is_truncated_with_no_reward_and_no_loss(tokenizer):
    env = load_library_env("grid_maze")
    scripted = _Scripted(tokenizer, [["I am not sure"]])
    (traj,) = play_episodes([env], [0], scripted, tokenizer, RolloutConfig(max_turns=2),
                            format_observation=lambda obs, hint: obs)
    assert traj.truncated and not traj.terminated
    assert traj.episode_reward == 0.0 and not any(traj.loss_mask)
    kept = play_episodes([load_library_env("grid_maze")], [0], _Scripted(tokenizer, [["x"]]), tokenizer,
                         RolloutConfig(max_turns=2, loss_on_truncated=True),
                         format_observation=lambda obs, hint: obs)[0]
    assert any(kept.loss_mask)


class _Crashing:
    def reset(self, seed=None):
        return "start", {}

    def step(self, action):
        raise RuntimeError("boom")


def test_an_env_that_raises_ends_only_its_own_episode(tokenizer):
    env = load_library_env("grid_maze")
    env.reset(1)
    plan = env.solution()
    scripted = _Scripted(tokenizer, [list(plan), ["\\boxed{1}"]])
    # Without train_on_env_errors, the episode is cut: no reward, no loss.
    good, bad = play_episodes([env, _Crashing()], [1, 1], scripted, tokenizer,
                              RolloutConfig(max_turns=40, train_on_env_errors=False),
                              format_observation=lambda obs, hint: obs)
    assert good.won
    assert bad.truncated and "boom" in bad.meta["error"] and not any(bad.loss_mask)
    assert bad.meta["env_error"] == "exception" and bad.episode_reward == 0.0


class _FailingReset:
    def reset(self, seed=None):
        raise ValueError("no board")


def test_an_env_error_loses_the_episode_with_reward_minus_one_and_keeps_its_loss(tokenizer):
    """SPADE (synthetic_game_env.py): an environment error during play ends the episode with reward
    -1, and that episode is trained like any terminated one."""
    scripted = _Scripted(tokenizer, [["\\boxed{1}"], ["\\boxed{1}"]])
    bad, no_reset = play_episodes([_Crashing(), _FailingReset()], [1, 1], scripted, tokenizer,
                                  RolloutConfig(max_turns=40), format_observation=lambda obs, hint: obs)
    assert bad.terminated and not bad.truncated and not bad.won
    assert bad.episode_reward == -1.0 and bad.rewards == [-1.0]
    assert sum(bad.loss_mask) == len(_reply(tokenizer, "\\boxed{1}"))  # the agent's one reply carries loss
    assert bad.meta["env_error"] == "exception" and bad.meta["env_error_phase"] == "step"
    assert "boom" in bad.meta["error"]
    assert no_reset.episode_reward == -1.0 and not no_reset.tokens and not no_reset.trainable
    assert no_reset.meta["env_error_phase"] == "reset" and "no board" in no_reset.meta["error"]

    (half,) = play_episodes([_Crashing()], [1], _Scripted(tokenizer, [["x"]]), tokenizer,
                            RolloutConfig(env_error_reward=-0.5), format_observation=lambda obs, hint: obs)
    assert half.episode_reward == -0.5
    with pytest.raises(ValueError, match="env_error_reward"):
        RolloutConfig(env_error_reward=-2.0)


# Valid under the validator's probes; fails only when the agent says "zap".
_ZAP = """
import os


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
HOSTILE = {
    "exception": "raise ValueError('zapped')",
    "timeout": "while True: pass",
    "sandbox_died": "os._exit(3)",
}


def hostile_program(kind: str) -> str:
    """A program whose step fails in the given way when the action holds "zap" (shared with selfplay tests)."""
    return _ZAP.replace("FAIL", HOSTILE[kind])


@pytest.mark.timeout(60)
def test_sandboxed_play_time_failures_are_told_apart(tokenizer):
    from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool

    with SandboxPool(SandboxConfig(call_timeout_s=1.0, workers=0)) as pool:
        envs = [pool.load(hostile_program(kind), "ZapEnv") for kind in HOSTILE]
        try:
            scripted = _Scripted(tokenizer, [["\\boxed{ok}", "\\boxed{zap}"]] * len(envs))
            trajs = play_episodes(envs, [0] * len(envs), scripted, tokenizer, RolloutConfig(max_turns=4),
                                  format_observation=lambda obs, hint: obs)
        finally:
            for env in envs:
                env.close()
    for kind, traj in zip(HOSTILE, trajs):
        assert traj.meta["env_error"] == kind, (kind, traj.meta)
        assert traj.meta["env_error_phase"] == "step" and "\n" not in traj.meta["error"]
        assert traj.rewards == [0.0, -1.0] and traj.terminated and len(traj.actions) == 2


def test_hint_goes_into_the_first_observation_only(tokenizer):
    env = load_library_env("grid_maze")
    seen = []

    def fmt(obs, hint):
        seen.append(hint)
        return obs if hint is None else obs + "\nHint: " + hint

    play_episodes([env], [0], _Scripted(tokenizer, [["\\boxed{up}"]]), tokenizer, RolloutConfig(max_turns=3),
                  hints=["go around"], format_observation=fmt)
    assert seen[0] == "go around" and all(h is None for h in seen[1:])


def test_an_episode_cut_by_the_context_budget_is_truncated_with_no_loss(tokenizer):
    (traj,) = play_episodes([load_library_env("grid_maze")], [0], _Scripted(tokenizer, [["x" * 50]]), tokenizer,
                            RolloutConfig(max_turns=20, max_context_tokens=400),
                            format_observation=lambda obs, hint: obs)
    assert traj.truncated and traj.cut_by_context and not any(traj.loss_mask)


def test_a_reply_prefix_is_forced_into_the_stream_and_starts_every_action(tokenizer):
    stream = ChatStream(tokenizer, system_prompt="Play.", reply_prefix="\\boxed{")
    tokens = stream.first_turn("board 1")
    replies = ["up}", "left} done"]
    for reply, obs in zip(replies, ["board 2", "board 3"]):
        tokens += _reply(tokenizer, reply) + stream.next_turn(_reply(tokenizer, reply), obs)
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "board 1"},
                {"role": "assistant", "content": "\\boxed{up}"}, {"role": "user", "content": "board 2"},
                {"role": "assistant", "content": "\\boxed{left} done"}, {"role": "user", "content": "board 3"}]
    # The template's rendering of the conversation, then the prefix that opens the next reply.
    expected = tokenizer.encode_chat(messages, add_generation_prompt=True)
    assert tokens == expected + tokenizer.encode("\\boxed{", add_special_tokens=False)

    env = load_library_env("grid_maze")
    env.reset(3)
    plan = [action.removeprefix("\\boxed{") for action in env.solution()]
    (traj,) = play_episodes([env], [3], _Scripted(tokenizer, [plan]), tokenizer,
                            RolloutConfig(max_turns=40, reply_prefix="\\boxed{"),
                            format_observation=lambda obs, hint: obs)
    assert traj.won and traj.actions == ["\\boxed{" + a for a in plan]
    assert sum(traj.loss_mask) == sum(len(_reply(tokenizer, a)) for a in plan)  # the prefix carries no loss


def test_a_ctrl_c_dropped_during_a_turn_stops_the_plays_before_the_next(tokenizer, monkeypatch, usual_sigint):
    import signal
    import sys

    from spade_jax.run.interrupt import remember_interrupts

    class DropsItsErrors:  # Python ignores an exception raised in __del__, as in JAX's gc callback
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    scripted = _Scripted(tokenizer, [["I am not sure"]])

    def generate(prompts):
        if scripted.turn == 1:
            DropsItsErrors()
        return scripted(prompts)

    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)
    with remember_interrupts(), pytest.raises(KeyboardInterrupt):
        play_episodes([load_library_env("grid_maze")], [0], generate, tokenizer, RolloutConfig(max_turns=5),
                      format_observation=lambda obs, hint: obs)
    assert scripted.turn == 2  # the turn under way finished; no third one started
