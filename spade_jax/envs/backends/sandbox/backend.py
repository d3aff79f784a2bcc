"""The sandbox as an environment backend: it admits every program that passes the static checks and
makes each instance in a worker of a SandboxPool; it has no device environment."""

from __future__ import annotations

import dataclasses

from spade_jax.envs.backends.base import EnvBackend, Runnable, register_backend
from spade_jax.envs.backends.sandbox.pool import SandboxPool, default_pool
from spade_jax.envs.backends.sandbox.proxy import SandboxEnv


@dataclasses.dataclass(frozen=True)
class SandboxRunnable(Runnable):
    """A program that runs in sandbox workers: each make() loads it into a fresh worker of `pool`."""

    # The pool its instances are loaded into; None: default_pool().
    pool: SandboxPool | None = dataclasses.field(default=None, compare=False, repr=False)

    def make(self) -> SandboxEnv:
        return (self.pool or default_pool()).load(self.source, self.class_name)


@register_backend
class SandboxBackend(EnvBackend):
    name = "sandbox"
    title = "sandbox"
    runs_everything = True

    def admit(self, source: str, class_name: str, *, pool: SandboxPool | None = None) -> SandboxRunnable:
        return SandboxRunnable(self.name, class_name, source, pool=pool)
