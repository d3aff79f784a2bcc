"""Symbolic evaluator of the environment subset: runs a method's Python AST over traced JAX
values with predicated control flow, so that one trace covers every branch of reset and step."""

from __future__ import annotations

import ast
import math
import operator
import re
import string as string_module

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spade_jax.envs.jaxenv.ir import (
    BOOL,
    DTYPES,
    EMPTY,
    FLOAT,
    INT,
    STR,
    ActionVal,
    Masked,
    Spec,
    StringTable,
    StrId,
    Text,
    TLit,
    TSel,
    TVal,
    UnsupportedProgram,
    _FAIL,
    cat,
    select_text,
    unsupported,
)

# ---------------------------------------------------------------------------------------------
# Program: the class, its constants and methods.

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


class Program:
    """Parsed environment program: the class, its constants, methods and mutable attributes."""

    def __init__(self, source: str, class_name: str | None = None):
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise UnsupportedProgram(f"line {exc.lineno}: syntax error: {exc.msg}") from None
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        if class_name is None:
            from spade_jax.envs.program import ProgramError, find_env_class

            try:
                class_name = find_env_class(tree)
            except ProgramError as exc:
                raise UnsupportedProgram(str(exc)) from None
        if class_name not in classes:
            raise UnsupportedProgram(f"no class named {class_name!r} in the program")
        self.source = source
        self.class_name = class_name
        self.cls = classes[class_name]
        for base in self.cls.bases:
            if not (isinstance(base, ast.Name) and base.id == "object"):
                raise unsupported(base, "the environment class has a base class (only plain classes are supported)")
        self.module_funcs: dict[str, ast.FunctionDef] = {}
        self.module_consts: dict = {}
        self.imports: dict[str, object] = {}
        host = Interp(self, StringTable(), host=True)
        self.imports = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in _MODULES:
                        self.imports[alias.asname or alias.name] = Module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.module in _MODULES:
                    for alias in node.names:
                        self.imports[alias.asname or alias.name] = ("from", node.module, alias.name)
            elif isinstance(node, ast.FunctionDef):
                self.module_funcs[node.name] = node
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                try:
                    value = host.eval(node.value, Frame({}))
                except UnsupportedProgram:
                    continue  # module constant we cannot fold; fails later only if used
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.module_consts[t.id] = value
        self.methods: dict[str, ast.FunctionDef] = {}
        self.consts: dict = {}
        for node in self.cls.body:
            if isinstance(node, ast.FunctionDef):
                self.methods[node.name] = node
        for node in self.cls.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = host.eval(node.value, Frame(dict(self.consts)))
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.consts[t.id] = value
        for required in ("reset", "step"):
            if required not in self.methods:
                raise UnsupportedProgram(f"the class {class_name} has no {required}() method")
        self.mutable = self._mutable_attrs()

    def _mutable_attrs(self) -> set[str]:
        names: set[str] = set()

        def root(t):
            while isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                return t.attr
            return None

        for name, fn in self.methods.items():
            if name == "__init__":
                continue
            for node in ast.walk(fn):
                targets = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    targets = [node.func.value] + list(node.args)
                for t in targets:
                    for sub in ast.walk(t) if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                        r = root(sub)
                        if r is not None and r not in self.methods:
                            names.add(r)
        return names


# ---------------------------------------------------------------------------------------------
# Predication helpers: conditions are Python bools (static) or jax bools (traced).


# Loops unroll when traced, so a program can trace into a graph too large for XLA to compile (a
# library knapsack retuned to 12 items brute-forces 4096 subsets: 221k operations, a 2-minute
# trace and a compile that exhausted 24 GiB). The library's largest trace builds under 5k.
MAX_TRACED_OPS = 50_000


def is_dyn(x) -> bool:
    return isinstance(x, jax.Array)


def _b(x):
    return x if x.dtype == jnp.bool_ else lax.ne(x, jnp.zeros((), x.dtype))


