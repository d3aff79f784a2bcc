"""Expressions: the eval dispatcher and its budgets, conditions with the action predicates they imply,
names, attributes, subscripts and gathers from lists by a traced index."""

from __future__ import annotations

import ast

import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.interp.predication import (
    _UNSET,
    Frame,
    _NeedsState,
    _pand,
    _por,
    _strip,
    and_,
    not_,
    or_,
    table_lookup,
)
from spade_jax.envs.backends.jax.interp.values import (
    _BUILTINS,
    BoundMethod,
    Func,
    Module,
    RngObj,
    SeedArg,
    _as,
    _Attr,
    _Builtin,
    _ClassRef,
    _ev,
    _kind_name,
    _ModAttr,
    _num,
    is_dyn,
    is_num,
    kind_of,
)
from spade_jax.envs.backends.jax.ir import (
    BOOL,
    FLOAT,
    INT,
    STR,
    ActionVal,
    Masked,
    StrId,
    Text,
    TVal,
    str_domain,
    unsupported,
)

# Loops unroll when traced, so a program can trace into a graph too large for XLA to compile (a
# library knapsack retuned to 12 items brute-forces 4096 subsets: 221k operations, a 2-minute
# trace and a compile that exhausted 24 GiB). The library's largest trace builds under 5k.
MAX_TRACED_OPS = 50_000


