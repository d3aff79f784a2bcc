"""Host TextEnv wrapper around a TranspiledEnv, so a transpiled environment plugs in wherever a
sandboxed one does (check, play, host rollouts): text in, text out, one jitted step per call."""

from __future__ import annotations

import jax
import numpy as np


class JaxTextEnv:
    """GEM-style reset(seed) -> (obs, info) and step(action) -> (obs, reward, terminated,
    truncated, info) on top of the transpiled functions. The same seed gives the same episode;
    the episode is drawn from JAX's random stream, so it differs from the sandboxed program's."""

    def __init__(self, env, seed: int | None = None):
        self.env = env
        self.class_name = env.name
        self.has_solution = False
        self._seed = 0 if seed is None else int(seed)
        self._state = None

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        if seed is not None:
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise ValueError(f"reset(seed=...) takes an int or None, got {type(seed).__name__}")
            self._seed = seed
        key = jax.random.PRNGKey(self._seed % (2**32))
        attrs, record = self.env._jit_reset(key)
        self._state = self.env.state_with(attrs, record)
        return self.env.render_text(record), {"backend": "jax"}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._state is None:
            raise RuntimeError("step() before reset(); call reset(seed) first")
        if not isinstance(action, str):
            raise TypeError(f"step(action) takes a str, got {type(action).__name__}")
        action_id = self.env.action_id(action)
        attrs, record, reward, terminated, truncated = self.env._jit_step(self._state.attrs, np.int32(action_id))
        self._state = self.env.state_with(attrs, record, self._state.time + 1, terminated, truncated)
        info = {"action_id": action_id, "backend": "jax"}
        return self.env.render_text(record), float(reward), bool(terminated), bool(truncated), info

    @property
    def state(self):
        return self._state

    def solution(self):
        raise NotImplementedError("solution() is not transpiled; use the sandboxed program")

    def close(self) -> None:
        self._state = None
