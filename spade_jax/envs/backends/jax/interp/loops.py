"""While loops: decided at trace time they unroll; with a data-dependent condition they become a
bounded lax.while_loop over the values the body assigns (or, where those cannot be carried, a
predicated unroll), and a loop still running at its cap raises the loop_cap_hit flag."""

from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
from jax import lax

from spade_jax.envs.backends.jax.interp.predication import _NeedsState, and_, not_, or_
from spade_jax.envs.backends.jax.interp.values import RngObj, _as, is_dyn, kind_of
from spade_jax.envs.backends.jax.ir import BOOL, FLOAT, INT, StrId, UnsupportedProgram, unsupported

# Passes a data-dependent while loop may run as a lax.while_loop (its body is traced once, so the
# cap costs nothing to compile; a Collatz count from n <= 10**4 needs 262). Past it the loop stops,
# the episode is flagged (loop_cap_hit) and truncated, and the equivalence check names the loop.
MAX_WHILE_PASSES = 1000
# Passes of the predicated unroll used where the body's values cannot be carried through a
# lax.while_loop (it assigns composed text, grows a list, returns from inside the loop); each pass
# adds the body's operations to the traced graph.
MAX_WHILE_ITERATIONS = 64

_DTYPES = {BOOL: jnp.bool_, INT: jnp.int32, FLOAT: jnp.float32}


class _NotCarried(Exception):
    """A value the loop body assigns has no fixed array form (text, a growing list, a kind change)."""


