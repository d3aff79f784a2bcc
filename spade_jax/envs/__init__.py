"""Environments as text programs: the GEM-compatible TextEnv API, program loading, validation, the
backends that run programs (backends/: sandbox and JAX), GEM adapters and the `check`/`play` CLI."""

from spade_jax.envs.api import Episode, TextEnv, episode_reward, extract_boxed, run_episode
from spade_jax.envs.backends.sandbox import (
    EnvCrashed,
    EnvError,
    EnvTimeout,
    SandboxConfig,
    SandboxEnv,
    SandboxPool,
    SandboxUnavailable,
    detect_isolation,
)
from spade_jax.envs.program import ProgramError, check_imports, extract_code, find_env_class

__all__ = [
    "Episode",
    "TextEnv",
    "episode_reward",
    "extract_boxed",
    "run_episode",
    "ProgramError",
    "check_imports",
    "extract_code",
    "find_env_class",
    "EnvCrashed",
    "EnvError",
    "EnvTimeout",
    "SandboxConfig",
    "SandboxEnv",
    "SandboxPool",
    "SandboxUnavailable",
    "detect_isolation",
    "Verdict",
    "ValidationConfig",
    "compile_env",
    "Runnable",
    "make_gem_env",
    "register_library_in_gem",
]


def __getattr__(name):
    # validate/backends/gem pull in more modules; load them on first use. The validate()
    # function itself lives in spade_jax.envs.validate (the module owns that name here).
    if name in ("Verdict", "ValidationConfig"):
        from spade_jax.envs import validate as module

        return getattr(module, name)
    if name in ("compile_env", "Runnable"):
        from spade_jax.envs import backends as module

        return getattr(module, name)
    if name in ("make_gem_env", "register_library_in_gem"):
        from spade_jax.envs import gem_adapter

        return getattr(gem_adapter, name)
    raise AttributeError(f"module 'spade_jax.envs' has no attribute {name!r}")
