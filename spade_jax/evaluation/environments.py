"""Held-out environments: a GEM game (the board shown as GEM's observation wrapper shows it) or one
reasoning-gym item per seed; `reset(seed) -> text`, `step(action) -> (text, reward, terminated, truncated)`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spade_jax.envs.api import extract_boxed
from spade_jax.envs.gem_adapter import make_gem_env
from spade_jax.evaluation.rg_items import parse_rg_task, rg_item, rg_score
from spade_jax.evaluation.suites import HELDOUT_SEED_BASE

# reasoning-gym answers count as solved at this score (scores are in [0, 1]; some are partial).
RG_SUCCESS_SCORE = 0.999
# Appended to reasoning-gym questions so the answer is read the way GEM reads it. An empty box, as in the
# agent's system line (rollout.AGENT_SYSTEM): with reasoning-gym's own `\boxed{...}` the 135M model copied
# the placeholder as its answer to most easy questions (0/24 on twelve easy generators, 6 of 15 in the
# 10-60% band with the empty box: docs/evaluation.md, "Generators at a chosen difficulty").
RG_ANSWER_INSTRUCTION = "Write your final answer inside \\boxed{}."


class _GameEnv:
    """GEM game whose observation text includes `info["suffix"]` (the board), as GEM's
    ObservationWrapper shows it; success is a terminal win (reward 1, not truncated)."""

    def __init__(self, env_id: str):
        # Each game runs on its own copy of the global RNG state (GEM's reset reseeds the
        # global generators and some games draw from them every step).
        self._env = make_gem_env(env_id)

    @staticmethod
    def _text(obs: str, info: Mapping[str, Any]) -> str:
        prefix, suffix = info.get("prefix") or "", info.get("suffix") or ""
        parts = [p.strip("\n") for p in (prefix, obs, suffix) if p and p.strip()]
        return "\n".join(parts)

    def reset(self, seed: int) -> str:
        obs, info = self._env.reset(seed=seed)
        return self._text(obs, info or {})

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        reward = float(reward)
        # The games return (reward 1, terminated, not truncated) only on a win; running out of
        # turns may pay a partial reward, which does not count as success.
        self.success = bool(terminated) and not bool(truncated) and reward >= 1.0 - 1e-6
        return self._text(obs, info or {}), reward, bool(terminated), bool(truncated)


class _ReasoningGymEnv:
    """One reasoning-gym item per seed, answered in one turn; success is score >= 0.999. Items are the
    same in every process (evaluation.rg_items)."""

    def __init__(self, env_id: str):
        self.name = env_id.split(":", 1)[1]
        parse_rg_task(self.name)  # a clear error for a bad name or field before any helper process

    def reset(self, seed: int) -> str:
        self._seed = seed
        entry = rg_item(self.name, seed)
        self.answer = entry["answer"]
        return f"{entry['question'].rstrip()}\n\n{RG_ANSWER_INSTRUCTION}"

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        answer = extract_boxed(action)
        score = rg_score(self.name, self._seed, answer.strip()) if answer else 0.0
        self.success = score >= RG_SUCCESS_SCORE
        return "Answer recorded.", score, True, False


class _LibraryEnv:
    """A training-library program at the constants its id names (trusted code, run in-process);
    success is a terminal win (reward 1, not truncated)."""

    def __init__(self, env_id: str):
        from spade_jax.envs.library import LIBRARY_POOL, load_library_env, parse_library_pool

        (entry,) = parse_library_pool(LIBRARY_POOL + env_id.split(":", 1)[1])
        self._env = load_library_env(entry.name, entry.source())

    def reset(self, seed: int) -> str:
        obs, _ = self._env.reset(seed=seed)
        return obs

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        obs, reward, terminated, truncated, _ = self._env.step(action)
        reward = float(reward)
        self.success = bool(terminated) and not bool(truncated) and reward >= 1.0 - 1e-6
        return obs, reward, bool(terminated), bool(truncated)


def make_eval_env(env_id: str) -> _GameEnv | _ReasoningGymEnv | _LibraryEnv:
    """An eval env: `reset(seed) -> text`, `step(action) -> (text, reward, terminated,
    truncated)`, and `.success` after the last step."""
    kind = env_id.split(":", 1)[0]
    if kind == "game":
        return _GameEnv(env_id)
    if kind == "rg":
        return _ReasoningGymEnv(env_id)
    if kind == "lib":
        return _LibraryEnv(env_id)
    raise ValueError(f"eval env id {env_id!r} must start with 'game:', 'rg:' or 'lib:'")


def first_observation(env_id: str, seed: int = HELDOUT_SEED_BASE) -> str:
    """The text an agent sees first in `env_id` at `seed` (instructions and board)."""
    return make_eval_env(env_id).reset(seed)
