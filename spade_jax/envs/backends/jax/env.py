"""TranspiledEnv: a text-environment program turned into a gymnax-style JAX environment, plus
the transpile() driver that fixes its state schema, string table and action vocabulary."""

from __future__ import annotations

import ast
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from spade_jax.envs.api import boxed_contents
from spade_jax.envs.backends.jax.interp import Interp, Program, RngObj, SeedArg, is_dyn, kind_of
from spade_jax.envs.backends.jax.ir import (
    _FAIL,
    BOOL,
    DTYPES,
    FLOAT,
    INT,
    STR,
    ActionVal,
    Masked,
    Slotter,
    Spec,
    StrId,
    StringTable,
    Text,
    TLit,
    TSel,
    TVal,
    UnsupportedProgram,
    cat,
    join_specs,
    render,
    str_domain,
    template_text,
)

UNRECOGNISED_TEXT = "\\boxed{?}"  # stands for every action text the program does not recognise
NO_ANSWER_TEXT = "I am not sure."  # an action with no \boxed{} answer at all
MAX_VOCAB = 6000  # candidate action texts considered when deriving the vocabulary
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# Expressions the host interpreter may evaluate over all of _solution_samples' resets (the library
# needs at most ~1.0M, delivery_route); a program whose reset brute-forces a large search stops
# sampling early, after about 8 seconds of host interpretation.
MAX_SAMPLE_EVALS = 4_000_000
MAX_PRODUCT = 4096  # digit strings enumerated per length from the solution's digit alphabet
# Hidden state flag: a data-dependent while loop still wanted to run after MAX_WHILE_ITERATIONS
# passes (reset or any step so far). The step that sees it truncates the episode and reports it in
# info["loop_cap_hit"]; the equivalence check names the loop. Never shown to the program.
LOOP_CAP_ATTR = "__loop_cap_hit__"


# Composed text in state (self.cipher = "".join(...)): stored as this many string-table ids at
# most, concatenated; a value loaded from Python is split into single characters.
MAX_TEXT_PIECES = 256
TEXT = "text"
_PRINTABLE = [chr(c) for c in range(32, 127)] + [""]


def _strings_in(v) -> list:
    """The str and StrId scalars inside an attribute value."""
    if isinstance(v, (str, StrId)):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _strings_in(item)]
    if isinstance(v, dict):
        return [x for item in v.values() for x in _strings_in(item)]
    return []


def _count_pieces(t, where) -> int:
    if isinstance(t, TLit):
        return 1
    if isinstance(t, TVal):
        if t.kind != STR or t.spec:
            raise UnsupportedProgram(f"{where} holds text with a number formatted into it (store the number and "
                                     "format it where the text is shown)")
        return 1
    if isinstance(t, TSel):
        return _count_pieces(t.a, where) + _count_pieces(t.b, where)
    return sum(_count_pieces(p, where) for p in t.parts)


def _text_pieces(it, t, cond, where) -> list:
    """String-table ids whose concatenation is the text t (pieces off the taken branch are "")."""
    empty = it.table.id("")
    if isinstance(t, TLit):
        sid = it.table.id(t.s)
        return [sid if cond is True else jnp.where(cond, sid, empty)]
    if isinstance(t, TVal):
        _count_pieces(t, where)
        return [t.value if cond is True else jnp.where(cond, t.value, empty)]
    if isinstance(t, TSel):
        c = jnp.asarray(t.cond, jnp.bool_)
        on = c if cond is True else jnp.logical_and(cond, c)
        off = jnp.logical_not(c) if cond is True else jnp.logical_and(cond, jnp.logical_not(c))
        return _text_pieces(it, t.a, on, where) + _text_pieces(it, t.b, off, where)
    return [p for part in t.parts for p in _text_pieces(it, part, cond, where)]


@struct.dataclass
class EnvState:
    attrs: dict  # instance attribute name -> array (strings from the finite set as table ids)
    obs: dict  # last observation record: kind (0 reset, 1 step), ints, floats (template slots)
    time: jax.Array  # steps since reset
    terminated: jax.Array  # the program's terminated flag at the last step
    truncated: jax.Array  # the program's truncated flag at the last step


@struct.dataclass
class EnvParams:
    max_steps_in_episode: int = 1000  # extra time limit on top of the program's own turn limit


