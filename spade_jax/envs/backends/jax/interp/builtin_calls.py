"""Builtins on traced values: len, min/max, sum, all/any, sorted, conversions and the rest of the
supported builtins (constant arguments run the real builtin on the host)."""

from __future__ import annotations

import ast
import functools

import jax.numpy as jnp
import numpy as np

from spade_jax.envs.backends.jax.interp.predication import and_, not_, or_
from spade_jax.envs.backends.jax.interp.values import (
    _HOST_BUILTINS,
    BoundMethod,
    DynRange,
    Lambda,
    RngObj,
    SeedArg,
    _Attr,
    _Builtin,
    _ev_deep,
    _has_av,
    _kind_name,
    _num,
    is_dyn,
    is_num,
    kind_of,
)
from spade_jax.envs.backends.jax.ir import BOOL, FLOAT, INT, STR, Masked, StrId, Text, unsupported


class Builtins:
    """Mixin of Interp: the supported builtins on traced and action-derived values."""

    # ----- builtins ---------------------------------------------------------------------------

    def call_builtin(self, name, args, kwargs, node):
        if name == "Random":
            if args and not isinstance(args[0], (SeedArg, int, type(None))):
                raise unsupported(node, "random.Random seeded with something other than the reset seed")
            return RngObj()
        if name == "print":
            return None
        if any(_has_av(a) for a in args) and not any(self._has_dyn(a) for a in args) and name in _HOST_BUILTINS:
            fn = _HOST_BUILTINS[name]
            return self.actionval(lambda t: fn(*[_ev_deep(a, t) for a in args], **kwargs))
        args = [self._lower_deep(a) for a in args]
        if not self._has_dyn(args) and name in _HOST_BUILTINS and name not in ("min", "max", "sorted", "sum") or (
            name in ("min", "max", "sorted", "sum") and not self._has_dyn(args) and "key" not in kwargs
        ):
            if name in ("range", "len", "enumerate", "zip", "list", "tuple", "reversed") or not any(
                isinstance(a, Masked) for a in args
            ):
                try:
                    out = _HOST_BUILTINS[name](*args, **kwargs)
                except Exception as exc:
                    raise unsupported(node, f"{name}() raises {type(exc).__name__} here") from None
                if name in ("enumerate", "zip", "reversed", "map", "filter"):
                    out = list(out)
                return out
        if name == "len":
            v = args[0]
            if isinstance(v, Masked):
                return self.call_builtin("sum", [[jnp.asarray(c, jnp.int32) for c, _ in v.items]], {}, node)
            if isinstance(v, (list, tuple, dict, str, range)):
                return len(v)
            if isinstance(v, StrId):
                return self.table_map(v, len, INT)
            if isinstance(v, Text):
                present = [jnp.asarray(c, jnp.int32) for c, _ in self.text_chars(v, node).items]
                return self.call_builtin("sum", [present], {}, node)
            raise unsupported(node, f"len of {_kind_name(v)}")
        if name == "range":
            if kwargs or not 1 <= len(args) <= 3 or not all(is_num(a) and kind_of(a) != FLOAT for a in args):
                raise unsupported(node, "range() of non-integers")
            start, stop = (0, args[0]) if len(args) == 1 else (args[0], args[1])
            step = args[2] if len(args) > 2 else 1
            if is_dyn(step) or step == 0:
                raise unsupported(node, "range with a data-dependent step")
            return DynRange(start, stop, step)
        if name == "zip" and not kwargs and any(isinstance(a, StrId) for a in args) and all(
            isinstance(a, (StrId, str, list, tuple)) for a in args
        ):
            # zip over data-dependent strings: positions present in every argument (they are prefixes)
            cols = [self.chars(a, node).items if isinstance(a, StrId) else [(True, x) for x in a] for a in args]
            return Masked([(functools.reduce(and_, [c for c, _ in row]), tuple(x for _, x in row))
                           for row in zip(*cols)])
        if name in ("list", "enumerate") and args and isinstance(args[0], (StrId, Text)):
            # the characters of a data-dependent string, or of str(n)
            chars = self.chars(args[0], node) if isinstance(args[0], StrId) else self.text_chars(args[0], node)
            if name == "list":
                return chars
            start = args[1] if len(args) > 1 else kwargs.get("start", 0)
            return Masked([(c, (self.binop(ast.Add(), start, i, node), ch)) for i, (c, ch) in enumerate(chars.items)])
        if name == "dict":
            if len(args) == 1 and not kwargs and isinstance(args[0], dict):
                return dict(args[0])
            raise unsupported(node, "dict() of data-dependent values other than a copy of a dict")
        if name in ("int", "float", "bool"):
            return self.convert(name, args[0] if args else 0, node)
        if name in ("str", "repr"):
            v = args[0]
            if name == "repr" and isinstance(v, StrId):
                return self.table_map(v, repr, STR)
            if name == "repr" and isinstance(v, Text):
                raise unsupported(node, "repr of composed text")
            return self.simplify_text(self.to_text(v, "", node))
        if name == "abs":
            return jnp.abs(_num(args[0]))
        if name == "round":
            x = args[0]
            if len(args) > 1 and args[1] is not None:
                if self._has_dyn(args[1]):
                    raise unsupported(node, "round to a data-dependent number of digits")
                return jnp.round(jnp.asarray(x, jnp.float32), args[1])
            if kind_of(x) == FLOAT:
                return jnp.round(x).astype(jnp.int32)
            return _num(x)
        if name in ("min", "max"):
            return self.minmax(name, args, kwargs, node)
        if name == "sum":
            start = args[1] if len(args) > 1 else kwargs.get("start", 0)
            seq = args[0]
            if isinstance(seq, Masked):
                items = [self._masked_value(c, v, 0, node) for c, v in seq.items]
            else:
                items = self.iterate_plain(seq, node)
            total = start
            for x in items:
                total = self.binop(ast.Add(), total, x, node)
            return total
        if name in ("all", "any"):
            seq = args[0]
            out = name == "all"
            pairs = seq.items if isinstance(seq, Masked) else [(True, x) for x in self.iterate_plain(seq, node)]
            for c, x in pairs:
                t = self._as_dyn(self.truth(x, node))
                if name == "all":
                    out = and_(out, or_(not_(c), t))
                else:
                    out = or_(out, and_(c, t))
            return out
        if name in ("list", "tuple"):
            if not args:
                return [] if name == "list" else ()
            v = args[0]
            if isinstance(v, Masked):
                if name == "tuple":
                    raise unsupported(node, "tuple of a filtered list")
                return Masked(list(v.items))
            items = self.iterate_plain(v, node)
            return items if name == "list" else tuple(items)
        if name == "sorted":
            return self.sorted_(args[0], kwargs, node)
        if name == "reversed":
            return list(reversed(self.iterate_plain(args[0], node)))
        if name == "enumerate":
            start = args[1] if len(args) > 1 else kwargs.get("start", 0)
            return [(start + i, x) for i, x in enumerate(self.iterate_plain(args[0], node))]
        if name == "zip":
            return [tuple(t) for t in zip(*[self.iterate_plain(a, node) for a in args])]
        if name == "divmod":
            return (self.binop(ast.FloorDiv(), args[0], args[1], node), self.binop(ast.Mod(), args[0], args[1], node))
        if name == "pow":
            return self.binop(ast.Pow(), args[0], args[1], node)
        if name == "isinstance":
            raise unsupported(node, "isinstance on a data-dependent value")
        raise unsupported(node, f"{name}() on data-dependent values")

    def _masked_value(self, c, v, default, node):
        if c is True:
            return v
        return self.merge(c, v, default, node)

    def convert(self, name, v, node):
        if isinstance(v, StrId):
            fn = {"int": int, "float": float, "bool": bool}[name]
            return self.table_map(v, fn, {"int": INT, "float": FLOAT, "bool": BOOL}[name])
        if name == "bool":
            return self._as_dyn(self.truth(v, node))
        if not is_num(v):
            raise unsupported(node, f"{name}() of {_kind_name(v)}")
        if name == "int":
            if kind_of(v) == FLOAT:
                return jnp.trunc(v).astype(jnp.int32)
            return jnp.asarray(_num(v), jnp.int32)
        return jnp.asarray(_num(v), jnp.float32)

    def minmax(self, name, args, kwargs, node):
        if "default" in kwargs:
            raise unsupported(node, f"{name}(..., default=...)")
        key = kwargs.get("key")
        if len(args) == 1:
            seq = args[0]
            if isinstance(seq, Masked):
                if key is not None:
                    raise unsupported(node, f"{name} with key over a filtered list")
                fill = jnp.inf if name == "min" else -jnp.inf
                vals = [v for _, v in seq.items]
                kinds = {kind_of(v) for v in vals}
                if not kinds <= {INT, BOOL, FLOAT}:
                    raise unsupported(node, f"{name} over non-numbers")
                dtype = jnp.float32 if FLOAT in kinds else jnp.int32
                if dtype == jnp.int32:
                    fill = np.iinfo(np.int32).max if name == "min" else np.iinfo(np.int32).min
                stacked = jnp.stack(
                    [jnp.where(jnp.asarray(c, bool), jnp.asarray(_num(v), dtype), fill) for c, v in seq.items]
                )
                return (jnp.min if name == "min" else jnp.max)(stacked)
            items = self.iterate_plain(seq, node)
        else:
            items = list(args)
        if not items:
            raise unsupported(node, f"{name}() of an empty sequence")
        if key is not None:
            keys = [self.call_key(key, x, node) for x in items]
            best, best_key = items[0], keys[0]
            for x, k in zip(items[1:], keys[1:]):
                better = self.compare(ast.Lt() if name == "min" else ast.Gt(), k, best_key, node)
                best = self.merge(better, x, best, node)
                best_key = self.merge(better, k, best_key, node)
            return best
        if not all(is_num(x) for x in items):
            raise unsupported(node, f"{name} over non-numbers")
        out = _num(items[0])
        for x in items[1:]:
            out = (jnp.minimum if name == "min" else jnp.maximum)(out, _num(x))
        return out

    def call_key(self, key, x, node):
        if isinstance(key, Lambda):
            return self.call_lambda(key, [x], node)
        if isinstance(key, _Builtin):
            return self.call_builtin(key.name, [x], {}, node)
        if isinstance(key, BoundMethod):
            return self.call_method(key.name, [x], {}, node)
        if isinstance(key, _Attr):
            raise unsupported(node, "key function")
        raise unsupported(node, "key function")

    def sorted_(self, seq, kwargs, node):
        items = self.iterate_plain(seq, node)
        reverse = kwargs.get("reverse", False)
        if kwargs.get("key") is not None or self._has_dyn(reverse):
            raise unsupported(node, "sorted with a key over data-dependent values")
        if not all(is_num(x) for x in items):
            raise unsupported(node, "sorting data-dependent non-numbers")
        kinds = {kind_of(x) for x in items}
        dtype = jnp.float32 if FLOAT in kinds else jnp.int32
        arr = jnp.sort(jnp.stack([jnp.asarray(_num(x), dtype) for x in items]))
        if reverse:
            arr = arr[::-1]
        return [arr[i] for i in range(len(items))]
