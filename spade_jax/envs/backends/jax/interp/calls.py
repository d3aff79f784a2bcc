"""Calls: dispatch of a call to a method, helper, lambda, builtin, module function or method of a
value; the math module and str/list/dict methods."""

from __future__ import annotations

import ast
import math
import re

import jax.numpy as jnp

from spade_jax.envs.backends.jax.interp.predication import Frame, and_
from spade_jax.envs.backends.jax.interp.values import (
    _HOST_METHODS,
    _RE_FUNCS,
    _STR_METHODS,
    BoundMethod,
    Func,
    Lambda,
    RngObj,
    _Attr,
    _Builtin,
    _DictView,
    _ev,
    _kind_name,
    _ModAttr,
    _num,
)
from spade_jax.envs.backends.jax.ir import (
    _FAIL,
    BOOL,
    INT,
    STR,
    ActionVal,
    Masked,
    StrId,
    TCat,
    Text,
    TLit,
    TSel,
    TVal,
    cat,
    unsupported,
)


class Calls:
    """Mixin of Interp: dispatches calls and runs module functions and value methods."""

    # ----- calls ------------------------------------------------------------------------------

    def eval_Call(self, node, frame):
        func = self.eval(node.func, frame)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.iterate_plain(self.eval(a.value, frame), a))
            else:
                args.append(self.eval(a, frame))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise unsupported(node, "**kwargs in a call")
            kwargs[kw.arg] = self.eval(kw.value, frame)
        if isinstance(func, ActionVal):
            return self._call_chosen(func, args, kwargs, node, frame)
        return self._call_value(func, args, kwargs, node, frame)

    def _call_chosen(self, func: ActionVal, args, kwargs, node, frame):
        """ops[op](x) with op parsed from the action: each function the table can hold is called on
        the path where the action picks it, and the results merge."""
        chosen: list = []
        for text in self.vocab or []:
            f = func.eval(text)
            if f is not _FAIL and not any(f is g for g in chosen):
                chosen.append(f)
        if not chosen or not all(isinstance(f, (Lambda, Func, BoundMethod, _Builtin)) for f in chosen):
            raise unsupported(node, "call of a value parsed from the action that is not a function")
        out, saved = None, frame.mask
        for f in chosen:
            c = self.lower(self.actionval(lambda t, f=f: func.eval(t) is f))
            frame.mask = and_(saved, c)
            r = self._call_value(f, args, kwargs, node, frame)
            frame.mask = saved
            out = r if out is None else self.merge(c, r, out, node)
        return out

    def _call_value(self, func, args, kwargs, node, frame):
        if isinstance(func, BoundMethod):
            if func.name == "reset" and self.in_init:
                return None
            return self.call_method(func.name, args, kwargs, node, caller=frame)
        if isinstance(func, Func):
            return self.call_function(func.node, args, kwargs, node, bind_self=False, caller=frame)
        if isinstance(func, Lambda):
            return self.call_lambda(func, args, node)
        if isinstance(func, _Builtin):
            return self.call_builtin(func.name, args, kwargs, node)
        if isinstance(func, _ModAttr):
            return self.call_module(func.module, func.name, args, kwargs, node, frame)
        if isinstance(func, _Attr):
            return self.call_attr(func.base, func.name, args, kwargs, node, frame)
        raise unsupported(node, "call of something that is not a method, helper or supported builtin")

    in_init = False

    def _map_text(self, t, name, node):
        if isinstance(t, TLit):
            return TLit(getattr(t.s, name)())
        if isinstance(t, TVal):
            if t.kind == STR:
                return TVal(STR, self.table_map(StrId(t.value), lambda s: getattr(s, name)(), STR).id, t.spec)
            if t.kind == INT:
                return t  # digits and '-' have no case
            raise unsupported(node, f"{name}() of composed text with a float in it")
        if isinstance(t, TSel):
            return TSel(t.cond, self._map_text(t.a, name, node), self._map_text(t.b, name, node))
        return cat(*[self._map_text(p, name, node) for p in t.parts])

    def _edges_unpadded(self, t, name) -> bool:
        """Whether text t can have no whitespace where str.<name>() would strip it."""
        def edge(t, last):
            if isinstance(t, TCat):
                return edge(t.parts[-1 if last else 0], last)
            if isinstance(t, TSel):
                return edge(t.a, last) and edge(t.b, last)
            if isinstance(t, TLit):
                return bool(t.s) and not (t.s[-1] if last else t.s[0]).isspace()
            return isinstance(t, TVal) and t.kind == INT and t.spec == ""
        return (name == "rstrip" or edge(t, False)) and (name == "lstrip" or edge(t, True))

    def call_lambda(self, lam: Lambda, args, node):
        names = [a.arg for a in lam.node.args.args]
        if len(names) != len(args):
            raise unsupported(node, "lambda called with the wrong number of arguments")
        f = Frame(dict(lam.frame.locals))
        f.mask = lam.frame.mask
        f.apath = lam.frame.apath
        f.locals.update(zip(names, args))
        return self.eval(lam.node.body, f)

    def call_module(self, module, name, args, kwargs, node, frame):
        if module == "random":
            if name in ("seed",):
                self.global_rng = True
                return None
            if name == "Random":
                return self.call_builtin("Random", args, kwargs, node)
            return self.draw(name, args, kwargs, node)
        if module == "re":
            if name not in _RE_FUNCS:
                raise unsupported(node, f"re.{name}")
            fn = getattr(re, name)
            if any(isinstance(a, ActionVal) for a in args):
                if any(self._has_dyn(a) for a in args):
                    raise unsupported(node, f"re.{name} on data-dependent text")
                return self.actionval(lambda t: fn(*[_ev(a, t) for a in args], **kwargs))
            if self._has_dyn(args):
                raise unsupported(node, f"re.{name} on data-dependent text")
            return fn(*args, **kwargs)
        if module == "math":
            return self.call_math(name, args, node)
        raise unsupported(node, f"{module}.{name}()")

    def call_math(self, name, args, node):
        if any(isinstance(a, ActionVal) for a in args):
            if not any(self._has_dyn(a) for a in args):
                return self.actionval(lambda t: getattr(math, name)(*[_ev(a, t) for a in args]))
            args = [self._as_dyn(a) for a in args]
        if not self._has_dyn(args):
            return getattr(math, name)(*args)
        fns = {
            "sqrt": lambda x: jnp.sqrt(jnp.asarray(x, jnp.float32)),
            "floor": lambda x: jnp.floor(x).astype(jnp.int32),
            "ceil": lambda x: jnp.ceil(x).astype(jnp.int32),
            "fabs": lambda x: jnp.abs(jnp.asarray(x, jnp.float32)),
            "exp": lambda x: jnp.exp(jnp.asarray(x, jnp.float32)),
            "log": lambda x, b=None: jnp.log(jnp.asarray(x, jnp.float32)) / (1.0 if b is None else math.log(b)),
            "log2": lambda x: jnp.log2(jnp.asarray(x, jnp.float32)),
            "log10": lambda x: jnp.log10(jnp.asarray(x, jnp.float32)),
            "gcd": lambda a, b: jnp.gcd(_num(a), _num(b)),
            "isqrt": lambda x: jnp.floor(jnp.sqrt(jnp.asarray(x, jnp.float32) + 0.5)).astype(jnp.int32),
            "hypot": lambda a, b: jnp.hypot(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)),
            "sin": lambda x: jnp.sin(jnp.asarray(x, jnp.float32)),
            "cos": lambda x: jnp.cos(jnp.asarray(x, jnp.float32)),
        }
        if name not in fns:
            raise unsupported(node, f"math.{name} on data-dependent values")
        return fns[name](*[_num(a) for a in args])

    def call_attr(self, base, name, args, kwargs, node, frame):
        if isinstance(base, RngObj):
            return self.draw(name, args, kwargs, node)
        if name.startswith("_"):
            raise unsupported(node, f"method {name}")
        if isinstance(base, list) and name in (
            "append", "extend", "insert", "pop", "remove", "sort", "reverse", "count", "index", "copy"
        ):
            return self.list_method(base, name, [self._lower_deep(a) for a in args], kwargs, node, frame)
        if isinstance(base, ActionVal) or any(isinstance(a, ActionVal) for a in args):
            if self._has_dyn(base) or any(self._has_dyn(a) for a in args):
                if name == "join" and isinstance(base, str):
                    return self.join(base, args[0], node)
                if isinstance(base, ActionVal):
                    base = self.lower(base)
                args = [self._as_dyn(a) for a in args]
            else:
                if name not in _HOST_METHODS:
                    raise unsupported(node, f"method {name}() on the action text")
                return self.actionval(lambda t: getattr(_ev(base, t), name)(*[_ev(a, t) for a in args], **kwargs))
        if isinstance(base, str):
            if name == "join":
                return self.join(base, args[0], node)
            if name == "format":
                return self.format_call(base, args, kwargs, node)
            if name not in _STR_METHODS:
                raise unsupported(node, f"str.{name}()")
            if self._has_dyn(args):
                searches = ("count", "find", "index", "startswith", "endswith")
                if name in searches and len(args) == 1 and isinstance(args[0], StrId):
                    kind = INT if name in ("count", "find", "index") else BOOL
                    return self.table_map(args[0], lambda s: getattr(base, name)(s), kind)
                raise unsupported(node, f"str.{name}() with data-dependent arguments")
            return getattr(base, name)(*args, **kwargs)
        if isinstance(base, StrId):
            if name not in _STR_METHODS or self._has_dyn(args):
                raise unsupported(node, f"str.{name}() on a data-dependent string")
            probe = getattr("a", name)(*args, **kwargs)
            kind = BOOL if isinstance(probe, bool) else INT if isinstance(probe, int) else STR
            if not isinstance(probe, (str, bool, int)):
                raise unsupported(node, f"str.{name}() on a data-dependent string")
            return self.table_map(base, lambda s: getattr(s, name)(*args, **kwargs), kind)
        if isinstance(base, (list, Masked)):
            return self.list_method(base, name, args, kwargs, node, frame)
        if isinstance(base, tuple):
            if name == "count":
                return self.call_builtin("sum", [[self.compare_eq(x, args[0], node) for x in base]], {}, node)
            if name == "index":
                return self.list_method(list(base), name, args, kwargs, node, frame)
        if isinstance(base, dict):
            if name == "get":
                key = args[0]
                default = args[1] if len(args) > 1 else None
                if self._has_dyn(key):
                    if default is None:
                        return self.index(base, key, node)
                    out = default
                    for k in reversed(list(base.keys())):
                        out = self.merge(self.compare_eq(key, k, node), base[k], out, node)
                    return out
                return base.get(key, default)
            if name in ("keys", "values", "items"):
                return _DictView(base, name)
        if isinstance(base, (re.Match,)) or (base is not None and type(base).__name__ == "Match"):
            return getattr(base, name)(*args)
        if isinstance(base, Text):
            if name in ("strip", "lstrip", "rstrip") and not args and self._edges_unpadded(base, name):
                return base  # str(n).strip(): the number's digits carry no whitespace to strip
            if name in ("upper", "lower", "swapcase", "casefold") and not args:
                return self._map_text(base, name, node)  # piece by piece: these act per character
            raise unsupported(node, f"method {name}() on composed text")
        raise unsupported(node, f"method {name}() on {_kind_name(base)}")
