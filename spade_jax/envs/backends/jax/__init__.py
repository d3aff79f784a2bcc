"""The JAX backend: transpiles programs written in a restricted Python subset into pure, jittable,
vmappable gymnax-style environments (env.py via interp/), checked against the program (equivalence.py)."""

import importlib

# The transpiler pulls in gymnax and flax (about a second): its names load on first use, so that
# registering the backend (backend.py) costs nothing.
_LAZY = {
    "EnvParams": "env",
    "EnvState": "env",
    "TranspiledEnv": "env",
    "transpile": "env",
    "EquivalenceReport": "equivalence",
    "InProcessProgram": "equivalence",
    "check_equivalence": "equivalence",
    "try_jax_backend": "equivalence",
    "verify_equivalence": "equivalence",
    "UnsupportedProgram": "ir",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