def and_(a, b):
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    if a is b:
        return a
    return lax.bitwise_and(_b(a), _b(b))


def or_(a, b):
    if a is False:
        return b
    if b is False:
        return a
    if a is True or b is True:
        return True
    if a is b:
        return a
    return lax.bitwise_or(_b(a), _b(b))


def not_(a):
    if isinstance(a, (bool, np.bool_)):
        return not a
    return lax.bitwise_not(_b(a))


def where(c, a, b, dtype):
    """Scalar select through lax (jnp.where's wrapper costs ~3x more per traced op)."""
    return lax.select(c, _as(a, dtype), _as(b, dtype))


def _as(x, dtype):
    if isinstance(x, jax.Array):
        return x if x.dtype == dtype else lax.convert_element_type(x, dtype)
    return np.asarray(x, dtype)


def table_lookup(values: np.ndarray, idx):
    """values[idx] for a host table and a traced index (clamped, as jnp indexing is)."""
    return lax.dynamic_index_in_dim(jnp.asarray(values), _as(idx, jnp.int32), keepdims=False)


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


class Frame:
    """Locals plus the path condition of the code being traced."""

    def __init__(self, local_vars):
        self.locals = local_vars
        self.mask = True  # path condition
        self.ret = False  # already returned
        self.retval = _UNSET
        self.brk = False
        self.cont = False
        self.apath = None  # predicate on the action text implied by the path (None: any text)
        self._akey = None

    def active(self):
        key = (id(self.mask), id(self.ret), id(self.brk), id(self.cont))
        if self._akey != key:
            self._akey = key
            self._aval = and_(and_(self.mask, not_(self.ret)), not_(or_(self.brk, self.cont)))
            self._keep = (self.mask, self.ret, self.brk, self.cont)
        return self._aval

    def dead(self) -> bool:
        return self.active() is False


_UNSET = object()


class _NeedsState(Exception):
    """Host evaluation of an action helper touched instance state."""


class _BreakOut(Exception):
    pass


# ---------------------------------------------------------------------------------------------