def _assigned(body) -> tuple[set[str], set[str]]:
    """Local names and self attributes the statements assign (targets, augmented targets, items)."""
    names: set[str] = set()
    attrs: set[str] = set()

    def target(t):
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                target(e)
        elif isinstance(t, ast.Starred):
            target(t.value)
        else:
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                attrs.add(t.attr)
            elif isinstance(t, ast.Name):
                names.add(t.id)

    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    target(t)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
                target(node.target)
            elif isinstance(node, ast.NamedExpr):
                target(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target(node.func.value)  # xs.append(...), self.grid[r].sort(): the receiver changes
    return names, attrs


def _flatten(v):
    """(template, leaves) of a value made of numbers, strings and fixed-size containers."""
    if isinstance(v, StrId):
        return ("s",), [_as(v.id, jnp.int32)]
    if isinstance(v, str):
        return ("s!", v), []  # resolved to a table id by the caller (needs the string table)
    k = kind_of(v)
    if k is not None:
        return ("n", k), [_as(v, _DTYPES[k])]
    if isinstance(v, (list, tuple)):
        parts = [_flatten(x) for x in v]
        return ("l" if isinstance(v, list) else "t", tuple(p[0] for p in parts)), [a for p in parts for a in p[1]]
    if isinstance(v, dict):
        parts = [_flatten(x) for x in v.values()]
        return ("d", tuple(v.keys()), tuple(p[0] for p in parts)), [a for p in parts for a in p[1]]
    raise _NotCarried(type(v).__name__)


class Loops:
    """Mixin of Interp: while loops."""

    loop_cap_hit = False  # traced bool: a data-dependent loop still wanted to run at its cap

    def exec_while(self, s: ast.While, frame):
        if s.orelse:
            raise unsupported(s, "while ... else")
        saved = (frame.mask, frame.brk, frame.cont)
        frame.mask = frame.local_active()  # returned paths stay out through frame.ret
        frame.brk = False
        try:
            self._while(s, frame)
        finally:
            frame.mask, frame.brk, frame.cont = saved

    def _while(self, s, frame):
        for _ in range(10_000):
            frame.cont = False
            cond = self.condition(s.test, frame)
            if not is_dyn(cond) and not cond:
                return
            if is_dyn(cond) or is_dyn(frame.brk):
                return self._dynamic_while(s, frame, cond)
            self.exec_block(s.body, frame)
            if frame.brk is True or frame.ret is True:
                return
            if is_dyn(frame.brk):
                # A break taken on some paths: the rest is a data-dependent loop.
                frame.cont = False
                cond = self.condition(s.test, frame)
                if not is_dyn(cond) and not cond:
                    return
                return self._dynamic_while(s, frame, cond)
        raise unsupported(s, "while loop that runs more than 10000 times")

    def _dynamic_while(self, s, frame, cond):
        """The loop from a pass whose condition (or an earlier break) depends on data."""
        has_return = any(isinstance(n, ast.Return) for stmt in s.body for n in ast.walk(stmt))
        if not has_return and not self.host:
            snapshot = self._snapshot(frame)
            lowered = dict(self._lowered)
            try:
                return self._lax_while(s, frame, cond)
            except _NotCarried:
                self._restore(frame, snapshot)
                self._lowered = lowered
                frame.cont = False
                cond = self.condition(s.test, frame)
        self._unrolled_while(s, frame, cond)

    def _unrolled_while(self, s, frame, cond):
        for _ in range(MAX_WHILE_ITERATIONS):
            frame.mask = and_(frame.mask, cond)
            if frame.dead():
                return
            self.exec_block(s.body, frame)
            if frame.brk is True or frame.ret is True:
                return
            frame.cont = False
            cond = self.condition(s.test, frame)
            if not is_dyn(cond) and not cond:
                return
        self._note_cap(s, and_(frame.active(), cond), MAX_WHILE_ITERATIONS)

    def _note_cap(self, s, still_running, cap):
        if still_running is not False:
            self.loop_cap_hit = or_(self.loop_cap_hit, still_running)
            self.loop_cap_lines[s.lineno] = cap

    # ----- lax.while_loop ---------------------------------------------------------------------

    def _carried(self, s, frame):
        names, attrs = _assigned(s.body)
        names = sorted(n for n in names if n in frame.locals)
        attrs = sorted(a for a in attrs if a in self.attrs and not isinstance(self.attrs[a], RngObj))
        return names, attrs

    def _pack(self, frame, names, attrs):
        values = [frame.locals[n] for n in names] + [self.attrs[a] for a in attrs]
        values.append(self.key if self.key is not None else jnp.zeros((2,), jnp.uint32))
        values.append(self.loop_cap_hit)
        templates, leaves = [], []
        for v in values[:-2]:
            tpl, arrs = _flatten(self._intern(v))
            templates.append(tpl)
            leaves.extend(arrs)
        leaves.append(values[-2])
        leaves.append(jnp.asarray(values[-1], jnp.bool_))
        return templates, leaves

    def _intern(self, v):
        if isinstance(v, str):
            return StrId(jnp.int32(self.table.id(v)), frozenset([v]))
        if isinstance(v, list):
            return [self._intern(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self._intern(x) for x in v)
        if isinstance(v, dict):
            return {k: self._intern(x) for k, x in v.items()}
        return v

    def _unpack(self, frame, names, attrs, templates, leaves):
        it = iter(leaves)

        def build(tpl):
            if tpl[0] == "s":
                return StrId(next(it))
            if tpl[0] == "n":
                return next(it)
            if tpl[0] in ("l", "t"):
                items = [build(t) for t in tpl[1]]
                return items if tpl[0] == "l" else tuple(items)
            if tpl[0] == "d":
                return {k: build(t) for k, t in zip(tpl[1], tpl[2])}
            raise _NotCarried("template")

        values = [build(t) for t in templates]
        for n, v in zip(names, values):
            frame.locals[n] = v
        for a, v in zip(attrs, values[len(names):]):
            self.attrs[a] = v
        key = next(it)
        if self.key is not None:
            self.key = key
        self.loop_cap_hit = next(it)

    def _lax_while(self, s, frame, cond):
        """The remaining passes as one lax.while_loop whose carry holds every value the body assigns;
        the body and the condition are traced once each."""
        names, attrs = self._carried(s, frame)
        templates, leaves0 = self._pack(frame, names, attrs)
        running0 = jnp.asarray(and_(frame.active(), cond), jnp.bool_)
        outer_mask, outer_ret, outer_retval = frame.mask, frame.ret, frame.retval
        budget0 = self.op_budget
        lowered0 = set(self._lowered)
        body_names, body_attrs = _assigned(s.body)
        if any(a not in attrs and not isinstance(self.attrs.get(a), RngObj) for a in body_attrs):
            raise _NotCarried("an attribute first set inside the loop")
        untouched_keys = set(self.attrs)

        # What the loop must leave alone: values it does not carry (a helper method that sets an
        # attribute, or fills a list passed to it, would leak the loop's tracers).
        untouched = {("self", k): _leaf_ids(v) for k, v in self.attrs.items() if k not in attrs}
        untouched.update({("local", k): _leaf_ids(v) for k, v in frame.locals.items() if k not in names})

        def run_body(leaves):
            self._unpack(frame, names, attrs, templates, leaves)
            frame.mask, frame.ret, frame.brk, frame.cont = True, False, False, False
            self.exec_block(s.body, frame)
            for (where, k), ids in untouched.items():
                v = (self.attrs if where == "self" else frame.locals).get(k)
                if _leaf_ids(v) != ids:
                    if where == "local" and k in body_names:
                        continue  # a temporary of the body, dropped after the loop
                    raise _NotCarried(f"{k} changes inside the loop without being assigned there")
            if any(k not in untouched_keys for k in self.attrs if k not in attrs):
                raise _NotCarried("an attribute first set inside the loop")
            if frame.ret is not False:
                raise _NotCarried("return")
            brk = frame.brk
            frame.brk, frame.cont = False, False
            if brk is True:
                keep_going = False
            else:
                c = self.condition(s.test, frame)
                keep_going = and_(not_(brk), c) if brk is not False else c
            new_templates, new_leaves = self._pack(frame, names, attrs)
            if new_templates != templates or any(
                jnp.shape(a) != jnp.shape(b) or jnp.result_type(a) != jnp.result_type(b)
                for a, b in zip(new_leaves, leaves)
            ):
                raise _NotCarried("a value changes kind or shape in the loop")
            return new_leaves, jnp.asarray(keep_going, jnp.bool_)

        def body_fn(carry):
            n, running, leaves = carry
            new_leaves, keep_going = run_body(leaves)
            return n + 1, keep_going, new_leaves

        def cond_fn(carry):
            n, running, _ = carry
            return jnp.logical_and(running, n < MAX_WHILE_PASSES)

        try:
            _, running, leaves = lax.while_loop(cond_fn, body_fn, (jnp.int32(0), running0, leaves0))
        except (_NotCarried, _NeedsState, UnsupportedProgram):
            raise
        except (TypeError, jax.errors.JAXTypeError, jax.errors.UnexpectedTracerError) as exc:
            raise _NotCarried(str(exc)) from None
        frame.mask, frame.ret, frame.retval = outer_mask, outer_ret, outer_retval
        # The body's temporaries were bound inside the loop's trace: only carried names survive it.
        for name in body_names - set(names):
            frame.locals.pop(name, None)
        self._unpack(frame, names, attrs, templates, leaves)
        # Action values lowered inside the body were traced there: keep their features for the
        # vocabulary, but lower them afresh when read after the loop.
        self._lowered = {k: (v if k in lowered0 else (v[0], v[1], None)) for k, v in self._lowered.items()}
        self.op_budget = min(self.op_budget, budget0)
        self._note_cap(s, running, MAX_WHILE_PASSES)


def _leaf_ids(v) -> tuple:
    """Identities of the leaves of a value (a list changed in place shows new leaves)."""
    if isinstance(v, (list, tuple)):
        return tuple(_leaf_ids(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _leaf_ids(x)) for k, x in v.items())
    return (id(v),)
