"""Symbolic evaluator of the environment subset: Program (the parsed class) and Interp, which runs a
method's AST over traced JAX values; Interp's constructs live in one mixin module each."""

from spade_jax.envs.backends.jax.interp.interpreter import Interp
from spade_jax.envs.backends.jax.interp.predication import Frame
from spade_jax.envs.backends.jax.interp.program import Program
from spade_jax.envs.backends.jax.interp.values import RngObj, SeedArg, is_dyn, kind_of

__all__ = ["Frame", "Interp", "Program", "RngObj", "SeedArg", "is_dyn", "kind_of"]
