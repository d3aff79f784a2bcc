"""Environment backends by name: the registry (`@register_backend`), the backend names a config may
give (BACKEND_CHOICES), and the `auto` policy that picks a backend for a program (compile_env)."""

from __future__ import annotations

import dataclasses

from spade_jax.envs.backends.base import _REGISTRY, EnvBackend, NotAdmitted, Runnable, register_backend
from spade_jax.envs.program import check_imports, find_env_class, parse_program

__all__ = [
    "BACKEND_CHOICES",
    "EnvBackend",
    "NotAdmitted",
    "Runnable",
    "compile_env",
    "get_backend",
    "register_backend",
    "select_backend",
]

# The implementations register themselves (base.register_backend) when imported; the order of these
# imports is the auto policy's order of preference.
from spade_jax.envs.backends.jax.backend import JaxBackend  # noqa: F401 (imported to register it)
from spade_jax.envs.backends.sandbox.backend import SandboxBackend  # noqa: F401 (imported to register it)

# What the `backend` config key, validate(backend=...) and `check --backend` accept.
BACKEND_CHOICES = ("auto", *_REGISTRY)


def get_backend(name: str) -> EnvBackend:
    _check_choice(name)
    if name == "auto":
        raise ValueError("'auto' is a policy, not a backend; use compile_env or select_backend")
    return _REGISTRY[name]


def _check_choice(backend: str) -> None:
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {backend!r}")


def _fallback() -> EnvBackend:
    return next(b for b in _REGISTRY.values() if b.runs_everything)


def _candidates(backend: str) -> list[EnvBackend]:
    """The backends to try, in order: the one named, or for auto every one that does not run
    everything (the fallback needs no trial)."""
    if backend == "auto":
        return [b for b in _REGISTRY.values() if not b.runs_everything]
    return [get_backend(backend)]


def _admit_first(candidates, source: str, class_name: str, pool) -> tuple[Runnable | None, str | None]:
    """The first candidate's Runnable that admits the program, else (None, the reasons joined)."""
    reasons = []
    for candidate in candidates:
        try:
            return candidate.admit(source, class_name, pool=pool), None
        except NotAdmitted as exc:
            reasons.append(str(exc))
    return None, "; ".join(reasons) or None


def select_backend(source: str, class_name: str, backend: str = "auto", pool=None) -> tuple[str, str | None]:
    """(name of the backend that runs the program, None), or (the fallback's name, why the backend
    asked for, or auto's preferred ones, did not take it)."""
    _check_choice(backend)
    runnable, reason = _admit_first(_candidates(backend), source, class_name, pool)
    return (runnable.backend, None) if runnable is not None else (_fallback().name, reason)


def compile_env(source: str, backend: str = "auto", *, pool=None, class_name: str | None = None) -> Runnable:
    """Choose the backend for a program and make it runnable. Raises ProgramError for programs that
    cannot run at all (syntax, imports, no class) and ValueError when the backend named cannot take it."""
    _check_choice(backend)
    tree = parse_program(source)
    check_imports(tree)
    class_name = class_name or find_env_class(tree)
    runnable, reason = _admit_first(_candidates(backend), source, class_name, pool)
    if runnable is not None:
        return runnable
    fallback = _fallback()
    if backend != "auto":
        raise ValueError(f"the {get_backend(backend).title} backend cannot run {class_name}: {reason}; "
                         f"use backend='{fallback.name}' or 'auto'")
    return dataclasses.replace(fallback.admit(source, class_name, pool=pool), fallback_reason=reason)