class Expressions:
    """Mixin of Interp: evaluates expressions (operators, containers and calls have their own mixins)."""

    # ----- expressions ------------------------------------------------------------------------

    def condition_path(self, expr, frame):
        """(condition, action predicate implied when true, when false); predicates are
        ActionVals over the action text or None when nothing is implied."""
        kind, *rest = self._cond_parts(expr, frame)
        if kind == "static":
            return rest[0], None, None
        if kind == "pure":
            av = rest[0]
            return self.lower(av), av, self.actionval(lambda t: av.eval(t) is not True)
        return rest

    def _cond_parts(self, expr, frame):
        """("static", bool) | ("pure", ActionVal of a bool) | ("mixed", cond, ptrue, pfalse)."""
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            kind, *rest = self._cond_parts(expr.operand, frame)
            if kind == "static":
                return "static", not rest[0]
            if kind == "pure":
                av = rest[0]
                return "pure", self.actionval(lambda t: av.eval(t) is not True)
            c, pt, pf = rest
            return "mixed", not_(c), pf, pt
        if isinstance(expr, ast.BoolOp):
            is_and = isinstance(expr.op, ast.And)
            pure, mixed = None, []
            saved_apath = frame.apath
            for value in expr.values:
                # Later operands run only where the earlier action-only ones let them.
                if pure is not None:
                    later = pure if is_and else self.actionval(lambda t, p=pure: p.eval(t) is not True)
                    frame.apath = _pand(saved_apath, later)
                try:
                    kind, *rest = self._cond_parts(value, frame)
                finally:
                    frame.apath = saved_apath
                if kind == "static":
                    if rest[0] != is_and:
                        if pure is None and not mixed:
                            return "static", rest[0]
                        break  # short circuit: later operands are never evaluated
                    continue
                if kind == "pure":
                    pure = (_pand if is_and else _por)(pure, rest[0])
                else:
                    mixed.append(rest)
            if not mixed:
                return ("pure", pure) if pure is not None else ("static", is_and)
            out = is_and
            if pure is not None:
                out = self.lower(pure)
            implied = pure
            for c, pt, pf in mixed:
                out = and_(out, c) if is_and else or_(out, c)
                implied = (_pand if is_and else _pand)(implied, pt if is_and else pf)
            neg = None if pure is None else self.actionval(lambda t: pure.eval(t) is not True)
            if is_and:
                return "mixed", out, implied if pure is None else _pand(pure, _strip(implied, pure)), None
            return "mixed", out, None, _pand(neg, _strip(implied, pure))
        v = self.truth(self.eval(expr, frame), expr)
        if isinstance(v, ActionVal):
            return "pure", v
        if is_dyn(v):
            return "mixed", v, None, None
        return "static", bool(v)

    def condition(self, expr, frame):
        v = self.truth(self.eval(expr, frame), expr)
        if isinstance(v, ActionVal):
            v = self.lower(v)
        if is_dyn(v):
            return v
        return bool(v)

    def truth(self, v, node):
        if isinstance(v, ActionVal):
            return self.actionval(lambda t: bool(_ev(v, t)))
        if is_dyn(v):
            return v if v.dtype == jnp.bool_ else v != 0
        if isinstance(v, StrId):
            return v.id != self.table.id("")
        if isinstance(v, Masked):
            out = False
            for c, _ in v.items:
                out = or_(out, c)
            return out
        if isinstance(v, Text):
            raise unsupported(node, "truth value of composed text")
        if isinstance(v, (RngObj, Module, SeedArg)):
            return True
        return bool(v)

    def eval(self, node, frame: Frame):
        self._current_mask = frame.active()
        self._cur_apath = frame.apath
        method = getattr(self, "eval_" + type(node).__name__, None)
        if method is None:
            raise unsupported(node, f"{type(node).__name__} expression")
        if self.eval_budget is not None:
            self.eval_budget -= 1
            if self.eval_budget < 0:
                raise unsupported(node, "the program evaluates too many expressions on the host")
        out = method(node, frame)
        if is_dyn(out):
            self.op_budget -= 1
            if self.op_budget < 0:
                raise unsupported(
                    node, f"the traced program is too large to compile (over {MAX_TRACED_OPS:,} array "
                    "operations: Python loops unroll when traced)")
        self._current_mask = frame.active()
        self._cur_apath = frame.apath
        return out

    def eval_Constant(self, node, frame):
        return node.value

    def eval_Name(self, node, frame):
        name = node.id
        if name in frame.locals:
            v = frame.locals[name]
            if v is _UNSET:
                raise unsupported(node, f"{name} read before assignment")
            return v
        if name in self.p.module_consts:
            return self.p.module_consts[name]
        if name in self.p.module_funcs:
            return Func(self.p.module_funcs[name])
        if name in self.p.imports:
            imp = self.p.imports[name]
            if isinstance(imp, tuple):
                return self._from_import(imp[1], imp[2], node)
            return imp
        if name in _BUILTINS:
            return _Builtin(name)
        if name == self.p.class_name:
            return _ClassRef()
        if name == "self":
            raise unsupported(node, "self used as a value")
        raise unsupported(node, f"name {name!r} is not defined or not supported")

    def _from_import(self, module, name, node):
        if module == "random" and name == "Random":
            return _Builtin("Random")
        if module in ("random", "re", "math", "string"):
            return _ModAttr(module, name)
        raise unsupported(node, f"from {module} import {name}")

    def eval_Attribute(self, node, frame):
        if isinstance(node.value, ast.Name) and node.value.id == "self" and "self" not in frame.locals:
            name = node.attr
            if name in self.attrs:
                return self.attrs[name]
            if name in self.p.methods:
                return BoundMethod(name)
            if name in self.p.consts:
                return self.p.consts[name]
            if self.forbid_state:
                raise _NeedsState()
            raise unsupported(node, f"attribute self.{name} is read before it is set")
        base = self.eval(node.value, frame)
        if isinstance(base, _ClassRef):
            if node.attr in self.p.consts:
                return self.p.consts[node.attr]
            raise unsupported(node, f"{self.p.class_name}.{node.attr}")
        if isinstance(base, Module):
            return _ModAttr(base.name, node.attr)
        return _Attr(base, node.attr)

    def eval_Subscript(self, node, frame):
        base = self.eval(node.value, frame)
        if isinstance(node.slice, ast.Slice):
            lo = None if node.slice.lower is None else self.eval(node.slice.lower, frame)
            hi = None if node.slice.upper is None else self.eval(node.slice.upper, frame)
            st = None if node.slice.step is None else self.eval(node.slice.step, frame)
            parts = (lo, hi, st)
            if isinstance(base, ActionVal) or any(isinstance(x, ActionVal) for x in parts):
                return self.actionval(lambda t: _ev(base, t)[slice(*[_ev(x, t) for x in parts])])
            if any(is_dyn(x) or isinstance(x, StrId) for x in parts):
                raise unsupported(node, "slice with a data-dependent bound")
            if isinstance(base, StrId):
                return self.table_map(base, lambda s: s[slice(*parts)], STR)
            if isinstance(base, (list, tuple, str)):
                return base[slice(*parts)]
            raise unsupported(node, f"slicing {_kind_name(base)}")
        idx = self.eval(node.slice, frame)
        return self.index(base, idx, node)

    def index(self, base, idx, node):
        if isinstance(base, ActionVal) or isinstance(idx, ActionVal):
            if isinstance(idx, ActionVal) and self._has_dyn(base):
                idx = self.lower(idx)
            elif isinstance(base, ActionVal) and (is_dyn(idx) or isinstance(idx, StrId)):
                base = self.lower(base)
            else:
                return self.actionval(lambda t: _ev(base, t)[_ev(idx, t)])
        if isinstance(base, dict):
            if not is_dyn(idx) and not isinstance(idx, StrId):
                if idx not in base:
                    raise unsupported(node, f"key {idx!r} not in dict")
                return base[idx]
            keys = list(base.keys())
            out = base[keys[-1]]
            for k in reversed(keys[:-1]):
                out = self.merge(self.compare_eq(idx, k, node), base[k], out, node)
            return out
        if isinstance(base, StrId):
            if is_dyn(idx):
                if kind_of(idx) == FLOAT:
                    raise unsupported(node, "string index that is not an integer")
                # s[i]: pick among the positions of the string (out of range is assumed unreachable).
                chars = [ch for _, ch in self.chars(base, node).items]
                if not chars:
                    return base
                i = _as(_num(idx), jnp.int32)
                i = lax.select(lax.lt(i, np.int32(0)), lax.add(i, self.table_map(base, len, INT)), i)
                return self.gather(chars, i, node)
            return self.table_map(base, lambda s: s[idx], STR)
        if isinstance(base, str):
            if is_dyn(idx):
                base = list(base)
            else:
                return base[idx]
        if isinstance(base, range):
            base = list(base)
        if isinstance(base, TVal) and base.kind == INT and not base.spec and not isinstance(idx, (StrId, str)):
            chars = self.text_chars(base, node)  # str(n)[i]
            n = self.call_builtin("len", [base], {}, node)
            i = _as(_num(idx), jnp.int32)
            i = lax.select(lax.lt(i, np.int32(0)), lax.add(i, n), i)
            return self.gather([ch for _, ch in chars.items], i, node)
        if isinstance(base, Masked):
            raise unsupported(node, "indexing a filtered list")
        if not isinstance(base, (list, tuple)):
            raise unsupported(node, f"indexing {_kind_name(base)}")
        if isinstance(idx, (bool, int)):
            try:
                return base[idx]
            except IndexError:
                raise unsupported(node, f"index {idx} out of range (length {len(base)})") from None
        if not is_dyn(idx) or kind_of(idx) == FLOAT:
            raise unsupported(node, "list index that is not an integer")
        return self.gather(base, idx, node)

    def gather(self, items, idx, node):
        n = len(items)
        if n == 0:
            raise unsupported(node, "indexing an empty list")
        if idx.dtype == jnp.bool_:
            idx = idx.astype(jnp.int32)
        idx = _as(idx, jnp.int32)
        idx = lax.select(lax.lt(idx, np.int32(0)), lax.add(idx, np.int32(n)), idx)
        if all(isinstance(x, (list, tuple)) for x in items):
            lengths = {len(x) for x in items}
            if len(lengths) != 1:
                raise unsupported(node, "data-dependent index into rows of different lengths")
            cols = [self.gather([row[k] for row in items], idx, node) for k in range(lengths.pop())]
            return tuple(cols) if isinstance(items[0], tuple) else cols
        if all(isinstance(x, (str, StrId)) for x in items):
            return StrId(self._stack_index([self.str_id(x) for x in items], idx, jnp.int32), str_domain(*items))
        if all(is_num(x) for x in items):
            kinds = {kind_of(x) for x in items}
            dtype = jnp.bool_ if kinds == {BOOL} else jnp.float32 if FLOAT in kinds else jnp.int32
            return self._stack_index([x if dtype == jnp.bool_ else _num(x) for x in items], idx, dtype)
        out = items[-1]
        for k in range(n - 2, -1, -1):
            out = self.merge(idx == k, items[k], out, node)
        return out

    def _stack_index(self, items, idx, dtype):
        if not any(is_dyn(x) for x in items):
            return table_lookup(np.array(items, dtype), idx)
        stacked = lax.concatenate([lax.broadcast(_as(x, dtype), (1,)) for x in items], 0)
        return lax.dynamic_index_in_dim(stacked, idx, keepdims=False)
