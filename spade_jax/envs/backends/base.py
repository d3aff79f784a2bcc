"""The environment-backend interface: a backend admits a program (or says in one line why it will not)
and gives a Runnable that makes TextEnv instances and, when the backend can, a device environment."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

from spade_jax.envs.api import TextEnv

__all__ = ["EnvBackend", "NotAdmitted", "Runnable"]


class NotAdmitted(ValueError):
    """The backend does not run this program; the message is the one-line reason."""


@dataclasses.dataclass(frozen=True)
class Runnable(abc.ABC):
    """A program admitted by a backend: `make()` gives a fresh TextEnv instance; `device_env` is the
    gymnax-style environment that plays inside a compiled device loop, None when the backend has none."""

    backend: str  # name of the backend that admitted the program
    class_name: str  # the environment class of the program
    source: str  # the program text
    fallback_reason: str | None = None  # why the preferred backends did not take it (the auto policy)
    device_env: Any = None  # gymnax-style environment for on-device play, or None

    @abc.abstractmethod
    def make(self) -> TextEnv:
        """One new environment instance."""


class EnvBackend(abc.ABC):
    """A way to run environment programs. A new backend is a folder under envs/backends/ whose
    backend.py defines a subclass decorated with `@register_backend` (and a Runnable subclass),
    imported once in envs/backends/__init__.py; configs, validate and the CLI then accept its name."""

    name: ClassVar[str]  # the config value that picks this backend
    title: ClassVar[str]  # how messages name it ("the JAX backend cannot run ...")
    # Runs every program that passes the static checks: the auto policy falls back to it.
    runs_everything: ClassVar[bool] = False

    @abc.abstractmethod
    def admit(self, source: str, class_name: str, *, pool: Any = None) -> Runnable:
        """The program made runnable, or NotAdmitted naming why this backend will not run it.
        `source` has passed the static checks (syntax, imports, class); `pool` is the sandbox pool
        that runs untrusted program code when the backend needs to (None: the default pool)."""


_REGISTRY: dict[str, EnvBackend] = {}  # name -> the backend, in registration order


def register_backend(cls: type[EnvBackend]) -> type[EnvBackend]:
    """Class decorator: makes the backend available under `cls.name`. Registration order is the auto
    policy's order of preference."""
    if cls.name in _REGISTRY or cls.name == "auto":
        raise ValueError(f"environment backend name {cls.name!r} is taken")
    _REGISTRY[cls.name] = cls()
    return cls