def _walk_constants(tree):
    strs, ints = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                strs.append(node.value)
            elif isinstance(node.value, int) and not isinstance(node.value, bool):
                ints.append(node.value)
    return strs, ints


def _feature_key(v):
    if v is _FAIL:
        return ("<fail>",)
    if isinstance(v, (list, tuple)):
        return tuple(_feature_key(x) for x in v)
    if isinstance(v, float):
        return float(np.float32(v))
    return v


class TranspiledEnv(environment.Environment):
    """gymnax-style environment compiled from a text-environment program.

    reset_env(key, params) -> (obs, state); step_env(key, state, action_id, params) ->
    (obs, state, reward, terminated, info), truncation read from state by is_truncated (gymnax
    1.0). obs is an observation record (template kind + slot values); render_text turns it
    into the program's text on the host and render_tokens into a token buffer on device."""

    def __init__(self, program: Program, *, fast_compile: bool = False):
        super().__init__()
        self.program = program
        # XLA:CPU spends most of its compile time optimising the unrolled scalar graph; tests and
        # one-off checks trade some step speed for a 2x faster compile.
        self.compiler_options = FAST_COMPILE if fast_compile else None
        self.table = StringTable()
        self.specs: dict[str, Spec] = {}
        self.rng_attrs: set[str] = set()
        self.str_domains: dict = {}  # attribute -> the strings it can hold (None: unknown)

        self.loop_cap_lines: dict[int, int] = {}  # line of a loop that can reach its pass cap -> the cap
        self.templates: list = [None, None]
        self.obs_sizes = (0, 0)
        self._features: list = []
        self._init_attrs = self._run_init()
        self.vocab: list[str] = [UNRECOGNISED_TEXT]
        self._build()

    # ----- tracing ----------------------------------------------------------------------------

    def _run_init(self) -> dict:
        init = self.program.methods.get("__init__")
        if init is None:
            return {}
        it = Interp(self.program, self.table)
        it.in_init = True
        it.call_function(init, [], {}, init)
        attrs = {}
        for name, value in it.attrs.items():
            if name in self.program.mutable:
                attrs[name] = value
            elif not it._has_dyn(value) and not isinstance(value, (ActionVal, RngObj)):
                self.program.consts[name] = value  # an instance constant, never reassigned
            else:
                attrs[name] = value
        return attrs

    def _copy_init(self):
        def copy(v):
            if isinstance(v, dict):
                return {k: copy(x) for k, x in v.items()}
            return [copy(x) for x in v] if isinstance(v, list) else v

        return {k: copy(v) for k, v in self._init_attrs.items()}

    def _trace_reset(self, key):
        prog = self.program
        it = Interp(prog, self.table, key=key)
        it.attrs = self._copy_init()
        fn = prog.methods["reset"]
        n_params = len(fn.args.args) - 1
        args = [SeedArg()] if n_params >= 1 else []
        out = it.call_function(fn, args, {}, fn)
        obs = out[0] if isinstance(out, tuple) else out
        return it, obs

    def _reset_fn(self, key):
        it, obs = self._trace_reset(key)
        self._observe_attrs(it.attrs)
        attrs = self._pack_attrs(it, it.attrs)
        self._note_loop_cap(it, False, attrs)
        record, template = self._record(it, obs, 0)
        self.templates[0] = template
        return attrs, record

    def _step_fn(self, attrs_arrays, action_id):
        prog = self.program
        it = Interp(prog, self.table, vocab=self.vocab, action_id=action_id, in_step=True)
        it.attrs = self._unpack_attrs(attrs_arrays)
        cap_before = it.attrs.pop(LOOP_CAP_ATTR, False)  # hidden from the program
        for name in self.rng_attrs:
            it.attrs[name] = RngObj()
        fn = prog.methods["step"]
        if len(fn.args.args) != 2:
            raise UnsupportedProgram(f"line {fn.lineno}: step() must take exactly one action argument")
        out = it.call_function(fn, [ActionVal(lambda t: t)], {}, fn)
        it._cur_apath = None
        it._current_mask = True
        if not isinstance(out, tuple) or len(out) != 5:
            raise UnsupportedProgram(f"line {fn.lineno}: step() must return (obs, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, _ = out
        reward = self._scalar(it, reward, FLOAT, "reward")
        terminated = self._scalar(it, it.truth(terminated, fn), BOOL, "terminated")
        truncated = self._scalar(it, it.truth(truncated, fn), BOOL, "truncated")
        self._observe_attrs(it.attrs)
        new_attrs = self._pack_attrs(it, it.attrs)
        cap_hit = self._note_loop_cap(it, cap_before, new_attrs)
        if cap_hit is not False:
            truncated = jnp.logical_or(truncated, cap_hit)
        record, template = self._record(it, obs, 1)
        self.templates[1] = template
        self._features = [(av, apath) for av, apath, _ in it._lowered.values()]
        self._last_features = list(it.features)
        return new_attrs, record, reward, terminated, truncated

    def _note_loop_cap(self, it, before, packed):
        """Carries the loop-cap flag in the hidden state attribute once any trace can raise it."""
        self.loop_cap_lines |= it.loop_cap_lines
        hit = before if it.loop_cap_hit is False else jnp.logical_or(before, it.loop_cap_hit)
        if hit is not False or LOOP_CAP_ATTR in self.specs:
            self.specs[LOOP_CAP_ATTR] = Spec(BOOL)
            packed[LOOP_CAP_ATTR] = jnp.asarray(hit, jnp.bool_)
        return hit

    def _scalar(self, it, v, kind, what):
        if isinstance(v, ActionVal):
            v = it.lower(v)
        if not (is_dyn(v) or isinstance(v, (int, float, bool))):
            raise UnsupportedProgram(f"step() returns a {what} that is not a number")
        return jnp.asarray(v, DTYPES[kind])

    def _record(self, it, obs, kind):
        if isinstance(obs, ActionVal):
            obs = it.lower(obs)
        if isinstance(obs, StrId):
            obs = it.to_text(obs, "", None)
        if isinstance(obs, str):
            obs = TLit(obs)
        if not isinstance(obs, Text):
            method = "reset" if kind == 0 else "step"
            raise UnsupportedProgram(f"{method}() returns an observation that is not a string")
        slotter = Slotter()
        template = slotter.freeze(obs)
        ni, nf = self.obs_sizes
        ni, nf = max(ni, len(slotter.ints)), max(nf, len(slotter.floats))
        self.obs_sizes = (ni, nf)
        ints = jnp.zeros((ni,), jnp.int32)
        floats = jnp.zeros((nf,), jnp.float32)
        if slotter.ints:
            ints = ints.at[: len(slotter.ints)].set(jnp.stack(slotter.ints))
        if slotter.floats:
            floats = floats.at[: len(slotter.floats)].set(jnp.stack(slotter.floats))
        return {"kind": jnp.int32(kind), "ints": ints, "floats": floats}, template

    # ----- state schema -----------------------------------------------------------------------

    def _observe_attrs(self, attrs):
        for name, value in attrs.items():
            if isinstance(value, RngObj):
                self.rng_attrs.add(name)
                continue
            if name not in self.program.mutable and name not in self.specs and not self._dynamic(value):
                continue
            new = self._infer(value, name)
            old = self.specs.get(name)
            strs = _strings_in(value)
            if strs:
                known = name not in self.str_domains or self.str_domains[name] is not None
                dom = str_domain(*strs) if known else None
                if dom is not None and self.str_domains.get(name) is not None:
                    dom = dom | self.str_domains[name]
                self.str_domains[name] = dom
            if old is not None and TEXT in (old.kind, new.kind):
                # Composed text: as many pieces as the longest composition (a plain string is one).
                if {old.kind, new.kind} <= {TEXT, STR}:
                    self.specs[name] = Spec(TEXT, max(old.length, new.length, 1), Spec(STR))
                    continue
                raise UnsupportedProgram(f"attribute self.{name} holds composed text in one place and "
                                         f"{(new if old.kind == TEXT else old).describe()} in another")
            if old is not None and "dict" in (old.kind, new.kind) and (old.kind, old.keys) != (new.kind, new.keys):
                raise UnsupportedProgram(
                    f"attribute self.{name} changes its keys ({old.describe()} -> {new.describe()}; a dict in "
                    "state must keep the same keys in the same order)")
            if old is not None and old.elem is not None and new.elem is not None and old.length != new.length:
                raise UnsupportedProgram(
                    f"attribute self.{name} changes length ({old.length} -> {new.length} items; lists in state "
                    "must keep a fixed length, e.g. preallocate [0] * MAX and keep a count)")
            self.specs[name] = join_specs(old, new, f"attribute self.{name}")

    def _dynamic(self, v):
        return (
            is_dyn(v) or isinstance(v, (StrId, Text, Masked, ActionVal))
            or (isinstance(v, (list, tuple)) and any(self._dynamic(x) for x in v))
            or (isinstance(v, dict) and any(self._dynamic(x) for x in v.values()))
        )

    def _infer(self, v, name) -> Spec:
        where = f"attribute self.{name}"
        if isinstance(v, ActionVal):
            vals = [x for x in (v.eval(t) for t in self.vocab) if x is not _FAIL]
            if vals and all(isinstance(x, (list, tuple)) for x in vals):
                return self._infer(vals[0], name)
            return self._infer(vals[0] if vals else 0, name)
        k = kind_of(v)
        if k is not None:
            return Spec(k)
        if isinstance(v, (str, StrId)):
            return Spec(STR)
        if isinstance(v, (list, tuple)):
            elem = None
            for x in v:
                elem = join_specs(elem, self._infer(x, name), where)
            return Spec("tuple" if isinstance(v, tuple) else "list", len(v), elem or Spec(INT))
        if v is None:
            raise UnsupportedProgram(
                f"{where} is None (state must be a number, bool, string or fixed-length list; "
                "use a sentinel such as -1)"
            )
        if isinstance(v, Masked):
            raise UnsupportedProgram(
                f"{where} is a list whose length depends on the game (lists in state must have a fixed length)"
            )
        if isinstance(v, Text):
            n = _count_pieces(v, where)
            if n > MAX_TEXT_PIECES:
                raise UnsupportedProgram(
                    f"{where} holds text composed from more than {MAX_TEXT_PIECES} pieces (build it from fewer)")
            for ch in _PRINTABLE:  # a Python-side value of this text is stored one character per piece
                self.table.id(ch)
            return Spec(TEXT, n, Spec(STR))
        if isinstance(v, dict):
            keys = tuple(v.keys())
            if not all(isinstance(k, (str, int)) and not isinstance(k, bool) for k in keys):
                raise UnsupportedProgram(f"{where} is a dict whose keys are not constant strings or ints")
            elem = None
            for x in v.values():
                elem = join_specs(elem, self._infer(x, name), where)
            return Spec("dict", len(keys), elem or Spec(INT), keys)
        raise UnsupportedProgram(f"{where} holds an unsupported value ({type(v).__name__})")

    def _to_array(self, it, v, spec: Spec, name):
        if isinstance(v, ActionVal):
            v = it.lower(v)
        if spec.kind == TEXT:
            if isinstance(v, (str, StrId)):
                v = it.to_text(v, "", None)
            if not isinstance(v, Text):
                raise UnsupportedProgram(f"attribute self.{name} mixes composed text and non-strings")
            pieces = _text_pieces(it, v, True, f"attribute self.{name}")
            empty = jnp.int32(self.table.id(""))
            pieces += [empty] * (spec.length - len(pieces))
            return jnp.stack([jnp.asarray(p, jnp.int32) for p in pieces])
        if spec.elem is None:
            if spec.kind == STR:
                if not isinstance(v, (str, StrId)):
                    raise UnsupportedProgram(f"attribute self.{name} mixes strings and non-strings")
                return it.str_id(v)
            if isinstance(v, (str, StrId, Text)) or v is None:
                raise UnsupportedProgram(f"attribute self.{name} mixes numbers and non-numbers")
            v = v.astype(jnp.int32) if (is_dyn(v) and v.dtype == jnp.bool_ and spec.kind != BOOL) else v
            return jnp.asarray(v, DTYPES[spec.kind])
        if spec.kind == "dict":
            if not isinstance(v, dict) or tuple(v.keys()) != spec.keys:
                raise UnsupportedProgram(f"attribute self.{name} changes its keys (a dict in state keeps its keys)")
            v = list(v.values())
        if not isinstance(v, (list, tuple)) or len(v) != spec.length:
            raise UnsupportedProgram(f"attribute self.{name} changes shape (lists in state must keep their length)")
        if spec.length == 0:
            return jnp.zeros((0,) + spec.elem.shape, DTYPES[spec.scalar])
        return jnp.stack([self._to_array(it, x, spec.elem, name) for x in v])

    def _pack_attrs(self, it, attrs) -> dict:
        out = {}
        for name, spec in self.specs.items():
            if name in attrs:
                out[name] = self._to_array(it, attrs[name], spec, name)
            else:
                out[name] = jnp.zeros(spec.shape, DTYPES[spec.scalar])
        return out

    def _from_array(self, arr, spec: Spec, domain=None):
        if spec.kind == TEXT:
            return cat(*[TVal(STR, arr[i]) for i in range(spec.length)])
        if spec.elem is None:
            return StrId(arr, domain) if spec.kind == STR else arr
        items = [self._from_array(arr[i], spec.elem, domain) for i in range(spec.length)]
        if spec.kind == "dict":
            return dict(zip(spec.keys, items))
        return tuple(items) if spec.kind == "tuple" else items

    def _unpack_attrs(self, arrays) -> dict:
        attrs = self._copy_init()
        for name, spec in self.specs.items():
            attrs[name] = self._from_array(arrays[name], spec, self.str_domains.get(name))
        return attrs

    # ----- building ---------------------------------------------------------------------------

    def _trace_all(self):
        key = jax.random.PRNGKey(0)
        attrs, _ = jax.eval_shape(self._reset_fn, key)
        attrs = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), attrs)
        jax.eval_shape(self._step_fn, attrs, jnp.int32(0))

    def _stable_trace(self):
        for _ in range(6):
            before = (dict(self.specs), len(self.table), self.obs_sizes, frozenset(self.rng_attrs),
                      dict(self.str_domains))
            self._trace_all()
            if before == (dict(self.specs), len(self.table), self.obs_sizes, frozenset(self.rng_attrs),
                          dict(self.str_domains)):
                return
        raise UnsupportedProgram("the state schema did not settle (attributes change type between reset and step)")

    def _build(self):
        samples = self._solution_samples()
        candidates = self._candidates(samples)
        self.vocab = candidates
        self._stable_trace()
        # Candidates that the step function cannot tell apart collapse into one action.
        keys: dict = {}
        chosen: list[str] = []
        garbage_key = self._text_key(UNRECOGNISED_TEXT)
        for text in candidates:
            k = self._text_key(text)
            if k == garbage_key or k in keys:
                continue
            keys[k] = len(chosen)
            chosen.append(text)
        self.vocab = chosen + [UNRECOGNISED_TEXT]
        self._trace_all()
        self._key_to_id = {self._text_key(t): i for i, t in enumerate(self.vocab)}
        self._key_to_id[self._text_key(UNRECOGNISED_TEXT)] = len(self.vocab) - 1
        self._jit_reset = jax.jit(self._reset_fn, compiler_options=self.compiler_options)
        self._jit_step = jax.jit(self._step_fn, compiler_options=self.compiler_options)

    def _text_key(self, text):
        # A feature only matters for texts that can reach the code that reads it.
        return tuple(
            _feature_key(av.eval(text)) if apath is None or apath.eval(text) is True else "<unreached>"
            for av, apath in self._features
        )

    def _candidates(self, samples: list[str]) -> list[str]:
        tree = ast.parse(self.program.source)
        strs, ints = _walk_constants(tree)
        out: list[str] = []
        seen = set()

        def add(text):
            if text not in seen and len(out) < MAX_VOCAB:
                seen.add(text)
                out.append(text)

        for s in strs:
            for content in boxed_contents(s):
                inner = content.strip()
                if inner and not any(ch in inner for ch in ".…") and len(inner) <= 30:
                    add(f"\\boxed{{{inner}}}")
        for s in strs:
            t = s.strip()
            if 1 <= len(t) <= 30 and "\n" not in t and not any(ch in t for ch in "{}\\"):
                add(f"\\boxed{{{t}}}")
        lo = min([0] + [i for i in ints if i > -100])
        hi = max([9] + [i for i in ints if i <= 300])
        for i in range(lo, hi + 1):
            add(f"\\boxed{{{i}}}")
        for s in samples:
            add(s)
        contents = [c.strip() for s in samples for c in boxed_contents(s)]
        by_length: dict[int, set] = {}
        for c in contents:
            if c.isdigit() and len(c) >= 2:
                by_length.setdefault(len(c), set()).update(c)
        for length, alphabet in sorted(by_length.items()):
            if len(alphabet) ** length <= MAX_PRODUCT:
                for digits in itertools.product(sorted(alphabet), repeat=length):
                    add("\\boxed{" + "".join(digits) + "}")
        add(NO_ANSWER_TEXT)
        add("\\boxed{}")
        add(UNRECOGNISED_TEXT)
        return out

    def _solution_samples(self, n: int = 48) -> list[str]:
        """Winning action texts from the program's own solution() after n resets, run by the host
        interpreter (the subset only, Python's random); they seed the action vocabulary with the
        answers the program accepts."""
        import random as _random

        fn = self.program.methods.get("solution")
        if fn is None or len(fn.args.args) != 1:
            return []
        reset = self.program.methods["reset"]
        texts: list[str] = []
        evals_left = MAX_SAMPLE_EVALS  # shared by all seeds: a costly reset means fewer samples
        for seed in range(n):
            it = Interp(self.program, StringTable(), host=True, forbid_state=False, pyrng=_random.Random(seed))
            it.budget = 200_000
            it.eval_budget = evals_left
            it.attrs = self._copy_init()
            try:
                it.call_function(reset, [seed] if len(reset.args.args) > 1 else [], {}, reset)
                out = it.call_function(fn, [], {}, fn)
            except Exception:  # a solution outside the subset only means fewer seeds for the vocabulary
                return texts
            evals_left = it.eval_budget
            if isinstance(out, str):
                out = [out]
            if isinstance(out, (list, tuple)):
                texts.extend(x for x in out if isinstance(x, str))
        return list(dict.fromkeys(texts))

    # ----- gymnax interface -------------------------------------------------------------------

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_env(self, key, params):
        attrs, record = self._reset_fn(key)
        state = EnvState(attrs=attrs, obs=record, time=jnp.int32(0), terminated=jnp.bool_(False),
                         truncated=jnp.bool_(False))
        return record, state

    def step_env(self, key, state, action, params):
        action = jnp.clip(jnp.asarray(action, jnp.int32), 0, len(self.vocab) - 1)
        attrs, record, reward, terminated, truncated = self._step_fn(state.attrs, action)
        new_state = EnvState(attrs=attrs, obs=record, time=state.time + 1, terminated=terminated, truncated=truncated)
        info = {"program_truncated": truncated, "loop_cap_hit": self.loop_cap_hit(new_state)}
        return record, new_state, reward, terminated, info

    def is_truncated(self, state, params):
        return jnp.logical_or(state.truncated, state.time >= params.max_steps_in_episode)

    def is_terminated(self, state, params):
        return state.terminated

    def loop_cap_hit(self, state):
        """Whether a data-dependent while loop ran into MAX_WHILE_ITERATIONS in this episode (the
        episode then no longer follows the program and is truncated)."""
        attrs = state.attrs if isinstance(state, EnvState) else state
        return attrs.get(LOOP_CAP_ATTR, jnp.bool_(False))

    @property
    def name(self) -> str:
        return self.program.class_name

    @property
    def num_actions(self) -> int:
        return len(self.vocab)

    def action_space(self, params=None):
        return spaces.Discrete(len(self.vocab))

    # ----- host helpers -----------------------------------------------------------------------

    @property
    def action_vocab(self) -> list[str]:
        return list(self.vocab)

    @property
    def unrecognised_id(self) -> int:
        return len(self.vocab) - 1

    def action_id(self, text: str) -> int:
        """The vocabulary id whose behaviour the program gives to `text` (its own parsing decides);
        texts it treats like none of the vocabulary map to the unrecognised id."""
        return self._key_to_id.get(self._text_key(text), self.unrecognised_id)

    def render_text(self, state_or_obs) -> str:
        record = state_or_obs.obs if isinstance(state_or_obs, EnvState) else state_or_obs
        kind = int(np.asarray(record["kind"]))
        text = render(self.templates[kind], np.asarray(record["ints"]), np.asarray(record["floats"]),
                      self.table.strings)
        return text

    def template_text(self, kind: int = 1) -> str:
        """The observation template of reset (0) or step (1), holes shown as {i3}, {s0}, [c1 ? a : b]."""
        return template_text(self.templates[kind])

    def python_state(self, state) -> dict:
        """Instance attributes of the program for this state, ready for set_attrs()."""
        attrs = state.attrs if isinstance(state, EnvState) else state
        out = {}
        for name, spec in self.specs.items():
            if name != LOOP_CAP_ATTR:
                out[name] = self._to_python(np.asarray(attrs[name]), spec)
        return out

    def _to_python(self, arr, spec: Spec):
        if spec.kind == TEXT:
            return "".join(self.table.strings[int(i)] for i in arr)
        if spec.elem is None:
            if spec.kind == STR:
                return self.table.strings[int(arr)]
            if spec.kind == BOOL:
                return bool(arr)
            if spec.kind == INT:
                return int(arr)
            return float(arr)
        items = [self._to_python(arr[i], spec.elem) for i in range(spec.length)]
        if spec.kind == "dict":
            return dict(zip(spec.keys, items))
        return tuple(items) if spec.kind == "tuple" else items

    def state_with(self, attrs, record, time=0, terminated=False, truncated=False) -> EnvState:
        return EnvState(attrs=attrs, obs=record, time=jnp.int32(time), terminated=jnp.bool_(terminated),
                        truncated=jnp.bool_(truncated))

    def state_from_python(self, attrs: dict) -> EnvState:
        """The device state for a Python instance's attributes (after the program's own reset).
        Raises ValueError when a value lies outside what the JAX version can represent."""
        arrays = {}
        for name, spec in self.specs.items():
            if name == LOOP_CAP_ATTR:
                arrays[name] = jnp.bool_(False)
                continue
            if name not in attrs:
                raise ValueError(f"the Python instance has no attribute {name!r}")
            arrays[name] = jnp.asarray(self._from_python(attrs[name], spec, name), DTYPES[spec.scalar])
        ni, nf = self.obs_sizes
        record = {"kind": jnp.int32(0), "ints": jnp.zeros((ni,), jnp.int32), "floats": jnp.zeros((nf,), jnp.float32)}
        return EnvState(attrs=arrays, obs=record, time=jnp.int32(0), terminated=jnp.bool_(False),
                        truncated=jnp.bool_(False))

    def _from_python(self, v, spec: Spec, name):
        if spec.kind == TEXT:
            if not isinstance(v, str) or len(v) > spec.length or any(ch not in self.table._ids for ch in v):
                raise ValueError(f"self.{name} = {v!r} does not fit its {spec.length} text pieces")
            return [self.table._ids[ch] for ch in v] + [self.table._ids[""]] * (spec.length - len(v))
        if spec.elem is None:
            if spec.kind == STR:
                if not isinstance(v, str) or v not in self.table._ids:
                    raise ValueError(f"self.{name} = {v!r} is not in the program's string set")
                return self.table._ids[v]
            if isinstance(v, str) or v is None or isinstance(v, (list, tuple, dict)):
                raise ValueError(f"self.{name} = {v!r} is not a {spec.kind}")
            if spec.kind == INT and not (-(2**31) <= int(v) < 2**31):
                raise ValueError(f"self.{name} = {v} overflows int32")
            return v
        if spec.kind == "dict":
            if not isinstance(v, dict) or tuple(v.keys()) != spec.keys:
                raise ValueError(f"self.{name} does not have the keys {list(spec.keys)}")
            v = list(v.values())
        if not isinstance(v, (list, tuple)) or len(v) != spec.length:
            raise ValueError(f"self.{name} does not have {spec.length} items")
        return [self._from_python(x, spec.elem, name) for x in v]

    def text_env(self, seed: int | None = None):
        from spade_jax.envs.backends.jax.textenv import JaxTextEnv

        return JaxTextEnv(self, seed=seed)

    def render_tokens(self, obs, tokenizer, max_tokens: int = 1024):
        """Token buffer (int32[max_tokens]) and length for an observation record, on device."""
        return self.token_renderer(tokenizer, max_tokens)(obs)

    def token_renderer(self, tokenizer, max_tokens: int = 1024):
        from spade_jax.envs.backends.jax.tokens import TokenRenderer

        cache = self.__dict__.setdefault("_token_renderers", {})
        key = (id(tokenizer), max_tokens)
        if key not in cache:
            cache[key] = TokenRenderer(self, tokenizer, max_tokens)
        return cache[key]


def transpile(source: str, class_name: str | None = None, *, fast_compile: bool = False) -> TranspiledEnv:
    """Compile a text-environment program into a TranspiledEnv, or raise UnsupportedProgram
    naming the line and construct that falls outside the subset. fast_compile lowers XLA's
    optimisation level for the host-side jitted reset/step (tests, one-off checks)."""
    program = Program(source, class_name)
    try:
        return TranspiledEnv(program, fast_compile=fast_compile)
    except UnsupportedProgram:
        raise
    except RecursionError:
        raise UnsupportedProgram("the program nests too deeply to trace") from None
