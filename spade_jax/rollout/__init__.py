"""Multi-turn episodes in chat format (observation as user turn, reply as assistant turn), played by
the host loop (`play_episodes`) or the compiled device loop (`play_episodes_device`), as `Trajectory`s."""

from spade_jax.rollout.actions import ActionMap, agent_action, token_byte_table
from spade_jax.rollout.chat import AGENT_SYSTEM, ChatGlue, ChatStream, Tokenizer, with_hint
from spade_jax.rollout.config import ACTION_MODES, RolloutConfig
from spade_jax.rollout.device import DeviceRollout, play_episodes_device
from spade_jax.rollout.host import GenerateFn, Generation, play_episodes
from spade_jax.rollout.trajectory import (
    ENV_ERROR_KINDS,
    Trajectory,
    classify_env_error,
    clip_to_context,
    end_on_env_error,
)

__all__ = [
    "ACTION_MODES",
    "AGENT_SYSTEM",
    "ENV_ERROR_KINDS",
    "ActionMap",
    "ChatGlue",
    "ChatStream",
    "DeviceRollout",
    "GenerateFn",
    "Generation",
    "RolloutConfig",
    "Tokenizer",
    "Trajectory",
    "agent_action",
    "classify_env_error",
    "clip_to_context",
    "end_on_env_error",
    "play_episodes",
    "play_episodes_device",
    "token_byte_table",
    "with_hint",
]
