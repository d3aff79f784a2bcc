"""The symbolic evaluator: runs a method's Python AST over traced JAX values with predicated control
flow, so that one trace covers every branch of reset and step; its mixins hold the constructs."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from spade_jax.envs.backends.jax.interp.actions import ActionValues
from spade_jax.envs.backends.jax.interp.builtin_calls import Builtins
from spade_jax.envs.backends.jax.interp.calls import Calls
from spade_jax.envs.backends.jax.interp.containers import Containers
from spade_jax.envs.backends.jax.interp.draws import RandomDraws
from spade_jax.envs.backends.jax.interp.expressions import MAX_TRACED_OPS, Expressions
from spade_jax.envs.backends.jax.interp.loops import Loops
from spade_jax.envs.backends.jax.interp.operators import Operators
from spade_jax.envs.backends.jax.interp.predication import _UNSET, Frame, _NeedsState
from spade_jax.envs.backends.jax.interp.statements import Statements
from spade_jax.envs.backends.jax.interp.text import TextOps
from spade_jax.envs.backends.jax.interp.values import is_dyn
from spade_jax.envs.backends.jax.ir import _FAIL, ActionVal, Masked, StrId, StringTable, Text, unsupported

if TYPE_CHECKING:  # Program builds an Interp to fold its constants
    from spade_jax.envs.backends.jax.interp.program import Program


class Interp(
    Statements, Loops, Expressions, Operators, Containers, Calls, ActionValues, TextOps, RandomDraws, Builtins
):
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
        self.loop_cap_hit = False  # see Statements.exec_while
        self.loop_cap_lines: dict[int, int] = {}  # line of a loop that can reach its cap -> the cap

    # ----- method calls -----------------------------------------------------------------------

    def call_function(self, fn: ast.FunctionDef, args: list, kwargs: dict, node, bind_self=True, caller=None):
        self.depth += 1
        if self.depth > 40:
            raise unsupported(node, f"recursive call of {fn.name}() (recursion is not supported)")
        params = fn.args
        names = [a.arg for a in params.args]
        if bind_self:
            names = names[1:]
        if params.kwonlyargs:
            raise unsupported(fn, f"{fn.name}() has keyword-only parameters")
        local_vars: dict = {}
        defaults = params.defaults
        default_map = {names[len(names) - len(defaults) + i]: d for i, d in enumerate(defaults)} if defaults else {}
        if len(args) > len(names) and not params.vararg:
            raise unsupported(node, f"{fn.name}() called with too many arguments")
        for name, value in zip(names, args):
            local_vars[name] = value
        # Designers declare __init__(self, max_turns=10, **kwargs): the extras are a plain tuple/dict.
        if params.vararg:
            local_vars[params.vararg.arg] = tuple(args[len(names):])
        extra = {}
        for k, v in kwargs.items():
            if k not in names:
                if not params.kwarg:
                    raise unsupported(node, f"{fn.name}() has no parameter {k!r}")
                extra[k] = v
                continue
            local_vars[k] = v
        if params.kwarg:
            local_vars[params.kwarg.arg] = extra
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
        if isinstance(v, dict):
            return any(self._has_dyn(x) for x in v.values())
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
