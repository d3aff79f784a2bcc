"""The typed intermediate representation the transpiler works in: value kinds, state schema,
string table and observation templates (text with holes filled from device slots)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np


class UnsupportedProgram(ValueError):
    """The program uses a construct outside the JAX subset; the message names the line."""


def unsupported(node, what: str) -> UnsupportedProgram:
    line = getattr(node, "lineno", None)
    return UnsupportedProgram(f"line {line}: {what}" if line else what)


# ---------------------------------------------------------------------------------------------
# Scalar kinds. Dynamic values are plain jax arrays (int32, float32, bool); strings drawn from a
# finite set are StrId (an int32 index into the environment's StringTable).

INT, FLOAT, BOOL, STR = "int", "float", "bool", "str"
DTYPES = {INT: jnp.int32, FLOAT: jnp.float32, BOOL: jnp.bool_, STR: jnp.int32}


class StringTable:
    """Interned strings; ids never change once given, so compiled code stays valid."""

    def __init__(self):
        self.strings: list[str] = []
        self._ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        if s not in self._ids:
            self._ids[s] = len(self.strings)
            self.strings.append(s)
        return self._ids[s]

    def __len__(self):
        return len(self.strings)


@dataclasses.dataclass(eq=False)
class StrId:
    """A string from the program's finite set, held on device as its table id."""

    id: Any  # int32 jax scalar
    domain: Any = None  # frozenset of the strings it can hold, when known (bounds loops over its characters)


def str_domain(*values):
    """The strings a mix of str and StrId values can hold, or None when one of them is unknown."""
    out: set = set()
    for v in values:
        if isinstance(v, str):
            out.add(v)
        elif isinstance(v, StrId) and v.domain is not None:
            out |= v.domain
        else:
            return None
    return frozenset(out)


@dataclasses.dataclass(eq=False)
class Masked:
    """A fixed-capacity list whose items exist only where their condition holds (filtered
    comprehensions): len/sum/any/all/join/choice understand it."""

    items: list  # of (cond: jax bool, value)


_FAIL = object()  # marks an action text on which a derived value raised (never reached there)


class ActionVal:
    """A value computed from the agent's action text alone. It stays on the host as a function
    of the text; when it meets device state it becomes a lookup table indexed by the action id."""

    def __init__(self, fn: Callable[[str], Any]):
        self._fn = fn
        self._cache: dict[str, Any] = {}

    def eval(self, text: str):
        if text not in self._cache:
            try:
                self._cache[text] = self._fn(text)
            except Exception:  # the program would raise here; masked paths never read it
                self._cache[text] = _FAIL
        return self._cache[text]

    @staticmethod
    def value_or(v, default):
        return default if v is _FAIL else v


# ---------------------------------------------------------------------------------------------
# State schema: what each instance attribute holds, with fixed shapes.


@dataclasses.dataclass(frozen=True)
class Spec:
    """Type of one attribute: a scalar kind, or a fixed-length list/tuple of a spec."""

    kind: str  # int | float | bool | str | list | tuple | dict
    length: int = 0  # for list/tuple/dict
    elem: "Spec | None" = None  # for list/tuple/dict (a dict's values share one spec)
    keys: tuple = ()  # for dict: its fixed keys in insertion order

    @property
    def shape(self) -> tuple[int, ...]:
        if self.elem is None:
            return ()
        return (self.length,) + self.elem.shape

    @property
    def scalar(self) -> str:
        return self.kind if self.elem is None else self.elem.scalar

    def describe(self) -> str:
        if self.elem is None:
            return self.kind
        if self.kind == "dict":
            return f"dict with keys {list(self.keys)} of {self.elem.describe()}"
        return f"{self.kind}[{self.length}] of {self.elem.describe()}"


def join_specs(a: Spec | None, b: Spec | None, where: str) -> Spec:
    if a is None:
        return b
    if b is None or a == b:
        return a
    if a.elem is None and b.elem is None:
        kinds = {a.kind, b.kind}
        if kinds <= {INT, FLOAT, BOOL}:
            return Spec(FLOAT if FLOAT in kinds else INT)
    if "dict" in (a.kind, b.kind):
        if a.kind == b.kind and a.keys == b.keys:
            return Spec("dict", a.length, join_specs(a.elem, b.elem, where), a.keys)
    elif a.elem is not None and b.elem is not None and a.length == b.length:
        kind = a.kind if a.kind == b.kind else "list"
        return Spec(kind, a.length, join_specs(a.elem, b.elem, where))
    raise UnsupportedProgram(f"{where} holds {a.describe()} in one place and {b.describe()} in another")


# ---------------------------------------------------------------------------------------------
# Observation text while tracing: a tree of literals, holes (device values) and selections.


class Text:
    """Base of traced text nodes."""


@dataclasses.dataclass(eq=False)
class TLit(Text):
    s: str


@dataclasses.dataclass(eq=False)
class TVal(Text):
    kind: str  # int | float | str (StrId)
    value: Any  # jax scalar (the id for str)
    spec: str = ""  # format spec from the f-string, e.g. ".2f"


@dataclasses.dataclass(eq=False)
class TCat(Text):
    parts: tuple


@dataclasses.dataclass(eq=False)
class TSel(Text):
    cond: Any  # jax bool
    a: Text  # when cond
    b: Text  # otherwise


