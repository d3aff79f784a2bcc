"""Strings and composed text: string-table ids, host string functions mapped over the table,
f-strings, str.format and str.join into text templates with traced slots."""

from __future__ import annotations

import ast
import string as string_module

import jax.numpy as jnp
import numpy as np

from spade_jax.envs.backends.jax.interp.predication import or_, table_lookup
from spade_jax.envs.backends.jax.interp.values import _ev, _kind_name, is_dyn, kind_of
from spade_jax.envs.backends.jax.ir import (
    _FAIL,
    BOOL,
    EMPTY,
    FLOAT,
    INT,
    STR,
    ActionVal,
    Masked,
    StrId,
    Text,
    TLit,
    TSel,
    TVal,
    cat,
    unsupported,
)

# Longest string whose characters a loop may visit (for ch in word, enumerate(word), choice(word)):
# each position is one predicated pass of the loop body.
MAX_STRING_CHARS = 64


class TextOps:
    """Mixin of Interp: strings as table ids and observations as text templates."""

    # ----- strings and text -------------------------------------------------------------------

    def str_id(self, v):
        if isinstance(v, StrId):
            return v.id
        return jnp.int32(self.table.id(v))

    def table_map(self, sid: StrId, fn, result_kind: str):
        """Applies a host function to every string of the table; looks up the result by id."""
        strings = list(self.table.strings)
        outs = []
        for s in strings:
            try:
                outs.append(fn(s))
            except Exception:
                outs.append(_FAIL)
        if result_kind == STR:
            ids = [self.table.id("" if o is _FAIL else str(o)) for o in outs]
            domain = None
            if sid.domain is not None:
                pos = {x: k for k, x in enumerate(strings)}
                domain = frozenset(self.table.strings[ids[pos[x]]] if x in pos else "" for x in sid.domain)
            return StrId(table_lookup(np.array(ids, np.int32), sid.id), domain)
        dtype = {INT: np.int32, BOOL: np.bool_, FLOAT: np.float32}[result_kind]
        arr = np.array([0 if o is _FAIL else o for o in outs], dtype)
        return table_lookup(arr, sid.id)

    def chars(self, sid: StrId, node) -> Masked:
        """The characters of a data-dependent string as a filtered list: position i exists where
        the string is longer than i. Its capacity is the longest string the table holds, at most
        MAX_STRING_CHARS (the table holds every string the program can have at this point)."""
        pool = self.table.strings if sid.domain is None else sid.domain
        longest = max((len(x) for x in pool), default=0)
        if longest > MAX_STRING_CHARS:
            raise unsupported(node, f"loop over the characters of a string that can be longer than {MAX_STRING_CHARS} "
                              "characters")
        return Masked([
            (self.table_map(sid, lambda x, i=i: i < len(x), BOOL), self.table_map(sid, lambda x, i=i: x[i], STR))
            for i in range(longest)
        ])

    def text_chars(self, t, node) -> Masked:
        """The characters of str(n) for a traced int n (digits, after a '-' when negative): 11
        positions, position j present where the decimal is longer than j."""
        if not (isinstance(t, TVal) and t.kind == INT and t.spec == ""):
            raise unsupported(node, "the characters of composed text (only str() of a whole number is spelled "
                              "out on device)")
        x = jnp.asarray(t.value, jnp.int32)
        neg = x < 0
        a = jnp.abs(x)
        powers = np.array([10**k for k in range(10)], np.int64).astype(np.int32)
        ndig = 1 + sum((a >= int(p)).astype(jnp.int32) for p in powers[1:])
        sign = neg.astype(jnp.int32)
        digit_ids = np.array([self.table.id(str(d)) for d in range(10)], np.int32)
        minus = self.table.id("-")
        domain = frozenset([str(d) for d in range(10)] + ["-", ""])
        items = []
        for j in range(11):
            i = j - sign  # index among the digits, from the left
            e = jnp.clip(ndig - 1 - i, 0, 9)
            digit = (a // table_lookup(powers, e)) % 10
            cid = jnp.where(jnp.logical_and(neg, j == 0), minus, table_lookup(digit_ids, digit))
            items.append((j < ndig + sign, StrId(cid, domain)))
        return Masked(items)

    def to_text(self, v, spec, node) -> Text:
        if isinstance(v, Text):
            if spec:
                raise unsupported(node, "format spec applied to composed text")
            return v
        if isinstance(v, ActionVal):
            av = v
            sid = self.lower(self.actionval(lambda t: format(av.eval(t) if av.eval(t) is not _FAIL else "", spec)))
            return TVal(STR, sid.id)
        if isinstance(v, StrId):
            return TVal(STR, v.id, spec)
        if is_dyn(v):
            k = kind_of(v)
            if k == BOOL:
                return TSel(v, TLit(format(True, spec)), TLit(format(False, spec)))
            return TVal(k, v, spec)
        if isinstance(v, (list, tuple)) and self._has_dyn(v):
            if spec:
                raise unsupported(node, "format spec applied to a list")
            open_, close = ("[", "]") if isinstance(v, list) else ("(", ")")
            parts = []
            for i, x in enumerate(v):
                if i:
                    parts.append(TLit(", "))
                if isinstance(x, StrId):
                    parts.append(TVal(STR, self.table_map(x, repr, STR).id))
                elif isinstance(x, str):
                    parts.append(TLit(repr(x)))
                else:
                    parts.append(self.to_text(x, "", node))
            if isinstance(v, tuple) and len(v) == 1:
                parts.append(TLit(","))
            return cat(TLit(open_), *parts, TLit(close))
        if isinstance(v, Masked):
            raise unsupported(node, "printing a filtered list directly (join it instead)")
        try:
            return TLit(format(v, spec))
        except (TypeError, ValueError):
            raise unsupported(node, f"cannot format {_kind_name(v)}") from None

    def simplify_text(self, t: Text):
        """Fully literal text becomes a Python str again."""
        return t.s if isinstance(t, TLit) else t

    def eval_JoinedStr(self, node, frame):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(TLit(v.value))
            else:
                value = self.eval(v.value, frame)
                spec = ""
                if v.format_spec is not None:
                    spec = self.eval(v.format_spec, frame)
                    if not isinstance(spec, str):
                        raise unsupported(node, "data-dependent format spec")
                if v.conversion == ord("r"):
                    value = self.call_builtin("repr", [value], {}, node)
                elif v.conversion not in (-1, ord("s")):
                    raise unsupported(node, "f-string conversion")
                parts.append(self.to_text(value, spec, node))
        return self.simplify_text(cat(*parts))

    def eval_FormattedValue(self, node, frame):
        raise unsupported(node, "bare formatted value")

    def join(self, sep: str, iterable, node):
        if isinstance(iterable, ActionVal):
            return self.actionval(lambda t: sep.join(_ev(iterable, t)))
        if isinstance(iterable, Masked):
            out: Text = EMPTY
            any_before = False
            for c, v in iterable.items:
                piece = self.to_text(self._as_dyn(v), "", node)
                if sep:
                    lead = TLit(sep) if any_before is True else (
                        EMPTY if any_before is False else TSel(any_before, TLit(sep), EMPTY)
                    )
                    piece = cat(lead, piece)
                out = cat(out, piece if c is True else TSel(c, piece, EMPTY))
                any_before = or_(any_before, c)
            return self.simplify_text(out)
        items = self.iterate_plain(iterable, node)
        if not self._has_dyn(items) and not any(isinstance(x, ActionVal) for x in items):
            if not all(isinstance(x, str) for x in items):
                raise unsupported(node, "str.join over non-strings")
            return sep.join(items)
        parts = []
        for i, v in enumerate(items):
            if isinstance(v, ActionVal):
                v = self.lower(v)
            if not isinstance(v, (str, StrId, Text)):
                raise unsupported(node, "str.join over non-strings")
            if i and sep:
                parts.append(TLit(sep))
            parts.append(self.to_text(v, "", node))
        return self.simplify_text(cat(*parts))

    def format_call(self, fmt: str, args, kwargs, node):
        parts = []
        auto = 0
        for literal, field, spec, conv in string_module.Formatter().parse(fmt):
            if literal:
                parts.append(TLit(literal))
            if field is None:
                continue
            if field == "":
                value = args[auto]
                auto += 1
            elif field.isdigit():
                value = args[int(field)]
            elif field in kwargs:
                value = kwargs[field]
            else:
                raise unsupported(node, f"format field {field!r}")
            if conv == "r":
                value = self.call_builtin("repr", [value], {}, node)
            parts.append(self.to_text(value, spec or "", node))
        return self.simplify_text(cat(*parts))
