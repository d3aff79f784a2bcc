"""SandboxEnv: the TextEnv proxy of an instance living in a sandbox worker; reset, step and solution
are calls to the worker whose replies are checked, and attributes cross as JSON."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from spade_jax.envs.backends.sandbox.errors import EnvCrashed, EnvError
from spade_jax.envs.backends.sandbox.process import WorkerProcess
from spade_jax.envs.backends.sandbox.protocol import check_step_reply, decode_attr, encode_attr

if TYPE_CHECKING:
    from spade_jax.envs.backends.sandbox.pool import SandboxPool


class SandboxEnv:
    """A TextEnv whose instance lives in a sandbox worker. reset/step/solution are RPCs;
    errors from the program raise EnvError (EnvTimeout, EnvCrashed when the worker died)."""

    def __init__(self, pool: "SandboxPool", worker: WorkerProcess, instance: int, class_name: str, meta: dict):
        self._pool = pool
        self._worker = worker
        self._instance = instance
        self.class_name = class_name
        # Whether the class defines solution().
        self.has_solution = bool(meta.get("has_solution"))
        # The environment's declared turn limit (attribute max_turns), if any.
        self.max_turns = meta.get("max_turns")
        self._closed = False

    def __repr__(self) -> str:
        return f"SandboxEnv({self.class_name}, instance={self._instance}, alive={self.alive})"

    @property
    def alive(self) -> bool:
        return not self._closed and self._worker.alive

    @property
    def isolation(self) -> dict:
        return self._pool.isolation

    def _request(self, op: str, **fields) -> dict:
        if self._closed:
            raise EnvError(f"{op}() on a closed environment")
        return {"op": op, "id": self._instance, **fields}

    def _timeout(self, timeout: float | None) -> float:
        return self._pool.config.call_timeout_s if timeout is None else max(1e-3, float(timeout))

    def reset(self, seed: int | None = None, *, timeout: float | None = None) -> tuple[str, dict]:
        if seed is not None:
            try:
                seed = operator.index(seed)  # numpy integers too
            except TypeError:
                raise ValueError(f"reset(seed=...) takes an int or None, got {type(seed).__name__}") from None
        value = self._worker.call(self._request("reset", seed=seed), self._timeout(timeout))
        well_formed = isinstance(value, list) and len(value) == 2
        if not (well_formed and isinstance(value[0], str) and isinstance(value[1], dict)):
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed reset() reply; it was killed")
        return value[0], value[1]

    def _step_request(self, action: str) -> dict:
        if not isinstance(action, str):
            raise TypeError(f"step(action) takes a str, got {type(action).__name__}")
        if len(action) > self._pool.config.max_input_chars:
            raise ValueError(
                f"action of {len(action)} characters exceeds max_input_chars={self._pool.config.max_input_chars}"
            )
        return self._request("step", action=action)

    def _step_result(self, value: Any) -> tuple[str, float, bool, bool, dict]:
        try:
            return check_step_reply(value)
        except ValueError:
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed step() reply; it was killed") from None

    def step(self, action: str, *, timeout: float | None = None) -> tuple[str, float, bool, bool, dict]:
        value = self._worker.call(self._step_request(action), self._timeout(timeout))
        return self._step_result(value)

    def solution(self, *, timeout: float | None = None) -> str | list[str]:
        value = self._worker.call(self._request("solution"), self._timeout(timeout))
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(a, str) for a in value)):
            return value
        self._worker.kill("protocol violation")
        raise EnvCrashed("the environment process sent a malformed solution() reply; it was killed")

    def declared_turns(self, *, timeout: float | None = None) -> int | None:
        """The instance's current max_turns / MAX_TURNS (some programs set it in reset)."""
        value = self._worker.call(self._request("declared_turns"), self._timeout(timeout))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def get_attrs(self) -> dict[str, Any]:
        """The instance's attributes that survive JSON (numbers, str, lists, dicts, tuples,
        numpy arrays and scalars, random.Random state); others are left out."""
        value = self._worker.call(self._request("get_attrs"), self._pool.config.call_timeout_s)
        if not isinstance(value, dict) or not isinstance(value.get("attrs"), dict):
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed get_attrs() reply; it was killed")
        return {str(k): decode_attr(v) for k, v in value["attrs"].items()}

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Assign attributes on the instance (values as get_attrs returns them)."""
        encoded = {str(k): encode_attr(v) for k, v in attrs.items()}
        self._worker.call(self._request("set_attrs", attrs=encoded), self._pool.config.call_timeout_s)

    def clone(self, *, timeout: float | None = None) -> "SandboxEnv":
        """A second, independent instance of the same class in the same worker (no new
        process); calls on the two are serialised."""
        return self._pool._new_instance(
            self._worker, self.class_name, {"has_solution": self.has_solution}, self._timeout(timeout)
        )

    def close(self, _rpc: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool._release(self._worker, self._instance, rpc=_rpc)

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close(_rpc=False)
        except Exception:
            pass
