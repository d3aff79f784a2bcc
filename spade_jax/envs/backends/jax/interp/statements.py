"""Statements: blocks, if/for/while/try under a path condition, assignment into names, attributes
and list items, and the merge of two values where a data-dependent branch ends."""

from __future__ import annotations

import ast

import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.backends.jax.interp.predication import (
    _UNSET,
    Frame,
    _always_exits,
    _BreakOut,
    _NeedsState,
    _pand,
    and_,
    not_,
    or_,
    where,
)
from spade_jax.envs.backends.jax.interp.values import (
    _MODULES,
    Module,
    RngObj,
    _as,
    _kind_name,
    _num,
    _unpack,
    is_dyn,
    is_num,
    kind_of,
)
from spade_jax.envs.backends.jax.ir import (
    _FAIL,
    BOOL,
    FLOAT,
    ActionVal,
    Masked,
    StrId,
    Text,
    UnsupportedProgram,
    select_text,
    str_domain,
    unsupported,
)


class Statements:
    """Mixin of Interp: executes statements; a data-dependent branch runs both ways under its condition."""

    # ----- statements -------------------------------------------------------------------------

    def exec_block(self, stmts, frame: Frame):
        saved_apath = frame.apath
        for stmt in stmts:
            if frame.dead():
                break
            self.exec_stmt(stmt, frame)
        frame.apath = saved_apath

    def exec_stmt(self, s, frame: Frame):
        self.budget -= 1
        if self.budget < 0:
            raise unsupported(s, "the program runs too many statements to trace (over 5 million)")
        if isinstance(s, ast.Expr):
            if isinstance(s.value, ast.Constant):
                return  # docstring
            self.eval(s.value, frame)
        elif isinstance(s, ast.Assign):
            value = self.eval(s.value, frame)
            for target in s.targets:
                self.assign(target, value, frame)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.assign(s.target, self.eval(s.value, frame), frame)
        elif isinstance(s, ast.AugAssign):
            current = self.eval(s.target, frame)
            value = self.binop(s.op, current, self.eval(s.value, frame), s)
            if isinstance(current, list) and isinstance(s.op, ast.Add) and isinstance(s.target, ast.Name):
                pass
            self.assign(s.target, value, frame)
        elif isinstance(s, ast.If):
            cond, ptrue, pfalse = self.condition_path(s.test, frame)
            if cond is True:
                self.exec_block(s.body, frame)
            elif cond is False:
                self.exec_block(s.orelse, frame)
            else:
                saved, apath = frame.mask, frame.apath
                frame.mask = and_(saved, cond)
                frame.apath = _pand(apath, ptrue)
                self.exec_block(s.body, frame)
                frame.mask = and_(saved, not_(cond))
                frame.apath = _pand(apath, pfalse)
                self.exec_block(s.orelse, frame)
                frame.mask, frame.apath = saved, apath
                # Code after an if whose branch always returns runs only on the other branch.
                if _always_exits(s.body):
                    frame.apath = _pand(frame.apath, pfalse)
                elif s.orelse and _always_exits(s.orelse):
                    frame.apath = _pand(frame.apath, ptrue)
        elif isinstance(s, ast.For):
            self.exec_for(s, frame)
        elif isinstance(s, ast.While):
            self.exec_while(s, frame)
        elif isinstance(s, ast.Return):
            value = None if s.value is None else self.eval(s.value, frame)
            act = frame.active()
            frame.retval = value if frame.retval is _UNSET else self.merge(act, value, frame.retval, s)
            frame.ret = or_(frame.ret, act)
        elif isinstance(s, ast.Break):
            frame.brk = or_(frame.brk, frame.active())
        elif isinstance(s, ast.Continue):
            frame.cont = or_(frame.cont, frame.active())
        elif isinstance(s, ast.Pass):
            pass
        elif isinstance(s, ast.Assert):
            pass  # an assert that holds changes nothing; the equivalence check catches the rest
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            for alias in s.names:
                mod = alias.name if isinstance(s, ast.Import) else s.module
                if mod not in _MODULES:
                    raise unsupported(s, f"import of {mod!r} inside a method")
                if isinstance(s, ast.Import):
                    frame.locals[alias.asname or alias.name] = Module(alias.name)
                else:
                    frame.locals[alias.asname or alias.name] = self._from_import(s.module, alias.name, s)
        elif isinstance(s, ast.Try):
            self.exec_try(s, frame)
        elif isinstance(s, ast.Raise):
            raise unsupported(s, "raise statement (exceptions cannot be raised on device)")
        else:
            raise unsupported(s, f"{type(s).__name__} statement")

    def exec_for(self, s: ast.For, frame: Frame):
        if s.orelse:
            raise unsupported(s, "for ... else")
        items = self.iterate(self.eval(s.iter, frame), s.iter)
        saved = (frame.mask, frame.brk, frame.cont)
        frame.mask = frame.local_active()  # returned paths stay out through frame.ret
        frame.brk = False
        for cond, item in items:
            frame.cont = False
            inner = frame.mask
            frame.mask = and_(inner, cond)
            if not frame.dead():
                self.assign(s.target, item, frame)
                self.exec_block(s.body, frame)
            frame.mask = inner
            if frame.brk is True or frame.ret is True:
                break
        frame.mask, frame.brk, frame.cont = saved

    def exec_try(self, s: ast.Try, frame: Frame):
        """Only failures of action-derived values (int("abc")) are modelled: the handler runs
        exactly where such a value created in the body fails on the agent's text."""
        if self.host:
            try:
                self.exec_block(s.body, frame)
            except _NeedsState:
                raise
            except (UnsupportedProgram, _BreakOut):
                raise
            except Exception:
                if not s.handlers:
                    raise
                self.exec_block(s.handlers[0].body, frame)
            else:
                self.exec_block(s.orelse, frame)
            self.exec_block(s.finalbody, frame)
            return
        # Dry run to learn which action-derived values the body creates, then run for real
        # under "no failure" and the handler under "failure".
        snapshot = self._snapshot(frame)
        self._try_stack.append([])
        self.exec_block(s.body, frame)
        created = self._try_stack.pop()
        self._restore(frame, snapshot)
        failed = False
        for av, mask in created:
            flag = self.lower(ActionVal(lambda t, av=av: av.eval(t) is _FAIL))
            failed = or_(failed, and_(mask, flag))
        saved = frame.mask
        frame.mask = and_(saved, not_(failed))
        self.exec_block(s.body, frame)
        self.exec_block(s.orelse, frame)
        if s.handlers and failed is not False:
            frame.mask = and_(saved, failed)
            handler = s.handlers[0]
            if handler.name:
                frame.locals[handler.name] = None
            self.exec_block(handler.body, frame)
        frame.mask = saved
        self.exec_block(s.finalbody, frame)

    def _snapshot(self, frame):
        def copy(v):
            if isinstance(v, list):
                return [copy(x) for x in v]
            if isinstance(v, dict):
                return {k: copy(x) for k, x in v.items()}
            return v

        return (
            {k: copy(v) for k, v in frame.locals.items()},
            {k: copy(v) for k, v in self.attrs.items()},
            frame.mask, frame.ret, frame.retval, frame.brk, frame.cont, self.key, self.loop_cap_hit,
        )

    def _restore(self, frame, snap):
        frame.locals.clear()
        frame.locals.update(snap[0])
        self.attrs.clear()
        self.attrs.update(snap[1])
        frame.mask, frame.ret, frame.retval, frame.brk, frame.cont, self.key, self.loop_cap_hit = snap[2:]

    # ----- assignment -------------------------------------------------------------------------

    def assign(self, target, value, frame: Frame):
        act = frame.active()
        if act is False:
            return
        if isinstance(target, ast.Name):
            old = frame.locals.get(target.id, _UNSET)
            act = frame.local_active()
            frame.locals[target.id] = value if (act is True or old is _UNSET) else self.merge(act, value, old, target)
        elif isinstance(target, ast.Attribute):
            if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                raise unsupported(target, "assignment to an attribute of something other than self")
            if self.forbid_state:
                raise _NeedsState()
            if isinstance(value, RngObj):
                self.attrs[target.attr] = value
                return
            old = self.attrs.get(target.attr, _UNSET)
            self.attrs[target.attr] = value if (act is True or old is _UNSET) else self.merge(act, value, old, target)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, ActionVal):
                n = len(target.elts)
                items = [self.actionval(lambda t, i=i: _unpack(value.eval(t), n)[i]) for i in range(n)]
            elif isinstance(value, (list, tuple)):
                items = list(value)
            else:
                raise unsupported(target, "unpacking a value that is not a fixed-length tuple or list")
            if len(items) != len(target.elts):
                raise unsupported(target, f"unpacking {len(items)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, items):
                self.assign(t, v, frame)
        elif isinstance(target, ast.Subscript):
            chain = []
            t = target
            while isinstance(t, ast.Subscript):
                chain.append(t.slice)
                t = t.value
            chain.reverse()
            container = self.eval(t, frame)
            if isinstance(t, ast.Attribute) and self.forbid_state:
                raise _NeedsState()
            idxs = [self.eval(i, frame) for i in chain]
            self.set_in(container, idxs, value, act, target)
        else:
            raise unsupported(target, f"assignment to {type(target).__name__}")

    def set_in(self, container, idxs, value, cond, node):
        idx = idxs[0]
        if isinstance(idx, ActionVal):
            if isinstance(container, dict):
                self._check_action_keys(container, idx, node)
            idx = self.lower(idx)
        if isinstance(container, dict):
            if is_dyn(idx) or isinstance(idx, StrId):
                # One predicated store per key; a key outside the dict would add an item in Python.
                for k in list(container.keys()):
                    c = and_(cond, self.compare_eq(idx, k, node))
                    if c is False:
                        continue
                    if len(idxs) > 1:
                        self.set_in(container[k], idxs[1:], value, c, node)
                    else:
                        container[k] = self.merge(c, value, container[k], node)
                return
            if len(idxs) > 1:
                return self.set_in(container[idx], idxs[1:], value, cond, node)
            container[idx] = (
                value if cond is True or idx not in container else self.merge(cond, value, container[idx], node)
            )
            return
        if not isinstance(container, list):
            raise unsupported(node, "item assignment into something that is not a fixed-length list")
        if isinstance(idx, slice) or isinstance(idx, ast.Slice):
            raise unsupported(node, "slice assignment")
        n = len(container)
        if isinstance(idx, (bool, int)):
            i = int(idx)
            if not -n <= i < n:
                raise unsupported(node, f"list index {i} out of range (length {n})")
            if len(idxs) > 1:
                return self.set_in(container[i], idxs[1:], value, cond, node)
            container[i] = value if cond is True else self.merge(cond, value, container[i], node)
            return
        if not is_dyn(idx) or kind_of(idx) == FLOAT:
            raise unsupported(node, "list index that is not an integer")
        idx = _as(idx, jnp.int32)
        idx = lax.select(lax.lt(idx, np.int32(0)), lax.add(idx, np.int32(n)), idx)
        for k in range(n):
            c = and_(cond, lax.eq(idx, np.int32(k)))
            if len(idxs) > 1:
                self.set_in(container[k], idxs[1:], value, c, node)
            else:
                container[k] = self.merge(c, value, container[k], node)

    def _check_action_keys(self, container: dict, key: ActionVal, node):
        """A dict keeps a fixed key set: every action text that reaches this store must name a key
        the dict already has (Python would add a new item)."""
        apath = self._cur_apath
        for text in self.vocab or []:
            if apath is not None and apath.eval(text) is not True:
                continue
            k = key.eval(text)
            if k is not _FAIL and k not in container:
                raise unsupported(node, f"dict item assignment with key {k!r} from the action (not among the dict's "
                                  "keys; a dict in state keeps a fixed key set)")

    # ----- merging values at the end of data-dependent branches ------------------------------

    def merge(self, c, a, b, node):
        """c ? a : b for any two values of the same shape."""
        if c is True:
            return a
        if c is False:
            return b
        if a is b:
            return a
        if isinstance(a, ActionVal):
            a = self.lower(a)
        if isinstance(b, ActionVal):
            b = self.lower(b)
        if isinstance(a, dict) and isinstance(b, dict):
            if list(a.keys()) != list(b.keys()):
                raise unsupported(node, f"a dict with keys {list(a)} on one path and {list(b)} on another")
            return {k: self.merge(c, a[k], b[k], node) for k in a}
        if a is None or b is None:
            if a is None and b is None:
                return None
            raise unsupported(node, "a value that is None on some paths and not on others")
        if isinstance(a, (RngObj, Module)) or isinstance(b, (RngObj, Module)):
            return a
        if isinstance(a, Text) or isinstance(b, Text):
            return self.simplify_text(select_text(c, self.to_text(a, "", node), self.to_text(b, "", node)))
        if isinstance(a, (str, StrId)) and isinstance(b, (str, StrId)):
            if isinstance(a, str) and isinstance(b, str) and a == b:
                return a
            return StrId(where(c, self.str_id(a), self.str_id(b), jnp.int32), str_domain(a, b))
        if isinstance(a, (str, StrId)) or isinstance(b, (str, StrId)):
            if is_num(a) or is_num(b):
                return self.simplify_text(select_text(c, self.to_text(a, "", node), self.to_text(b, "", node)))
        if is_num(a) and is_num(b):
            if not is_dyn(a) and not is_dyn(b) and type(a) is type(b) and a == b:
                return a
            ka, kb = kind_of(a), kind_of(b)
            if ka == kb == BOOL:
                return where(c, a, b, jnp.bool_)
            dtype = jnp.float32 if FLOAT in (ka, kb) else jnp.int32
            return where(c, _num(a), _num(b), dtype)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                raise unsupported(node, f"a list that has {len(a)} items on one path and {len(b)} on another")
            merged = [self.merge(c, x, y, node) for x, y in zip(a, b)]
            return tuple(merged) if isinstance(a, tuple) else merged
        if isinstance(a, Masked) or isinstance(b, Masked):
            ma, mb = self.as_masked(a, node), self.as_masked(b, node)
            if len(ma.items) != len(mb.items):
                raise unsupported(node, "a filtered list built differently on two paths")
            return Masked([(self.merge(c, ca, cb, node) if ca is not cb else ca, self.merge(c, va, vb, node))
                           for (ca, va), (cb, vb) in zip(ma.items, mb.items)])
        raise unsupported(node, f"values of different kinds on two paths ({_kind_name(a)} and {_kind_name(b)})")

    def as_masked(self, v, node):
        if isinstance(v, Masked):
            return v
        if isinstance(v, list):
            return Masked([(True, x) for x in v])
        raise unsupported(node, "a filtered list mixed with a non-list value")
