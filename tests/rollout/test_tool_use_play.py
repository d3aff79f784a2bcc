"""A tool-use library environment played through the host loop in the recipe's format: the tools it lists at
reset go through Qwen3's chat template, results come back as tool turns, a malformed call is masked from the
loss, and replaying the environment's solution wins."""

import pytest

from spade_jax.envs.library import load_library_env
from spade_jax.models.tokenizer import load_hf_tokenizer
from spade_jax.rollout import Generation, RolloutConfig, play_episodes
from tests.rollout.qwen3_tokenizer import build_qwen3_tokenizer_dir


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return load_hf_tokenizer(str(build_qwen3_tokenizer_dir(tmp_path_factory.mktemp("qwen3"))))


def test_a_solution_played_with_tool_turns_wins_and_a_malformed_reply_is_masked(qwen3):
    env = load_library_env("support_refund")
    env.reset(seed=3)
    replies = ['<tool_call>\n{"name": "find_customer", "arguments": {\n</tool_call>', *env.solution()]
    turn = iter(replies)

    def generate(prompts):
        ids = qwen3.encode(next(turn), add_special_tokens=False) + [qwen3.eos_token_ids[0]]
        return [Generation(ids, [-0.1] * len(ids), "eos") for _ in prompts]

    config = RolloutConfig(max_turns=10, action="reply", tool_turns=True, mask_malformed_tool_calls=True,
                           system_prompt="Solve the task with the tools.")
    (traj,) = play_episodes([load_library_env("support_refund")], [3], generate, qwen3, config,
                            format_observation=lambda o, h: o)
    assert traj.terminated and traj.won and traj.episode_reward == 1.0
    assert len(traj.actions) == len(replies) and traj.meta["malformed_tool_calls"] == 1
    text = qwen3.decode(traj.tokens, skip_special_tokens=False)
    system = text.split("<|im_end|>")[0]
    assert "# Tools" in system and '"name": "refund_item"' in system  # reset's info["tools"] through tools=
    assert text.count("<tool_response>") == len(replies) - 2  # every reply that called tools heard back in one
    first_reply = qwen3.encode(replies[0], add_special_tokens=False)
    start = next(i for i in range(len(traj.tokens)) if traj.tokens[i:i + len(first_reply)] == first_reply)
    assert not any(traj.loss_mask[start:start + len(first_reply)])  # the malformed reply carries no loss
    assert any(traj.loss_mask[start + len(first_reply):])
