"""Turning an environment program into runnable environments: the JAX backend when the program
fits its subset (spade_jax.envs.jaxenv), else the sandbox, with the reason for any fallback."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from spade_jax.envs.api import TextEnv
from spade_jax.envs.program import ProgramError, check_imports, find_env_class, parse_program
from spade_jax.envs.sandbox import SandboxPool, default_pool

__all__ = ["CompiledEnv", "compile_env", "select_backend", "transpile_or_reason"]

BACKENDS = ("auto", "jax", "sandbox")


def transpile_or_reason(source: str, class_name: str, pool: SandboxPool | None = None) -> tuple[Any | None, str | None]:
    """(TranspiledEnv, None) when the JAX backend takes the program and its equivalence check
    against the program (run in `pool`) passes, else (None, reason)."""
    try:
        from spade_jax.envs import jaxenv
    except Exception as exc:  # not built yet, or broken: the sandbox still works
        return None, f"JAX backend unavailable ({type(exc).__name__}: {exc})"
    transpile = getattr(jaxenv, "transpile", None)
    if transpile is None:
        return None, "JAX backend unavailable (spade_jax.envs.jaxenv has no transpile)"
    unsupported = getattr(jaxenv, "UnsupportedProgram", None)
    try:
        transpiled = transpile(source, class_name)
    except Exception as exc:
        if unsupported is not None and isinstance(exc, unsupported):
            return None, f"outside the JAX subset: {exc}"
        return None, f"JAX transpiler failed ({type(exc).__name__}: {exc})"
    # The jaxenv helper may provide an equivalence check against the Python program.
    verify = getattr(jaxenv, "verify_equivalence", None)
    if callable(verify):
        try:
            verify(transpiled, source, class_name, pool=pool)
        except Exception as exc:
            return None, f"JAX translation differs from the program: {exc}"
    return transpiled, None


def select_backend(
    source: str, class_name: str, backend: str = "auto", pool: SandboxPool | None = None
) -> tuple[str, str | None]:
    """("jax", None) or ("sandbox", reason the JAX backend was not used / None if not asked)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "sandbox":
        return "sandbox", None
    transpiled, reason = transpile_or_reason(source, class_name, pool)
    return ("jax", None) if transpiled is not None else ("sandbox", reason)


@dataclasses.dataclass(frozen=True)
class CompiledEnv:
    """A program made runnable: `make()` gives a fresh TextEnv (a sandbox proxy or the JAX
    environment's host TextEnv); `transpiled` is the TranspiledEnv for device rollouts."""

    class_name: str  # the environment class of the program
    backend: str  # "jax" or "sandbox"
    fallback_reason: str | None  # why the JAX backend was not used, when it was not
    source: str  # the program text
    factory: Callable[[], TextEnv]  # builds one new environment instance
    transpiled: Any = None  # spade_jax.envs.jaxenv.TranspiledEnv when backend == "jax"

    def make(self) -> TextEnv:
        return self.factory()


def compile_env(
    source: str, backend: str = "auto", *, pool: SandboxPool | None = None, class_name: str | None = None
) -> CompiledEnv:
    """Choose the backend for a program. Raises ProgramError for programs that cannot run at
    all (syntax, imports, no class) and ValueError when backend="jax" cannot take it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    tree = parse_program(source)
    check_imports(tree)
    class_name = class_name or find_env_class(tree)
    reason = None
    if backend != "sandbox":
        transpiled, reason = transpile_or_reason(source, class_name, pool)
        if transpiled is not None:
            return CompiledEnv(class_name, "jax", None, source, transpiled.text_env, transpiled)
        if backend == "jax":
            raise ValueError(f"the JAX backend cannot run {class_name}: {reason}; use backend='sandbox' or 'auto'")
    sandbox = pool

    def make_sandbox_env() -> TextEnv:
        return (sandbox or default_pool()).load(source, class_name)

    return CompiledEnv(class_name, "sandbox", reason, source, make_sandbox_env)


# Re-exported so callers catching compile errors need one import.
CompileError = ProgramError