class Interp:
    """One trace of a method. `host=True` evaluates on concrete Python values only (used to run
    action-parsing helpers on candidate action texts)."""

    def __init__(self, program: Program, table: StringTable, *, host=False, vocab=None, action_id=None, key=None,
                 in_step=False, forbid_state=None, pyrng=None):
        self.p = program
        self.table = table
        self.host = host
        # Host runs of action helpers must not touch instance state (they run once per text).
        self.forbid_state = host if forbid_state is None else forbid_state
        self.pyrng = pyrng  # host runs of reset draw from Python's own generator
        self.budget = 5_000_000  # statements one trace may execute
        self.op_budget = MAX_TRACED_OPS  # array-valued expressions one trace may build
        self.eval_budget: int | None = None  # expressions a host run may evaluate (None: no cap)
        self.vocab = vocab  # candidate action texts, for lowering action-derived values
        self.action_id = action_id
        self.key = key
        self.in_step = in_step
        self.attrs: dict = {}
        self.features: list = []  # lowered action-derived values, as per-text value tuples
        self._lowered: dict[int, object] = {}
        self._try_stack: list = []
        self.depth = 0

    # ----- method calls -----------------------------------------------------------------------

    def call_function(self, fn: ast.FunctionDef, args: list, kwargs: dict, node, bind_self=True, caller=None):
        self.depth += 1
        if self.depth > 40:
            raise unsupported(node, f"recursive call of {fn.name}() (recursion is not supported)")
        params = fn.args
        names = [a.arg for a in params.args]
        if bind_self:
            names = names[1:]
        if params.vararg or params.kwarg:
            raise unsupported(fn, f"{fn.name}() takes *args/**kwargs")
        local_vars: dict = {}
        defaults = params.defaults
        default_map = {names[len(names) - len(defaults) + i]: d for i, d in enumerate(defaults)} if defaults else {}
        if len(args) > len(names):
            raise unsupported(node, f"{fn.name}() called with too many arguments")
        for name, value in zip(names, args):
            local_vars[name] = value
        for k, v in kwargs.items():
            if k not in names:
                raise unsupported(node, f"{fn.name}() has no parameter {k!r}")
            local_vars[k] = v
        for name in names:
            if name not in local_vars:
                if name not in default_map:
                    raise unsupported(node, f"{fn.name}() is missing argument {name!r}")
                local_vars[name] = self.eval(default_map[name], Frame({}))
        frame = Frame(local_vars)
        if caller is not None:
            frame.mask = caller.active()
            frame.apath = caller.apath
        self.exec_block(fn.body, frame)
        self.depth -= 1
        return None if frame.retval is _UNSET else frame.retval

    def call_method(self, name: str, args, kwargs, node, caller=None):
        fn = self.p.methods[name]
        if not self.host and any(isinstance(a, ActionVal) for a in args) and not any(
            self._has_dyn(a) for a in list(args) + list(kwargs.values())
        ):
            host_val = self._host_call(fn, args, kwargs, node)
            if host_val is not None:
                return host_val
        return self.call_function(fn, list(args), dict(kwargs), node, caller=caller)

    def _has_dyn(self, v) -> bool:
        if is_dyn(v) or isinstance(v, (StrId, Text, Masked)):
            return True
        if isinstance(v, (list, tuple)):
            return any(self._has_dyn(x) for x in v)
        return False

    def _host_call(self, fn, args, kwargs, node):
        """An action-parsing helper run on the host for each candidate text, if it reads no state."""
        host = Interp(self.p, self.table, host=True, forbid_state=True)

        def run(text):
            concrete = [a.eval(text) if isinstance(a, ActionVal) else a for a in args]
            if any(c is _FAIL for c in concrete):
                raise ValueError("failed input")
            return host.call_function(fn, concrete, dict(kwargs), node)

        av = self.actionval(run)
        try:
            for text in (self.vocab or [])[:64]:
                av.eval(text)
                if text in av._cache and av._cache[text] is _FAIL:
                    try:
                        run(text)
                    except _NeedsState:
                        return None
                    except Exception:
                        pass
        except _NeedsState:
            return None
        return av

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
        elif isinstance(s, ast.While):
            pass
        else:
            raise unsupported(s, f"{type(s).__name__} statement")

    def exec_for(self, s: ast.For, frame: Frame):
        if s.orelse:
            raise unsupported(s, "for ... else")
        items = self.iterate(self.eval(s.iter, frame), s.iter)
        saved = (frame.mask, frame.brk, frame.cont)
        frame.mask = frame.active()
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

    def exec_while(self, s: ast.While, frame: Frame):
        if s.orelse:
            raise unsupported(s, "while ... else")
        saved = (frame.mask, frame.brk, frame.cont)
        frame.mask = frame.active()
        frame.brk = False
        for _ in range(10_000):
            frame.cont = False
            cond = self.condition(s.test, frame)
            if is_dyn(cond):
                raise unsupported(s, "while loop with a data-dependent bound")
            if not cond:
                break
            self.exec_block(s.body, frame)
            if frame.brk is True or frame.ret is True:
                break
            if is_dyn(frame.brk):
                raise unsupported(s, "while loop with a data-dependent break")
        else:
            raise unsupported(s, "while loop that runs more than 10000 times")
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
            return v

        return (
            {k: copy(v) for k, v in frame.locals.items()},
            {k: copy(v) for k, v in self.attrs.items()},
            frame.mask, frame.ret, frame.retval, frame.brk, frame.cont, self.key,
        )

    def _restore(self, frame, snap):
        frame.locals.clear()
        frame.locals.update(snap[0])
        self.attrs.clear()
        self.attrs.update(snap[1])
        frame.mask, frame.ret, frame.retval, frame.brk, frame.cont, self.key = snap[2:]

    # ----- assignment -------------------------------------------------------------------------

    def assign(self, target, value, frame: Frame):
        act = frame.active()
        if act is False:
            return
        if isinstance(target, ast.Name):
            old = frame.locals.get(target.id, _UNSET)
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
            idx = self.lower(idx)
        if isinstance(container, dict):
            if is_dyn(idx) or isinstance(idx, StrId):
                raise unsupported(node, "dict item assignment with a data-dependent key")
            if len(idxs) > 1:
                return self.set_in(container[idx], idxs[1:], value, cond, node)
            container[idx] = value if cond is True or idx not in container else self.merge(cond, value, container[idx], node)
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
            if a.keys() == b.keys():
                try:
                    return {k: self.merge(c, a[k], b[k], node) for k in a}
                except UnsupportedProgram:
                    return {}
            return {}
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
            return StrId(where(c, self.str_id(a), self.str_id(b), jnp.int32))
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
            return Masked([(self.merge(c, ca, cb, node) if not (ca is cb) else ca, self.merge(c, va, vb, node))
                           for (ca, va), (cb, vb) in zip(ma.items, mb.items)])
        raise unsupported(node, f"values of different kinds on two paths ({_kind_name(a)} and {_kind_name(b)})")

    def as_masked(self, v, node):
        if isinstance(v, Masked):
            return v
        if isinstance(v, list):
            return Masked([(True, x) for x in v])
        raise unsupported(node, "a filtered list mixed with a non-list value")

    # ----- action-derived values --------------------------------------------------------------

    def actionval(self, fn) -> ActionVal:
        av = ActionVal(fn)
        if self._try_stack:
            self._try_stack[-1].append((av, self._current_mask))
        return av

    _current_mask = True
    _cur_apath = None

    def lower(self, av: ActionVal):
        """Turns an action-derived value into a device value: a table over the action vocabulary
        indexed by the action id."""
        apath = self._cur_apath
        key = (id(av), id(apath))
        if key in self._lowered:
            return self._lowered[key][2]
        if self.vocab is None or self.action_id is None:
            raise UnsupportedProgram("the action text is used outside step()")
        vals = [av.eval(t) for t in self.vocab]
        out = self._lower_values(vals)
        self._lowered[key] = (av, apath, out)
        return out

    def _lower_values(self, vals):
        ok = [v for v in vals if v is not _FAIL]
        if ok and all(isinstance(v, (list, tuple)) for v in ok) and len({len(v) for v in ok}) == 1:
            n = len(ok[0])
            items = [self._lower_values([v if v is _FAIL else v[i] for v in vals]) for i in range(n)]
            return tuple(items) if isinstance(ok[0], tuple) else items
        if all(isinstance(v, bool) for v in ok):
            arr = np.array([bool(v) if v is not _FAIL else False for v in vals])
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, (int, bool)) for v in ok):
            if any(abs(int(v)) >= 2**31 for v in ok):
                ok_vals = [0 if v is _FAIL or abs(int(v)) >= 2**31 else int(v) for v in vals]
            else:
                ok_vals = [0 if v is _FAIL else int(v) for v in vals]
            arr = np.array(ok_vals, np.int32)
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, (int, float, bool)) for v in ok):
            arr = np.array([0.0 if v is _FAIL else float(v) for v in vals], np.float32)
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, str) or v is None for v in ok):
            ids = np.array([self.table.id("" if v is _FAIL else str(v)) for v in vals], np.int32)
            self.features.append(tuple(ids.tolist()))
            return StrId(table_lookup(ids, self.action_id))
        raise UnsupportedProgram("a value parsed from the action is neither a number, a string nor a fixed-length list")

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
            return StrId(table_lookup(np.array(ids, np.int32), sid.id))
        dtype = {INT: np.int32, BOOL: np.bool_, FLOAT: np.float32}[result_kind]
        arr = np.array([0 if o is _FAIL else o for o in outs], dtype)
        return table_lookup(arr, sid.id)

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
                    frame.apath = _pand(saved_apath, pure if is_and else self.actionval(lambda t, p=pure: p.eval(t) is not True))
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
                raise unsupported(node, "indexing a string with a data-dependent index")
            return self.table_map(base, lambda s: s[idx], STR)
        if isinstance(base, str):
            if is_dyn(idx):
                base = list(base)
            else:
                return base[idx]
        if isinstance(base, range):
            base = list(base)
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
            return StrId(self._stack_index([self.str_id(x) for x in items], idx, jnp.int32))
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
                n = (len(a) if isinstance(a, (list, tuple, str)) else 1) * (b if isinstance(b, int) else a if isinstance(a, int) else 1)
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
                        result = self.actionval(lambda s, l=left, r=right: _ev(l, s) and _ev(r, s))
                    else:
                        result = self.actionval(lambda s, l=left, r=right: _ev(l, s) or _ev(r, s))
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
            return lax.eq(_as(a if dtype == jnp.bool_ else _num(a), dtype), _as(b if dtype == jnp.bool_ else _num(b), dtype))
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
        if isinstance(v, Masked):
            return list(v.items)
        return [(True, x) for x in self.iterate_plain(v, node)]

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
            raise unsupported(node, "loop over the characters of a data-dependent string")
        raise unsupported(node, f"loop over {_kind_name(v)}")

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
        if isinstance(base, list) and name in ("append", "extend", "insert", "pop", "remove", "sort", "reverse", "count", "index", "copy"):
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
                if name in ("count", "find", "index", "startswith", "endswith") and len(args) == 1 and isinstance(args[0], StrId):
                    return self.table_map(args[0], lambda s: getattr(base, name)(s), INT if name in ("count", "find", "index") else BOOL)
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
            raise unsupported(node, f"method {name}() on composed text")
        raise unsupported(node, f"method {name}() on {_kind_name(base)}")

    def list_method(self, base, name, args, kwargs, node, frame):
        act = frame.active()
        if name == "append":
            if act is True and isinstance(base, list):
                base.append(args[0])
                return None
            target = node.func.value
            if not isinstance(target, ast.Name):
                raise unsupported(node, "append to a list of the instance in a data-dependent branch (its length would vary)")
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

    def join(self, sep: str, iterable, node):
        if isinstance(iterable, ActionVal):
            return self.actionval(lambda t: sep.join(_ev(iterable, t)))
        if isinstance(iterable, Masked):
            out: Text = EMPTY
            any_before = False
            for c, v in iterable.items:
                piece = self.to_text(self._as_dyn(v), "", node)
                if sep:
                    lead = TLit(sep) if any_before is True else (EMPTY if any_before is False else TSel(any_before, TLit(sep), EMPTY))
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

    # ----- random draws -----------------------------------------------------------------------

    def next_key(self, node):
        if self.host:
            raise _NeedsState()
        if self.key is None:
            where = "step()" if self.in_step else "this method"
            raise unsupported(node, f"random draw in {where} (only reset() may draw; the sandbox's random stream cannot be reproduced)")
        self.key, sub = jax.random.split(self.key)
        return sub

    def draw(self, name, args, kwargs, node):
        if self.host:
            if self.pyrng is None:
                raise _NeedsState()
            if name not in ("randint", "randrange", "random", "uniform", "choice", "choices", "shuffle", "sample", "gauss"):
                raise unsupported(node, f"random.{name}()")
            if isinstance(args[0] if args else None, Masked):
                raise unsupported(node, f"random.{name} of a filtered list")
            return getattr(self.pyrng, name)(*args, **kwargs)
        args = [self._as_dyn(a) for a in args]
        if name == "randint":
            a, b = args
            return jax.random.randint(self.next_key(node), (), _num(a), _num(b) + 1, jnp.int32)
        if name == "randrange":
            if len(args) == 1:
                start, stop, step = 0, args[0], 1
            else:
                start, stop = args[0], args[1]
                step = args[2] if len(args) > 2 else 1
            if self._has_dyn(step):
                raise unsupported(node, "randrange with a data-dependent step")
            count = (_num(stop) - _num(start) + step - (1 if step > 0 else -1)) // step
            return _num(start) + step * jax.random.randint(self.next_key(node), (), 0, count, jnp.int32)
        if name == "random":
            return jax.random.uniform(self.next_key(node), (), jnp.float32)
        if name == "uniform":
            a, b = args
            u = jax.random.uniform(self.next_key(node), (), jnp.float32)
            return _num(a) + (_num(b) - _num(a)) * u
        if name in ("gauss", "normalvariate"):
            mu, sigma = args
            return _num(mu) + _num(sigma) * jax.random.normal(self.next_key(node), (), jnp.float32)
        if name == "choice":
            return self.random_choice(args[0], node)
        if name == "choices":
            k = kwargs.get("k", 1)
            if kwargs.get("weights") is not None or kwargs.get("cum_weights") is not None:
                raise unsupported(node, "random.choices with weights")
            return [self.random_choice(args[0], node) for _ in range(k)]
        if name == "shuffle":
            seq = args[0]
            if not isinstance(seq, list):
                raise unsupported(node, "shuffle of something that is not a fixed-length list")
            perm = jax.random.permutation(self.next_key(node), len(seq))
            new = [self.gather(seq, perm[i], node) for i in range(len(seq))]
            seq[:] = [self.merge(self._current_mask, n, o, node) for n, o in zip(new, seq)]
            return None
        if name == "sample":
            pop = args[0]
            k = args[1] if len(args) > 1 else kwargs.get("k")
            if self._has_dyn(k):
                raise unsupported(node, "random.sample with a data-dependent size")
            items = self.iterate_plain(pop, node) if not isinstance(pop, Masked) else None
            if items is None:
                raise unsupported(node, "random.sample from a filtered list")
            perm = jax.random.permutation(self.next_key(node), len(items))
            return [self.gather(items, perm[i], node) for i in range(k)]
        raise unsupported(node, f"random.{name}()")

    def random_choice(self, seq, node):
        if isinstance(seq, range):
            if len(seq) == 0:
                raise unsupported(node, "choice from an empty range")
            return seq.start + seq.step * jax.random.randint(self.next_key(node), (), 0, len(seq), jnp.int32)
        if isinstance(seq, Masked):
            conds = jnp.stack([jnp.asarray(c, bool) for c, _ in seq.items])
            logits = jnp.where(conds, 0.0, -jnp.inf)
            idx = jax.random.categorical(self.next_key(node), logits)
            return self.gather([v for _, v in seq.items], idx, node)
        items = self.iterate_plain(seq, node)
        if not items:
            raise unsupported(node, "choice from an empty list")
        idx = jax.random.randint(self.next_key(node), (), 0, len(items), jnp.int32)
        return self.gather(items, idx, node)

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
            raise unsupported(node, f"len of {_kind_name(v)}")
        if name == "range":
            raise unsupported(node, "range with a data-dependent bound")
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
                stacked = jnp.stack([jnp.where(jnp.asarray(c, bool), jnp.asarray(_num(v), dtype), fill) for c, v in seq.items])
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


def _pand(a, b):
    """Conjunction of two action predicates (None = always true); a failing test counts as false."""
    if a is None:
        return b
    if b is None:
        return a
    return ActionVal(lambda t: a.eval(t) is True and b.eval(t) is True)


def _strip(implied, pure):
    return None if implied is pure else implied


def _por(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return ActionVal(lambda t: a.eval(t) is True or b.eval(t) is True)


def _always_exits(stmts) -> bool:
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    if isinstance(last, ast.If):
        return _always_exits(last.body) and _always_exits(last.orelse)
    return False


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
    "ord": ord, "chr": chr, "repr": repr, "set": set, "isinstance": isinstance, "map": map, "filter": filter,
}
_BUILTINS = set(_HOST_BUILTINS) | {"print"}
_BUILTIN_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple}
