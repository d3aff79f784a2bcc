"""Containers: list, tuple, set and dict displays, comprehensions (filtered ones become Masked lists),
iteration over statically bounded iterables, and list methods."""

from __future__ import annotations

import ast

import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.interp.predication import Frame, and_, or_
from spade_jax.envs.backends.jax.interp.values import DynRange, Lambda, _as, _DictView, _ev, _kind_name, _num, is_dyn
from spade_jax.envs.backends.jax.ir import _FAIL, ActionVal, Masked, StrId, Text, unsupported


class Containers:
    """Mixin of Interp: builds, iterates and mutates fixed-length containers."""

    def eval_List(self, node, frame):
        items = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                items.extend(self.iterate_plain(self.eval(e.value, frame), e))
            else:
                items.append(self.eval(e, frame))
        return items

    def eval_Tuple(self, node, frame):
        return tuple(self.eval_List(node, frame))

    def eval_Set(self, node, frame):
        items = self.eval_List(node, frame)
        if self._has_dyn(items) or any(isinstance(x, ActionVal) for x in items):
            return items  # membership tests behave the same on a list
        return set(items)

    def eval_Dict(self, node, frame):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise unsupported(node, "dict unpacking")
            key = self.eval(k, frame)
            if self._has_dyn(key) or isinstance(key, ActionVal):
                raise unsupported(node, "dict with a data-dependent key")
            out[key] = self.eval(v, frame)
        return out

    def eval_Lambda(self, node, frame):
        return Lambda(node, frame)

    def _comprehension(self, node, frame, emit):
        out = []

        def go(gens, local_frame, cond):
            if not gens:
                out.append((cond, emit(local_frame)))
                return
            gen = gens[0]
            if gen.is_async:
                raise unsupported(node, "async comprehension")
            items = self.iterate(self.eval(gen.iter, local_frame), gen.iter)
            for c, item in items:
                sub = Frame(dict(local_frame.locals))
                sub.mask = and_(local_frame.mask, c)
                sub.apath = local_frame.apath
                self.assign(gen.target, item, sub)
                cc = and_(cond, c)
                for test in gen.ifs:
                    t = self.condition(test, sub)
                    cc = and_(cc, t)
                    sub.mask = and_(sub.mask, t)
                if cc is False:
                    continue
                go(gens[1:], sub, cc)

        inner = Frame(dict(frame.locals))
        inner.mask = frame.active()
        inner.apath = frame.apath
        go(node.generators, inner, True)
        if all(c is True for c, _ in out):
            return [v for _, v in out]
        return Masked(out)

    def eval_ListComp(self, node, frame):
        return self._comprehension(node, frame, lambda f: self.eval(node.elt, f))

    eval_GeneratorExp = eval_ListComp

    def eval_SetComp(self, node, frame):
        v = self.eval_ListComp(node, frame)
        if isinstance(v, list) and not self._has_dyn(v):
            return set(v)
        raise unsupported(node, "set comprehension over data-dependent values")

    def eval_DictComp(self, node, frame):
        pairs = self._comprehension(node, frame, lambda f: (self.eval(node.key, f), self.eval(node.value, f)))
        if isinstance(pairs, Masked) or any(self._has_dyn(k) for k, _ in pairs):
            raise unsupported(node, "dict comprehension with data-dependent keys")
        return dict(pairs)

    # ----- iteration --------------------------------------------------------------------------

    def iterate(self, v, node) -> list:
        """(condition, item) pairs of a statically bounded iterable."""
        if isinstance(v, StrId):
            v = self.chars(v, node)
        if isinstance(v, Text):
            v = self.text_chars(v, node)
        if isinstance(v, DynRange):
            v = self.dyn_range_items(v, node)
        if isinstance(v, Masked):
            return list(v.items)
        return [(True, x) for x in self.iterate_plain(v, node)]

    def dyn_range_items(self, r: DynRange, node) -> Masked:
        """range(start, stop, step) with a data-dependent bound: MAX_WHILE_ITERATIONS predicated
        items, like the equivalent while loop, with the same cap flag where stop lies beyond them."""
        from spade_jax.envs.backends.jax.interp.loops import MAX_WHILE_ITERATIONS

        start, stop, step = (_as(_num(x), jnp.int32) if is_dyn(x) else x for x in (r.start, r.stop, r.step))
        items = []
        for k in range(MAX_WHILE_ITERATIONS):
            i = start + k * step if not is_dyn(start) else lax.add(start, np.int32(k * step))
            cond = (lax.lt if step > 0 else lax.gt)(_as(i, jnp.int32), _as(stop, jnp.int32))
            items.append((cond, i))
        beyond = start + MAX_WHILE_ITERATIONS * step
        over = (lax.lt if step > 0 else lax.gt)(_as(beyond, jnp.int32), _as(stop, jnp.int32))
        self.loop_cap_hit = or_(self.loop_cap_hit, and_(self._current_mask, over))
        self.loop_cap_lines[node.lineno] = MAX_WHILE_ITERATIONS
        return Masked(items)

    def iterate_plain(self, v, node) -> list:
        if isinstance(v, range) and len(v) > 100_000:
            raise unsupported(node, f"loop over {len(v)} items (at most 100000 are traced)")
        if isinstance(v, (list, tuple, range, str)):
            return list(v)
        if isinstance(v, (set, frozenset)):
            return sorted(v) if all(isinstance(x, (int, str)) for x in v) else list(v)
        if isinstance(v, dict):
            return list(v.keys())
        if isinstance(v, _DictView):
            return v.items()
        if isinstance(v, ActionVal):
            vals = [x for x in (v.eval(t) for t in (self.vocab or [])) if x is not _FAIL]
            if vals and all(isinstance(x, (list, tuple)) for x in vals) and len({len(x) for x in vals}) == 1:
                n = len(vals[0])
                return [self.actionval(lambda s, i=i: _ev(v, s)[i]) for i in range(n)]
            raise unsupported(node, "loop over a value of the action whose length varies")
        if isinstance(v, Masked):
            raise unsupported(node, "filtered list used where a fixed-length list is needed")
        if isinstance(v, StrId):
            raise unsupported(node, "list of the characters of a data-dependent string used as a fixed-length list")
        if isinstance(v, DynRange):
            raise unsupported(node, "range with a data-dependent bound used as a fixed-length list")
        raise unsupported(node, f"loop over {_kind_name(v)}")

    def list_method(self, base, name, args, kwargs, node, frame):
        act = frame.active()
        if name == "append":
            if act is True and isinstance(base, list):
                base.append(args[0])
                return None
            target = node.func.value
            if not isinstance(target, ast.Name):
                raise unsupported(
                    node, "append to a list of the instance in a data-dependent branch (its length would vary)"
                )
            items = self.as_masked(base, node).items + [(act, args[0])]
            frame.locals[target.id] = Masked(items)
            return None
        if isinstance(base, Masked):
            raise unsupported(node, f"{name}() on a filtered list")
        if name == "extend":
            if act is not True:
                raise unsupported(node, "extend in a data-dependent branch")
            base.extend(self.iterate_plain(args[0], node))
            return None
        if name == "count":
            return self.call_builtin("sum", [[self.compare_eq(x, args[0], node) for x in base]], {}, node)
        if name == "index":
            item = args[0]
            if not self._has_dyn(base) and not self._has_dyn(item):
                return base.index(item)
            out = jnp.int32(len(base))  # not found: Python raises; the path is assumed unreachable
            for k in range(len(base) - 1, -1, -1):
                out = jnp.where(self._as_dyn(self.compare_eq(base[k], item, node)), k, out)
            return out
        if name == "copy":
            return list(base)
        if name == "pop":
            if act is not True:
                raise unsupported(node, "pop in a data-dependent branch (the length would vary)")
            i = args[0] if args else -1
            if self._has_dyn(i):
                raise unsupported(node, "pop with a data-dependent index")
            return base.pop(i)
        if name == "insert":
            if act is not True or self._has_dyn(args[0]):
                raise unsupported(node, "insert in a data-dependent branch or at a data-dependent index")
            base.insert(args[0], args[1])
            return None
        if name == "reverse":
            new = list(reversed(base))
            self._assign_inplace(base, new, act, node)
            return None
        if name == "sort":
            new = self.call_builtin("sorted", [base], kwargs, node)
            self._assign_inplace(base, new, act, node)
            return None
        if name == "remove":
            raise unsupported(node, "list.remove (the length would vary)")
        raise unsupported(node, f"list.{name}()")

    def _assign_inplace(self, base, new, act, node):
        merged = [self.merge(act, n, o, node) for n, o in zip(new, base)]
        base[:] = merged
