"""Host-loop rollouts: exact chat token streams, loss masks on agent tokens only, SPADE rewards."""

import pytest

from spade_jax.envs.library import load_library_env
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import ChatStream, Generation, RolloutConfig, play_episodes


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _reply(tokenizer, text, eos=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_ids[0]] if eos else [])


def test_chat_stream_matches_the_template_rendering_of_the_whole_conversation(tokenizer):
    stream = ChatStream(tokenizer, system_prompt="Play well.")
    tokens = stream.first_turn("board 1")
    replies = ["I move \\boxed{up}", "then \\boxed{left}"]
    observations = ["board 2", "board 3"]
    for reply, obs in zip(replies, observations):
        tokens += _reply(tokenizer, reply)
        tokens += stream.next_turn(_reply(tokenizer, reply), obs)
    messages = [{"role": "system", "content": "Play well."}, {"role": "user", "content": "board 1"}]
    for reply, obs in zip(replies, observations):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs}]
    # The reference: the template renders the whole conversation in one go.
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


def test_a_reply_cut_by_length_gets_the_end_of_turn_from_the_template(tokenizer):
    stream = ChatStream(tokenizer)
    tokens = stream.first_turn("obs")
    cut = _reply(tokenizer, "\\boxed{1", eos=False)
    tokens += cut + stream.next_turn(cut, "next")
    messages = [{"role": "user", "content": "obs"}, {"role": "assistant", "content": "\\boxed{1"},
                {"role": "user", "content": "next"}]
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


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
    good, bad = play_episodes([env, _Crashing()], [1, 1], scripted, tokenizer, RolloutConfig(max_turns=40),
                              format_observation=lambda obs, hint: obs)
    assert good.won
    assert bad.truncated and "boom" in bad.meta["error"] and not any(bad.loss_mask)


def test_hint_goes_into_the_first_observation_only(tokenizer):
    env = load_library_env("grid_maze")
    seen = []

    def fmt(obs, hint):
        seen.append(hint)
        return obs if hint is None else obs + "\nHint: " + hint

    play_episodes([env], [0], _Scripted(tokenizer, [["\\boxed{up}"]]), tokenizer, RolloutConfig(max_turns=3),
                  hints=["go around"], format_observation=fmt)
    assert seen[0] == "go around" and all(h is None for h in seen[1:])


@pytest.mark.parametrize("reply", ["", "d", ">", "\n", "assistant"])
def test_short_replies_that_also_occur_in_the_template_get_the_right_glue(tokenizer, reply):
    stream = ChatStream(tokenizer)
    tokens = stream.first_turn("obs")
    ids = _reply(tokenizer, reply)
    tokens += ids + stream.next_turn(ids, "next")
    messages = [{"role": "user", "content": "obs"}, {"role": "assistant", "content": reply},
                {"role": "user", "content": "next"}]
    assert tokens == tokenizer.encode_chat(messages, add_generation_prompt=True)


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
