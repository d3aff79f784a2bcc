"""What the evaluator computes with besides arrays: references to program objects (generator, seed,
module, function, method, builtin), value kinds, and the operators and builtins the subset supports."""

from __future__ import annotations

import ast
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.ir import _FAIL, BOOL, FLOAT, INT, ActionVal, Masked, StrId, Text

_MODULES = {"random", "re", "math", "string"}
_STR_METHODS = {
    "strip", "lstrip", "rstrip", "lower", "upper", "title", "capitalize", "isdigit", "isalpha",
    "isalnum", "isnumeric", "isdecimal", "isspace", "islower", "isupper", "startswith", "endswith",
    "split", "rsplit", "replace", "find", "rfind", "index", "count", "join", "center", "ljust",
    "rjust", "zfill", "format", "casefold", "removeprefix", "removesuffix", "partition", "splitlines",
    "swapcase",
}
_HOST_METHODS = _STR_METHODS | {"group", "groups", "start", "end", "span", "get", "keys", "values", "items"}
_RE_FUNCS = {"findall", "search", "match", "fullmatch", "sub", "split", "compile", "escape"}


class RngObj:
    """random.Random(seed) created in reset; draws map to jax.random."""


class SeedArg:
    """The seed argument of reset; only usable to seed a generator."""


class Module:
    def __init__(self, name):
        self.name = name


class BoundMethod:
    def __init__(self, name):
        self.name = name


class Func:
    def __init__(self, node):
        self.node = node


class Lambda:
    def __init__(self, node, frame):
        self.node = node
        self.frame = frame


class DynRange:
    """range() with a data-dependent bound; loops over it unroll like a data-dependent while loop."""

    def __init__(self, start, stop, step):
        self.start, self.stop, self.step = start, stop, step


class _Builtin:
    def __init__(self, name):
        self.name = name


class _ModAttr:
    def __init__(self, module, name):
        self.module = module
        self.name = name


class _Attr:
    def __init__(self, base, name):
        self.base = base
        self.name = name


class _ClassRef:
    pass


class _DictView:
    def __init__(self, d, kind):
        self.d = d
        self.kind = kind

    def items(self):
        if self.kind == "keys":
            return list(self.d.keys())
        if self.kind == "values":
            return list(self.d.values())
        return [(k, v) for k, v in self.d.items()]

    def __iter__(self):  # list(d.keys()), sorted(d.items()) and friends on the host
        return iter(self.items())

    def __len__(self):
        return len(self.d)


def is_dyn(x) -> bool:
    return isinstance(x, jax.Array)


def kind_of(x) -> str | None:
    if isinstance(x, bool) or (is_dyn(x) and x.dtype == jnp.bool_):
        return BOOL
    if isinstance(x, int) or (is_dyn(x) and jnp.issubdtype(x.dtype, jnp.integer)):
        return INT
    if isinstance(x, float) or (is_dyn(x) and jnp.issubdtype(x.dtype, jnp.floating)):
        return FLOAT
    return None


def is_num(x) -> bool:
    return kind_of(x) is not None


def _num(x):
    """Arithmetic operand: bools count as ints, as in Python."""
    if is_dyn(x) and x.dtype == jnp.bool_:
        return x.astype(jnp.int32)
    if isinstance(x, bool):
        return int(x)
    return x


def _as(x, dtype):
    if isinstance(x, jax.Array):
        return x if x.dtype == dtype else lax.convert_element_type(x, dtype)
    return np.asarray(x, dtype)


def _kind_name(v) -> str:
    if isinstance(v, StrId):
        return "a data-dependent string"
    if isinstance(v, Text):
        return "composed text"
    if isinstance(v, Masked):
        return "a filtered list"
    if is_dyn(v):
        return f"a data-dependent {kind_of(v)}"
    if isinstance(v, ActionVal):
        return "a value parsed from the action"
    return type(v).__name__


def _has_av(v) -> bool:
    if isinstance(v, ActionVal):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_av(x) for x in v)
    return False


def _ev_deep(v, text):
    if isinstance(v, ActionVal):
        return _ev(v, text)
    if isinstance(v, list):
        return [_ev_deep(x, text) for x in v]
    if isinstance(v, tuple):
        return tuple(_ev_deep(x, text) for x in v)
    return v


def _ev(v, text):
    if isinstance(v, ActionVal):
        out = v.eval(text)
        if out is _FAIL:
            raise ValueError("derived from a failed value")
        return out
    return v


def _unpack(v, n):
    v = list(v)
    if len(v) != n:
        raise ValueError("wrong length")
    return v


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_JNP_BINOPS = {
    ast.Add: jnp.add, ast.Sub: jnp.subtract, ast.Mult: jnp.multiply, ast.FloorDiv: jnp.floor_divide,
    ast.Mod: jnp.remainder, ast.BitAnd: jnp.bitwise_and, ast.BitOr: jnp.bitwise_or, ast.BitXor: jnp.bitwise_xor,
    ast.LShift: jnp.left_shift, ast.RShift: jnp.right_shift,
}
_CMPOPS = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_JNP_CMPOPS = {
    ast.Eq: jnp.equal, ast.NotEq: jnp.not_equal, ast.Lt: jnp.less, ast.LtE: jnp.less_equal, ast.Gt: jnp.greater,
    ast.GtE: jnp.greater_equal,
}
_LAX_ARITH = {ast.Add: lax.add, ast.Sub: lax.sub, ast.Mult: lax.mul}
_LAX_CMPOPS = {
    ast.Eq: lax.eq, ast.NotEq: lax.ne, ast.Lt: lax.lt, ast.LtE: lax.le, ast.Gt: lax.gt, ast.GtE: lax.ge,
}
_HOST_BUILTINS = {
    "len": len, "range": range, "min": min, "max": max, "abs": abs, "sum": sum, "all": all, "any": any,
    "int": int, "float": float, "str": str, "bool": bool, "round": round, "list": list, "tuple": tuple,
    "sorted": sorted, "reversed": reversed, "enumerate": enumerate, "zip": zip, "divmod": divmod, "pow": pow,
    "ord": ord, "chr": chr, "repr": repr, "set": set, "dict": dict, "isinstance": isinstance, "map": map,
    "filter": filter,
}
_BUILTINS = set(_HOST_BUILTINS) | {"print"}
_BUILTIN_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple}
