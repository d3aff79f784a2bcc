"""Predicated control flow: a condition is a Python bool (static) or a traced jax bool; the Frame
carries a path's condition, and action predicates say which action texts a path implies."""

from __future__ import annotations

import ast

import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.interp.values import _as
from spade_jax.envs.backends.jax.ir import ActionVal


def _b(x):
    return x if x.dtype == jnp.bool_ else lax.ne(x, jnp.zeros((), x.dtype))


def and_(a, b):
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    if a is b:
        return a
    return lax.bitwise_and(_b(a), _b(b))


def or_(a, b):
    if a is False:
        return b
    if b is False:
        return a
    if a is True or b is True:
        return True
    if a is b:
        return a
    return lax.bitwise_or(_b(a), _b(b))


def not_(a):
    if isinstance(a, (bool, np.bool_)):
        return not a
    return lax.bitwise_not(_b(a))


def where(c, a, b, dtype):
    """Scalar select through lax (jnp.where's wrapper costs ~3x more per traced op)."""
    return lax.select(c, _as(a, dtype), _as(b, dtype))


def table_lookup(values: np.ndarray, idx):
    """values[idx] for a host table and a traced index (clamped, as jnp indexing is)."""
    return lax.dynamic_index_in_dim(jnp.asarray(values), _as(idx, jnp.int32), keepdims=False)


class Frame:
    """Locals plus the path condition of the code being traced."""

    def __init__(self, local_vars):
        self.locals = local_vars
        self.mask = True  # path condition
        self.ret = False  # already returned
        self.retval = _UNSET
        self.brk = False
        self.cont = False
        self.apath = None  # predicate on the action text implied by the path (None: any text)
        self._akey = None

    def active(self):
        key = (id(self.mask), id(self.ret), id(self.brk), id(self.cont))
        if self._akey != key:
            self._akey = key
            self._aval = and_(and_(self.mask, not_(self.ret)), not_(or_(self.brk, self.cont)))
            self._keep = (self.mask, self.ret, self.brk, self.cont)
        return self._aval

    def local_active(self):
        """The path condition for binding a local name: like active() but ignoring paths that
        already returned, since nothing on them reads this frame's locals again."""
        return and_(self.mask, not_(or_(self.brk, self.cont)))

    def dead(self) -> bool:
        return self.active() is False


_UNSET = object()


class _NeedsState(Exception):
    """Host evaluation of an action helper touched instance state."""


class _BreakOut(Exception):
    pass


def _pand(a, b):
    """Conjunction of two action predicates (None = always true); a failing test counts as false."""
    if a is None:
        return b
    if b is None:
        return a
    return ActionVal(lambda t: a.eval(t) is True and b.eval(t) is True)


def _strip(implied, pure):
    return None if implied is pure else implied


def _por(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return ActionVal(lambda t: a.eval(t) is True or b.eval(t) is True)


def _always_exits(stmts) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.If):
        return _always_exits(last.body) and _always_exits(last.orelse)
    return False
