"""Operators: arithmetic, unary and boolean operators, conditional expressions, comparisons and
membership tests, on Python, traced and action-derived values alike."""

from __future__ import annotations

import ast
import operator

import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.interp.predication import _pand, and_, not_, or_
from spade_jax.envs.backends.jax.interp.values import (
    _BINOPS,
    _CMPOPS,
    _JNP_BINOPS,
    _JNP_CMPOPS,
    _LAX_ARITH,
    _LAX_CMPOPS,
    _as,
    _ev,
    _ev_deep,
    _has_av,
    _kind_name,
    _num,
    is_dyn,
    is_num,
    kind_of,
)
from spade_jax.envs.backends.jax.ir import BOOL, FLOAT, INT, ActionVal, Masked, StrId, Text, TVal, cat, unsupported


class Operators:
    """Mixin of Interp: binary, unary, boolean and comparison operators."""

    def eval_BinOp(self, node, frame):
        return self.binop(node.op, self.eval(node.left, frame), self.eval(node.right, frame), node)

    def binop(self, op, a, b, node):
        pyop = _BINOPS.get(type(op))
        if pyop is None:
            raise unsupported(node, f"operator {type(op).__name__}")
        if isinstance(op, (ast.Add, ast.Mult)) and isinstance(a, (list, tuple)) and isinstance(b, (list, tuple, int)):
            pass  # list concatenation/repetition keeps action values as items
        elif _has_av(a) or _has_av(b):
            a, b = (self._lower_deep(a), self._lower_deep(b)) if (self._has_dyn(a) or self._has_dyn(b)) else (a, b)
        if isinstance(a, ActionVal) or isinstance(b, ActionVal):
            if self._has_dyn(a) or self._has_dyn(b):
                a = self.lower(a) if isinstance(a, ActionVal) else a
                b = self.lower(b) if isinstance(b, ActionVal) else b
            else:
                return self.actionval(lambda t: pyop(_ev(a, t), _ev(b, t)))
        if not self._has_dyn(a) and not self._has_dyn(b):
            if isinstance(op, ast.Mult) and isinstance(a, (list, tuple, str)) + isinstance(b, (list, tuple, str)) == 1:
                times = b if isinstance(b, int) else a if isinstance(a, int) else 1
                n = (len(a) if isinstance(a, (list, tuple, str)) else 1) * times
                if isinstance(n, int) and n > 1_000_000:
                    raise unsupported(node, "sequence repeated into more than a million items")
            if isinstance(op, (ast.Pow, ast.LShift)) and isinstance(b, int) and b > 4096:
                raise unsupported(node, "integer power too large")
            try:
                return pyop(a, b)
            except Exception as exc:
                raise unsupported(node, f"constant expression raises {type(exc).__name__}") from None
        if isinstance(op, ast.Add) and (isinstance(a, (str, StrId, Text)) or isinstance(b, (str, StrId, Text))):
            return self.simplify_text(cat(self.to_text(a, "", node), self.to_text(b, "", node)))
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and isinstance(op, ast.Add):
            return type(a)(list(a) + list(b))
        if isinstance(op, ast.Mult) and isinstance(a, (list, tuple)) and isinstance(b, int):
            return type(a)(list(a) * b)
        if isinstance(op, ast.Mult) and isinstance(b, (list, tuple)) and isinstance(a, int):
            return type(b)(list(b) * a)
        if not (is_num(a) and is_num(b)):
            raise unsupported(node, f"{type(op).__name__} of {_kind_name(a)} and {_kind_name(b)}")
        x, y = _num(a), _num(b)
        if isinstance(op, ast.Div):
            return jnp.true_divide(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
        if isinstance(op, ast.Pow):
            if kind_of(a) == INT and kind_of(b) == INT:
                if isinstance(y, int) and y < 0:
                    return jnp.power(jnp.asarray(x, jnp.float32), y)
                return jnp.power(jnp.asarray(x, jnp.int32), jnp.asarray(y, jnp.int32))
            return jnp.power(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
        if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)) and kind_of(a) == BOOL and kind_of(b) == BOOL:
            return {ast.BitAnd: jnp.logical_and, ast.BitOr: jnp.logical_or, ast.BitXor: jnp.logical_xor}[type(op)](a, b)
        if type(op) in _LAX_ARITH:
            dtype = jnp.float32 if FLOAT in (kind_of(x), kind_of(y)) else jnp.int32
            return _LAX_ARITH[type(op)](_as(x, dtype), _as(y, dtype))
        return _JNP_BINOPS[type(op)](x, y)

    def eval_UnaryOp(self, node, frame):
        v = self.eval(node.operand, frame)
        if isinstance(node.op, ast.Not):
            t = self.truth(v, node)
            if isinstance(t, ActionVal):
                return self.actionval(lambda s: not t.eval(s))
            return not_(t) if not isinstance(t, bool) else (not t)
        if isinstance(v, ActionVal):
            fn = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}[type(node.op)]
            return self.actionval(lambda s: fn(_ev(v, s)))
        if not is_num(v):
            raise unsupported(node, f"unary {type(node.op).__name__} of {_kind_name(v)}")
        if isinstance(node.op, ast.USub):
            return -_num(v)
        if isinstance(node.op, ast.UAdd):
            return _num(v)
        return ~_num(v)

    def eval_BoolOp(self, node, frame):
        is_and = isinstance(node.op, ast.And)
        result = self.eval(node.values[0], frame)
        for expr in node.values[1:]:
            t = self.truth(result, node)
            if isinstance(t, ActionVal):
                right = self.eval(expr, frame)
                left = result
                if not self._has_dyn(right):
                    if is_and:
                        result = self.actionval(lambda s, lhs=left, rhs=right: _ev(lhs, s) and _ev(rhs, s))
                    else:
                        result = self.actionval(lambda s, lhs=left, rhs=right: _ev(lhs, s) or _ev(rhs, s))
                    continue
                t = self.lower(t)
                left = self.lower(left)
                result = self.merge(t, right, left, node) if is_and else self.merge(t, left, right, node)
                continue
            if isinstance(t, bool):
                if t != is_and:
                    return result  # short circuit
                result = self.eval(expr, frame)
                continue
            right = self.eval(expr, frame)
            if isinstance(right, ActionVal):
                right = self.lower(right)
            if kind_of(result) == BOOL and kind_of(self.truth(right, node)) == BOOL and (
                kind_of(right) == BOOL
            ):
                result = jnp.logical_and(result, right) if is_and else jnp.logical_or(result, right)
            else:
                result = self.merge(t, right, result, node) if is_and else self.merge(t, result, right, node)
        return result

    def eval_IfExp(self, node, frame):
        c, pt, pf = self.condition_path(node.test, frame)
        if c is True:
            return self.eval(node.body, frame)
        if c is False:
            return self.eval(node.orelse, frame)
        saved = frame.apath
        frame.apath = _pand(saved, pt)
        body = self.eval(node.body, frame)
        frame.apath = _pand(saved, pf)
        orelse = self.eval(node.orelse, frame)
        frame.apath = saved
        if pt is not None and not self._has_dyn(body) and not self._has_dyn(orelse):
            # Decided by the action alone: stays a host function of the text.
            return self.actionval(lambda t: _ev(body, t) if pt.eval(t) is True else _ev(orelse, t))
        if isinstance(body, ActionVal):
            self._cur_apath = _pand(saved, pt)
            body = self.lower(body)
        if isinstance(orelse, ActionVal):
            self._cur_apath = _pand(saved, pf)
            orelse = self.lower(orelse)
        self._cur_apath = saved
        return self.merge(c, body, orelse, node)

    def eval_Compare(self, node, frame):
        left = self.eval(node.left, frame)
        result = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node, frame)
            r = self.compare(op, left, right, node)
            if isinstance(result, ActionVal) or isinstance(r, ActionVal):
                if isinstance(result, bool) and result:
                    result = r
                elif is_dyn(result) or is_dyn(r):
                    result = and_(self._as_dyn(result), self._as_dyn(r))
                else:
                    prev = result
                    result = self.actionval(lambda s, a=prev, b=r: _ev(a, s) and _ev(b, s))
            else:
                result = and_(result, r)
            left = right
        return result

    def _as_dyn(self, v):
        return self.lower(v) if isinstance(v, ActionVal) else v

    def _lower_deep(self, v):
        if isinstance(v, ActionVal):
            return self.lower(v)
        if isinstance(v, list) and _has_av(v):
            return [self._lower_deep(x) for x in v]
        if isinstance(v, tuple) and _has_av(v):
            return tuple(self._lower_deep(x) for x in v)
        return v

    def compare(self, op, a, b, node):
        if isinstance(op, (ast.Is, ast.IsNot)):
            if isinstance(a, ActionVal) or isinstance(b, ActionVal):
                fn = operator.is_ if isinstance(op, ast.Is) else operator.is_not
                return self.actionval(lambda s: fn(_ev(a, s), _ev(b, s)))
            if a is None or b is None:
                same = a is b
                return same if isinstance(op, ast.Is) else not same
            if not self._has_dyn(a) and not self._has_dyn(b):
                return (a is b) if isinstance(op, ast.Is) else (a is not b)
            raise unsupported(node, "'is' comparison between values (use ==)")
        if isinstance(op, (ast.In, ast.NotIn)):
            r = self.contains(b, a, node)
            if isinstance(op, ast.In):
                return r
            if isinstance(r, ActionVal):
                return self.actionval(lambda s: not r.eval(s))
            return not_(r)
        if isinstance(op, (ast.Eq, ast.NotEq)) and (isinstance(a, TVal) or isinstance(b, TVal)):
            r = self.compare_eq(a, b, node)
            return r if isinstance(op, ast.Eq) else not_(r)
        if _has_av(a) or _has_av(b):
            if self._has_dyn(a) or self._has_dyn(b):
                a, b = self._lower_deep(a), self._lower_deep(b)
            else:
                fn = _CMPOPS[type(op)]
                return self.actionval(lambda s: fn(_ev_deep(a, s), _ev_deep(b, s)))
        if isinstance(op, (ast.Eq, ast.NotEq)):
            r = self.compare_eq(a, b, node)
            return r if isinstance(op, ast.Eq) else not_(r)
        if not self._has_dyn(a) and not self._has_dyn(b):
            return _CMPOPS[type(op)](a, b)
        if is_num(a) and is_num(b):
            dtype = jnp.float32 if FLOAT in (kind_of(a), kind_of(b)) else jnp.int32
            return _LAX_CMPOPS[type(op)](_as(_num(a), dtype), _as(_num(b), dtype))
        if isinstance(a, (str, StrId)) and isinstance(b, (str, StrId)):
            if isinstance(b, str):
                return self.table_map(a, lambda s: _CMPOPS[type(op)](s, b), BOOL)
            if isinstance(a, str):
                return self.table_map(b, lambda s: _CMPOPS[type(op)](a, s), BOOL)
            ranks = sorted(range(len(self.table)), key=lambda i: self.table.strings[i])
            rank = np.empty(len(ranks), np.int32)
            rank[ranks] = np.arange(len(ranks))
            return _JNP_CMPOPS[type(op)](jnp.asarray(rank)[a.id], jnp.asarray(rank)[b.id])
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            raise unsupported(node, "ordering comparison of lists")
        raise unsupported(node, f"comparison of {_kind_name(a)} and {_kind_name(b)}")

    def compare_eq(self, a, b, node):
        if isinstance(a, Text) and isinstance(b, ActionVal):
            a, b = b, a
        if isinstance(a, ActionVal) and isinstance(b, TVal) and b.kind == INT and b.spec == "":
            return self._action_equals_int_text(a, b.value)
        if _has_av(a) or _has_av(b):
            a, b = self._lower_deep(a), self._lower_deep(b)
        if not self._has_dyn(a) and not self._has_dyn(b):
            return a == b
        if a is None or b is None:
            return False
        if isinstance(a, (str, StrId)) and isinstance(b, (str, StrId)):
            if isinstance(a, str) and a not in self.table._ids:
                return jnp.zeros((), bool) if isinstance(b, StrId) else a == b
            if isinstance(b, str) and b not in self.table._ids:
                return jnp.zeros((), bool)
            return lax.eq(_as(self.str_id(a), jnp.int32), _as(self.str_id(b), jnp.int32))
        if is_num(a) and is_num(b):
            dtype = jnp.float32 if FLOAT in (kind_of(a), kind_of(b)) else (
                jnp.bool_ if kind_of(a) == kind_of(b) == BOOL else jnp.int32)
            return lax.eq(
                _as(a if dtype == jnp.bool_ else _num(a), dtype), _as(b if dtype == jnp.bool_ else _num(b), dtype)
            )
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if type(a) is not type(b) or len(a) != len(b):
                return False
            out = True
            for x, y in zip(a, b):
                out = and_(out, self.compare_eq(x, y, node))
            return out
        if isinstance(a, Text) or isinstance(b, Text):
            raise unsupported(node, "comparing composed text")
        return False

    def _action_equals_int_text(self, av, x):
        """text == str(x) for an action-derived text and a traced int: the text must be the
        canonical decimal of an int32 (no sign '+', no leading zeros, no spaces) equal to x."""
        def parse(t):
            s = _ev(av, t)
            if not isinstance(s, str):
                return None
            try:
                n = int(s)
            except ValueError:
                return None
            return n if str(n) == s and -(2**31) <= n < 2**31 else None

        valid = self.lower(self.actionval(lambda t: parse(t) is not None))
        value = self.lower(self.actionval(lambda t: parse(t) if parse(t) is not None else 0))
        return and_(valid, lax.eq(value, _as(_num(x), jnp.int32)))

    def contains(self, container, item, node):
        if _has_av(container) or _has_av(item):
            if self._has_dyn(container) or self._has_dyn(item):
                container, item = self._lower_deep(container), self._lower_deep(item)
            else:
                return self.actionval(lambda s: _ev_deep(item, s) in _ev_deep(container, s))
        if not self._has_dyn(container) and not self._has_dyn(item):
            return item in container
        if isinstance(container, StrId):
            if isinstance(item, str):
                return self.table_map(container, lambda s: item in s, BOOL)
            raise unsupported(node, "substring test between two data-dependent strings")
        if isinstance(container, str) and isinstance(item, StrId):
            return self.table_map(item, lambda s: s in container, BOOL)
        if isinstance(container, Text) and isinstance(item, (str, StrId)):
            container = self.text_chars(container, node)  # "7" in str(n)
        if isinstance(container, dict):
            container = list(container.keys())
        if isinstance(container, range):
            container = list(container)
        if isinstance(container, Masked):
            out = False
            for c, v in container.items:
                out = or_(out, and_(c, self.compare_eq(item, v, node)))
            return out
        if isinstance(container, (list, tuple, set, frozenset)):
            out = False
            for v in container:
                out = or_(out, self.compare_eq(item, v, node))
            return out
        raise unsupported(node, f"membership test in {_kind_name(container)}")
