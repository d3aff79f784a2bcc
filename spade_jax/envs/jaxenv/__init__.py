"""JAX backend for text environments: transpiles designer programs written in a restricted
Python subset into pure, jittable, vmappable gymnax-style environments."""

from spade_jax.envs.jaxenv.env import EnvParams, EnvState, TranspiledEnv, transpile
from spade_jax.envs.jaxenv.equivalence import (
    EquivalenceReport,
    InProcessProgram,
    check_equivalence,
    try_jax_backend,
    verify_equivalence,
)
from spade_jax.envs.jaxenv.ir import UnsupportedProgram

__all__ = [
    "EnvParams",
    "EnvState",
    "EquivalenceReport",
    "InProcessProgram",
    "TranspiledEnv",
    "UnsupportedProgram",
    "check_equivalence",
    "transpile",
    "try_jax_backend",
    "verify_equivalence",
]