EMPTY = TLit("")


def cat(*items: Text) -> Text:
    parts: list[Text] = []
    for t in items:
        for p in t.parts if isinstance(t, TCat) else (t,):
            if isinstance(p, TLit):
                if not p.s:
                    continue
                if parts and isinstance(parts[-1], TLit):
                    parts[-1] = TLit(parts[-1].s + p.s)
                    continue
            parts.append(p)
    if not parts:
        return EMPTY
    return parts[0] if len(parts) == 1 else TCat(tuple(parts))


def _same(a: Text, b: Text) -> bool:
    return a is b or (isinstance(a, TLit) and isinstance(b, TLit) and a.s == b.s)


def select_text(cond, a: Text, b: Text) -> Text:
    """cond ? a : b, factoring out shared prefix and suffix so that repeated conditional
    appends (row += "#") stay linear in size."""
    if _same(a, b):
        return a
    pa = list(a.parts) if isinstance(a, TCat) else [a]
    pb = list(b.parts) if isinstance(b, TCat) else [b]
    i = 0
    while i < min(len(pa), len(pb)) and _same(pa[i], pb[i]):
        i += 1
    j = 0
    while j < min(len(pa), len(pb)) - i and _same(pa[-1 - j], pb[-1 - j]):
        j += 1
    mid_a = cat(*pa[i : len(pa) - j])
    mid_b = cat(*pb[i : len(pb) - j])
    return cat(*pa[:i], TSel(cond, mid_a, mid_b), *pa[len(pa) - j :])


# ---------------------------------------------------------------------------------------------
# Frozen templates: the traced text with every hole replaced by a slot index. Host rendering
# reads slot values from an observation record; the device renderer turns them into tokens.


@dataclasses.dataclass(frozen=True)
class FLit:
    s: str


@dataclasses.dataclass(frozen=True)
class FInt:
    slot: int
    spec: str


@dataclasses.dataclass(frozen=True)
class FFloat:
    slot: int
    spec: str


@dataclasses.dataclass(frozen=True)
class FStr:
    slot: int
    spec: str


@dataclasses.dataclass(frozen=True)
class FCat:
    parts: tuple


@dataclasses.dataclass(frozen=True)
class FSel:
    slot: int  # int slot holding the condition (0/1)
    a: Any
    b: Any


class Slotter:
    """Assigns slots to the holes of traced text and freezes it into a template."""

    def __init__(self):
        self.ints: list = []
        self.floats: list = []
        self._memo: dict[int, Any] = {}

    def freeze(self, t: Text):
        key = id(t)
        if key in self._memo:
            return self._memo[key][1]
        if isinstance(t, TLit):
            out = FLit(t.s)
        elif isinstance(t, TCat):
            out = FCat(tuple(self.freeze(p) for p in t.parts))
        elif isinstance(t, TSel):
            self.ints.append(jnp.asarray(t.cond, jnp.int32))
            slot = len(self.ints) - 1
            out = FSel(slot, self.freeze(t.a), self.freeze(t.b))
        elif isinstance(t, TVal) and t.kind == FLOAT:
            self.floats.append(jnp.asarray(t.value, jnp.float32))
            out = FFloat(len(self.floats) - 1, t.spec)
        elif isinstance(t, TVal):
            self.ints.append(jnp.asarray(t.value, jnp.int32))
            out = (FInt if t.kind == INT else FStr)(len(self.ints) - 1, t.spec)
        else:
            raise TypeError(f"not a text node: {t!r}")
        self._memo[key] = (t, out)  # keep t alive so its id is not reused
        return out


def format_float(x: float, spec: str) -> str:
    # Python prints float64; the device holds float32. The shortest float32 repr matches
    # Python's repr for the short decimals programs print (0.5, 2.25, 0.1).
    if spec:
        return format(float(x), spec)
    return str(np.float32(x).item()) if np.isfinite(x) else str(float(x))


def render(template, ints, floats, strings: list[str]) -> str:
    """Host rendering of a frozen template given concrete slot values."""
    out: list[str] = []

    def go(t):
        if isinstance(t, FLit):
            out.append(t.s)
        elif isinstance(t, FCat):
            for p in t.parts:
                go(p)
        elif isinstance(t, FSel):
            go(t.a if ints[t.slot] else t.b)
        elif isinstance(t, FInt):
            out.append(format(int(ints[t.slot]), t.spec))
        elif isinstance(t, FStr):
            out.append(format(strings[int(ints[t.slot])], t.spec))
        elif isinstance(t, FFloat):
            out.append(format_float(float(floats[t.slot]), t.spec))

    go(template)
    return "".join(out)


def template_text(t) -> str:
    """Readable form of a template, holes shown as {i3}, {f0}, {s2}, [c1 ? a : b]."""
    if isinstance(t, FLit):
        return t.s
    if isinstance(t, FCat):
        return "".join(template_text(p) for p in t.parts)
    if isinstance(t, FSel):
        return f"[c{t.slot} ? {template_text(t.a)} : {template_text(t.b)}]"
    tag = {FInt: "i", FFloat: "f", FStr: "s"}[type(t)]
    return "{" + f"{tag}{t.slot}" + (f":{t.spec}" if t.spec else "") + "}"
