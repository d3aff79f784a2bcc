"""The rollout section of the run config: turn and context limits, the agent's turn options, how
environment failures count, and what the environment receives of a reply (ACTION_MODES)."""

from __future__ import annotations

import dataclasses

from spade_jax.knobs import choice, in_range, positive

ACTION_MODES = ("first_boxed", "reply")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 25  # SPADE's turn limit per episode
    max_context_tokens: int = 4096  # an episode whose tokens would pass this is cut (truncated)
    loss_on_truncated: bool = False  # SPADE: trajectories cut by the turn limit carry no loss
    # the agent's system turn (self-play and evaluation: None is AGENT_SYSTEM below, "" none)
    system_prompt: str | None = None
    # Text every agent reply starts with, forced rather than sampled (prompt side: no loss, no
    # logprob). "\\boxed{" with the stop string "}" makes a small model answer in the action format.
    reply_prefix: str = ""
    step_workers: int = 8  # environment steps run concurrently on this many threads
    # An environment failure during play (raised, timed out, sandbox died) ends the episode with this
    # reward (SPADE's synthetic_game_env.py: -1; episode rewards are clipped to [-1, 1]).
    env_error_reward: float = -1.0
    # True: an episode ended by such a failure counts as terminated and carries loss (SPADE);
    # False: cut, no reward, no loss
    train_on_env_errors: bool = True
    # what the environment receives: first_boxed (SPADE: the reply's first \\boxed{...},
    # the whole reply when it has none) or reply (the whole reply)
    action: str = "first_boxed"
    # appended to every observation the agent sees (SPADE's recipe asks to reason step by step and answer in \\boxed{})
    observation_suffix: str = ""
    # SPADE: a reply cut by max_new_tokens (no EOS or stop string) ends the episode, truncated
    end_on_cut_reply: bool = False
    # Tool use (the reference's rule): a reply holding a malformed <tool_call> block (rollout/tool_calls.py)
    # gets loss mask 0, so the update neither rewards nor punishes text the environment could not read as a call
    mask_malformed_tool_calls: bool = False
    # Tool use in the model's chat format: the tools an env lists in reset's info["tools"] go through the chat
    # template (tools=, or its fallback), and the observation after a reply that called tools is a `tool` turn
    tool_turns: bool = False

    def __post_init__(self):
        positive(self.max_turns, "rollout.max_turns")
        positive(self.max_context_tokens, "rollout.max_context_tokens")
        positive(self.step_workers, "rollout.step_workers")
        in_range(self.env_error_reward, -1.0, 1.0, "rollout.env_error_reward")  # NaN is refused too
        choice(self.action, ACTION_MODES, "rollout.action")

