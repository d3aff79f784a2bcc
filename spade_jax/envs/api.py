"""The text-environment API every environment speaks (GEM's Env): the TextEnv protocol,
\\boxed{} action parsing, the episode runner and SPADE's episode reward, GEM bridging."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import re
from collections.abc import Iterator
from typing import Callable, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "TextEnv",
    "Episode",
    "extract_boxed",
    "boxed_contents",
    "boxed_command",
    "episode_reward",
    "run_episode",
    "global_rng_state",
    "set_global_rng_state",
    "saved_global_rng",
]


@runtime_checkable
class TextEnv(Protocol):
    """GEM's Env contract: observations and actions are text; the action is the agent's raw
    reply, from which environments usually read the last \\boxed{...}."""

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        ...


def _boxed_at(text: str, start: int) -> str | None:
    """Content of the \\boxed{...} that starts at `start`, or None when it is not complete."""
    i = start + len("\\boxed")
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_boxed(text: str, *, first: bool = False) -> str | None:
    """Content of the last (or, with `first`, the first) complete \\boxed{...} in `text`, nested
    braces kept; None when there is none. `\\boxed {x}` with spaces is accepted; an unclosed or
    malformed one is skipped."""
    if not isinstance(text, str):
        return None
    if first:
        start = text.find("\\boxed")
        while start >= 0:
            content = _boxed_at(text, start)
            if content is not None:
                return content
            start = text.find("\\boxed", start + 1)
        return None
    start = text.rfind("\\boxed")
    while start >= 0:
        content = _boxed_at(text, start)
        if content is not None:
            return content
        start = text.rfind("\\boxed", 0, start)
    return None


# The library idiom (environment programs read their command this way): \boxed{...} without braces inside.
_FLAT_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} in `text` that holds no brace, in order, unstripped."""
    return _FLAT_BOXED.findall(text)


def boxed_command(text: str) -> str | None:
    """The library idiom: the last brace-free \\boxed{...} content, stripped and lower-cased (None
    without one); unlike `extract_boxed`, a nested or spaced \\boxed is not read."""
    found = boxed_contents(text)
    return found[-1].strip().lower() if found else None


def episode_reward(last_reward: float, terminated: bool) -> float:
    """SPADE's episode reward: the last step's reward clipped to [-1, 1] when the episode
    terminated, 0 when it was truncated or cut by the turn limit."""
    if not terminated or not math.isfinite(last_reward):
        return 0.0
    return max(-1.0, min(1.0, float(last_reward)))


@dataclasses.dataclass(frozen=True)
class Episode:
    """One played episode: observations[0] is the reset observation, observations[i+1] follows
    actions[i]; rewards[i] is the reward of actions[i]."""

    seed: int | None  # seed given to reset
    observations: tuple[str, ...]  # reset observation, then one per step
    actions: tuple[str, ...]  # the policy's replies, one per step
    rewards: tuple[float, ...]  # per-step rewards
    infos: tuple[dict, ...]  # reset info, then one per step
    terminated: bool  # the environment ended the episode
    truncated: bool  # the environment truncated, or the runner hit max_turns

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def reward(self) -> float:
        """Episode reward per SPADE (see episode_reward)."""
        return episode_reward(self.rewards[-1] if self.rewards else 0.0, self.terminated)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


def run_episode(
    env: TextEnv, policy: Callable[[str], str], seed: int | None = None, max_turns: int = 25
) -> Episode:
    """Play one episode: reset(seed), then ask `policy` for an action on each observation
    until the environment terminates or truncates, or `max_turns` steps were taken (then
    the episode counts as truncated)."""
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    obs, info = env.reset(seed=seed)
    observations, actions, rewards, infos = [obs], [], [], [info]
    terminated = truncated = False
    for _ in range(max_turns):
        action = policy(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(float(reward))
        infos.append(info)
        if terminated or truncated:
            break
    else:
        truncated = True
    return Episode(
        seed=seed,
        observations=tuple(observations),
        actions=tuple(actions),
        rewards=tuple(rewards),
        infos=tuple(infos),
        terminated=bool(terminated),
        truncated=bool(truncated) and not terminated,
    )


# GEM's reset(seed) reseeds Python's and numpy's process-wide generators, and some environments draw
# from them every step: callers that must not see or cause that swap the state around the calls.


def global_rng_state() -> tuple:
    """Python's and numpy's global RNG state together, as `set_global_rng_state` takes it back."""
    return random.getstate(), np.random.get_state()


def set_global_rng_state(state: tuple) -> None:
    py_state, np_state = state
    random.setstate(py_state)
    np.random.set_state(np_state)


@contextlib.contextmanager
def saved_global_rng() -> Iterator[None]:
    """Restore Python's and numpy's global RNG state on exit (GEM's reset reseeds both)."""
    outer = global_rng_state()
    try:
        yield
    finally:
        set_global_rng_state(outer)
