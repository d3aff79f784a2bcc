"""The sandbox backend: untrusted programs run out of process, one per worker (process.py, worker.py),
inside isolation layers (isolation.py), as TextEnv proxies (proxy.py) from a pool (pool.py)."""

from spade_jax.envs.backends.sandbox.config import SandboxConfig
from spade_jax.envs.backends.sandbox.errors import (
    EnvCrashed,
    EnvError,
    EnvTimeout,
    SandboxError,
    SandboxUnavailable,
)
from spade_jax.envs.backends.sandbox.isolation import detect_isolation
from spade_jax.envs.backends.sandbox.pool import SandboxPool, default_pool
from spade_jax.envs.backends.sandbox.proxy import SandboxEnv

__all__ = [
    "SandboxConfig",
    "SandboxPool",
    "SandboxEnv",
    "SandboxError",
    "SandboxUnavailable",
    "EnvError",
    "EnvTimeout",
    "EnvCrashed",
    "detect_isolation",
    "default_pool",
]
