"""GEM (gem-llm 0.1.0) bridge: GEM environments behind our TextEnv API with their global-RNG
use isolated per instance, and our library environments registered in GEM's registry."""

from __future__ import annotations

import functools
import logging
import random
import threading
from typing import Any

import numpy as np

from spade_jax.envs.api import global_rng_state, saved_global_rng, set_global_rng_state

__all__ = ["GemEnv", "make_gem_env", "register_library_in_gem", "gem_offline_ids", "SPADE_PREFIX"]

# Prefix of our environments' ids in GEM's registry.
SPADE_PREFIX = "spade:"
# GEM ids that need a download (nltk corpora) or crash in gem-llm 0.1.0.
_BROKEN_OFFLINE = (
    "game:Wordle-", "game:Hangman-", "game:WordSearch-", "game:FifteenPuzzle-v0-random",
    "game:Crosswords-v0-random", "rg:composite",
)
# GEM's reset(seed) reseeds the process-wide generators; one lock keeps swaps atomic.
_RNG_LOCK = threading.RLock()
_REGISTER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _gem():
    """Import gem once, undoing its logging.basicConfig(INFO) on the root logger."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import gem

    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    return gem


class GemEnv:
    """A GEM environment whose calls see a private copy of Python's and numpy's global RNG
    state: interleaved environments no longer change each other's episodes."""

    def __init__(self, env: Any, env_id: str, entropy: int | None = None):
        self.env = env
        self.env_id = env_id
        seed = random.SystemRandom().randrange(2**32) if entropy is None else entropy
        self._py_state = random.Random(seed).getstate()
        self._np_state = np.random.RandomState(seed).get_state()

    def _isolated(self, fn, *args, **kwargs):
        with _RNG_LOCK, saved_global_rng():
            set_global_rng_state((self._py_state, self._np_state))
            try:
                return fn(*args, **kwargs)
            finally:
                self._py_state, self._np_state = global_rng_state()

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        obs, info = self._isolated(self.env.reset, seed=seed)
        return str(obs), dict(info or {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self._isolated(self.env.step, action)
        return str(obs), float(reward), bool(terminated), bool(truncated), dict(info or {})

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def __getattr__(self, name: str) -> Any:
        # Everything else (sample_random_action, spawn, ...) reaches the wrapped env.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"GemEnv({self.env_id})"


def _library_entry(name: str, **kwargs: Any):
    from spade_jax.envs import library

    env = library.load_library_env(name)
    for key, value in kwargs.items():
        setattr(env, key, value)
    return env


def _gem_name(class_name: str) -> str:
    return SPADE_PREFIX + (class_name[:-3] if class_name.endswith("Env") and len(class_name) > 3 else class_name)


def register_library_in_gem() -> list[str]:
    """Register every library environment in GEM's registry as spade:<ClassName without Env>
    (e.g. spade:GridMaze), so gem.make builds them. Returns the ids; idempotent."""
    from spade_jax.envs import library

    gem = _gem()
    from gem.envs.registration import ENV_REGISTRY

    ids = []
    with _REGISTER_LOCK:
        for program in library.library_programs():
            env_id = _gem_name(program.class_name)
            if env_id not in ENV_REGISTRY:
                gem.register(env_id, functools.partial(_library_entry, program.name))
            ids.append(env_id)
    return ids


def gem_offline_ids() -> list[str]:
    """Registered GEM ids (game:*, rg:*) that run here without downloads."""
    _gem()
    from gem.envs.registration import ENV_REGISTRY

    return sorted(
        env_id for env_id in ENV_REGISTRY
        if env_id.startswith(("game:", "rg:")) and not env_id.startswith(_BROKEN_OFFLINE)
    )


def make_gem_env(env_id: str, **kwargs: Any) -> GemEnv:
    """gem.make(env_id, **kwargs) wrapped in GemEnv. spade:* ids register the library first."""
    gem = _gem()
    from gem.envs.registration import ENV_REGISTRY

    if env_id.startswith(SPADE_PREFIX) and env_id not in ENV_REGISTRY:
        register_library_in_gem()
    if env_id not in ENV_REGISTRY:
        close = sorted(i for i in ENV_REGISTRY if env_id.split(":")[-1].lower()[:5] in i.lower())[:5]
        hint = f"; similar ids: {', '.join(close)}" if close else ""
        raise ValueError(f"unknown GEM environment id {env_id!r}{hint}")
    if env_id.startswith(_BROKEN_OFFLINE):
        raise ValueError(f"GEM environment {env_id!r} needs downloads or crashes in gem-llm 0.1.0; pick another id")
    with _RNG_LOCK, saved_global_rng():  # constructors may draw from the global generators too
        env = gem.make(env_id, **kwargs)
    return GemEnv(env, env_id)
