"""Evaluation episodes played by the training loop, `rollout.play_episodes`: a conversation-level policy
behind its token-level generate function, and each eval env behind its environment contract."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from spade_jax.evaluation.policies import Messages, Policy
from spade_jax.rollout import (
    GenerateFn,
    Generation,
    RolloutConfig,
    Trajectory,
    play_episodes,
)

_GENERATION_PROMPT = 'assistant:"'


def _escape(text: str) -> str:
    # JSON string escaping: no raw quote or newline is left to split on; other characters stay as they are.
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _unescape(text: str) -> str:
    return json.loads(f'"{text}"')


class ConversationCodec:
    """The tokenizer play_episodes is given: a conversation renders as one `role:"content"` line per
    message, and each character is one token id. The loop builds every prompt from this rendering and
    the replies' ids, so `conversation(prompt)` reads the exact conversation back for the policy."""

    eos_token_ids: tuple[int, ...] = ()

    def apply_chat_template(self, messages: Messages, *, add_generation_prompt: bool = False) -> str:
        text = "".join(f'{m["role"]}:"{_escape(m["content"])}"\n' for m in messages)
        return text + (_GENERATION_PROMPT if add_generation_prompt else "")

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of a reply's ids (they hold its escaped form)."""
        return _unescape("".join(map(chr, ids)))

    def reply_ids(self, reply: str) -> list[int]:
        return self.encode(_escape(reply))

    def conversation(self, prompt_ids: Sequence[int]) -> Messages:
        text = "".join(map(chr, prompt_ids))
        if not text.endswith(_GENERATION_PROMPT):
            raise ValueError("not a prompt of ConversationCodec: it does not end with the reply header")
        messages = []
        for line in text[: -len(_GENERATION_PROMPT)].split("\n")[:-1]:
            role, quoted = line.split(":", 1)
            messages.append({"role": role, "content": _unescape(quoted[1:-1])})
        return messages


def policy_generate(policy: Policy, codec: ConversationCodec, batch_size: int | None) -> GenerateFn:
    """play_episodes' generate function for `policy`: each prompt read back as a conversation, at most
    `batch_size` conversations per policy call, each reply returned as the codec's ids."""

    def generate(prompts: list[list[int]]) -> list[Generation]:
        conversations = [codec.conversation(prompt) for prompt in prompts]
        step = batch_size or len(conversations)
        replies: list[str] = []
        for start in range(0, len(conversations), step):
            chunk = conversations[start:start + step]
            out = list(policy(chunk))
            if len(out) != len(chunk):
                raise ValueError(f"policy returned {len(out)} replies for {len(chunk)} conversations")
            replies.extend(out)
        generations = []
        for reply in replies:
            if not isinstance(reply, str):
                raise ValueError(f"policy must return str replies, got {type(reply).__name__}")
            ids = codec.reply_ids(reply)
            generations.append(Generation(ids, [0.0] * len(ids), "stop"))
        return generations

    return generate


class EvalEpisode:
    """One eval env as play_episodes plays an environment (GEM's contract): it ends itself at the task's
    turn cap, and keeps what a report needs that a trajectory does not hold: whether the env counted
    the episode a success, and the first failure with its exception type."""

    def __init__(self, env: Any, max_turns: int, on_done: Callable[[], None] | None = None):
        self.env, self.max_turns, self.on_done = env, max_turns, on_done
        self.turns = 0
        self.success = False
        self.error: str | None = None

    def reset(self, seed: int) -> tuple[str, dict]:
        try:
            return self.env.reset(seed), {}
        except Exception as err:
            self.error = f"reset failed: {type(err).__name__}: {err}"
            raise

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turns += 1
        try:
            obs, reward, terminated, truncated = self.env.step(action)
        except Exception as err:
            self.error = f"step failed: {type(err).__name__}: {err}"
            self._done()
            raise
        if terminated or truncated:
            self.success = bool(self.env.success)
        elif self.turns >= self.max_turns:
            truncated = True  # out of turns: over, unsolved
        if terminated or truncated:
            self._done()
        return obs, reward, terminated, truncated, {}

    def _done(self) -> None:
        if self.on_done is not None:
            self.on_done()


def play(
    policy: Policy,
    episodes: Sequence[EvalEpisode],
    seeds: Sequence[int],
    *,
    system_prompt: str | None,
    batch_size: int | None = None,
) -> list[Trajectory]:
    """Plays every episode with `policy` through `rollout.play_episodes`, all live episodes in one
    batch per turn: the observation is the user turn and the reply the assistant turn, as in training;
    the env receives the whole reply; steps run one at a time, in episode order."""
    codec = ConversationCodec()
    config = RolloutConfig(
        max_turns=max(episode.max_turns for episode in episodes),  # each episode ends itself at its own cap
        max_context_tokens=sys.maxsize,  # the policy owns its context (model_policy answers "" past it)
        system_prompt=system_prompt,
        action="reply",
        train_on_env_errors=False,  # a failed env ends its episode with no reward added
        step_workers=1,  # eval envs swap the process-wide RNG state around their calls
    )
    return play_episodes(
        episodes, seeds, policy_generate(policy, codec, batch_size), codec, config,
        format_observation=lambda observation, _hint: observation,
    )
