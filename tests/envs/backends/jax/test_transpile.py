"""Transpiler: library coverage, action vocabulary, state injection, precise fallback reasons."""

import pathlib
import time

import jax
import numpy as np
import pytest

from spade_jax.envs.backends.jax import EnvState, UnsupportedProgram, transpile
from spade_jax.envs.library import library_program, library_programs

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
HEAVY = {"grid_maze", "sliding_puzzle", "odd_one_out", "knapsack", "delivery_route"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(p.name, marks=pytest.mark.slow) if p.name in HEAVY else p.name for p in library_programs()],
)
def test_library_program_transpiles(name):
    program = library_program(name)
    env = transpile(program.source, program.class_name)
    assert env.name == program.class_name
    assert env.action_vocab[-1] == "\\boxed{?}"
    # Every winning action the program itself proposes is a distinct, recognised action.
    assert len(env.action_vocab) >= 3


def test_action_vocabulary_follows_the_programs_parsing():
    program = library_program("target_number")
    env = transpile(program.source, program.class_name)
    assert env.action_vocab == ["\\boxed{add}", "\\boxed{sub}", "\\boxed{mul}", "\\boxed{?}"]
    # _parse strips and lowercases the last \boxed{}: these all mean "add".
    for text in ["\\boxed{add}", "I think \\boxed{ ADD }", "\\boxed{sub} no, \\boxed{add}"]:
        assert env.action_id(text) == 0
    for text in ["", "add", "\\boxed{divide}", "\\boxed{42}"]:
        assert env.action_id(text) == env.unrecognised_id


def test_digit_answers_enter_the_vocabulary_from_the_solution():
    program = library_program("code_breaker")
    env = transpile(program.source, program.class_name)
    codes = {t for t in env.action_vocab if t.startswith("\\boxed{") and len(t) == len("\\boxed{1234}")}
    assert len(codes) == 6**4  # every code over digits 1..6
    assert env.action_id("my guess: \\boxed{6543}") == env.action_vocab.index("\\boxed{6543}")


def test_python_state_round_trip_and_rendering():
    program = library_program("modular_lock")
    env = transpile(program.source, program.class_name, fast_compile=True)
    attrs, record = env._jit_reset(jax.random.PRNGKey(3))
    state = env.state_with(attrs, record)
    py = env.python_state(state)
    assert set(py) >= {"dials", "target", "effects", "used", "turn", "done"}
    assert isinstance(py["dials"], list) and all(isinstance(d, int) for d in py["dials"])
    back = env.state_from_python(py)
    for name in env.specs:
        np.testing.assert_array_equal(np.asarray(back.attrs[name]), np.asarray(attrs[name]))
    text = env.render_text(state)
    assert text.startswith("A lock has 3 dials")
    assert f"Dials: {' '.join(str(v) for v in py['dials'])}." in text
    assert isinstance(back, EnvState)


def test_template_is_readable():
    program = library_program("target_number")
    env = transpile(program.source, program.class_name)
    tpl = env.template_text(1)
    assert "Value: {i" in tpl and "Actions: \\boxed{op}" in tpl


def test_state_outside_support_is_rejected():
    program = library_program("target_number")
    env = transpile(program.source, program.class_name)
    py = env.python_state(env.state_with(*env._jit_reset(jax.random.PRNGKey(0))))
    py["value"] = 2**40
    with pytest.raises(ValueError, match="overflows int32"):
        env.state_from_python(py)


@pytest.mark.parametrize(
    "file, reason",
    [
        ("unsupported_step_random.py", "line 13: random draw in step()"),
        ("unsupported_history.py", "line 16: append to a list of the instance in a data-dependent branch"),
    ],
)
def test_unsupported_constructs_name_line_and_construct(file, reason):
    with pytest.raises(UnsupportedProgram) as info:
        transpile((CORPUS / file).read_text())
    assert str(info.value).startswith(reason)


@pytest.mark.parametrize(
    "body, reason",
    [
        ("self.x = None", "attribute self.x is None"),
        ("self.x = {'a': 1} if self.y else {'b': 1}", "line 7: a dict with keys \\['a'\\] on one path and \\['b'\\]"),
        ("self.x = {(1, 2): 1}", "attribute self.x is a dict whose keys are not constant strings or ints"),
        ("raise ValueError('no')", "line 7: raise statement"),
        ("self.x = 0\n        with open('f') as f:\n            pass", "line 8: With statement"),
    ],
)
def test_unsupported_reset_bodies(body, reason):
    source = (
        "import random\n\n"
        "class TinyEnv:\n"
        "    def reset(self, seed=None):\n"
        "        rng = random.Random(seed)\n"
        "        self.y = rng.randint(0, 3)\n"
        f"        {body}\n"
        "        return 'hi', {}\n\n"
        "    def step(self, action):\n"
        "        return 'ok', 0.0, True, False, {}\n"
    )
    with pytest.raises(UnsupportedProgram, match=reason):
        transpile(source)


def test_not_a_class_with_reset_and_step():
    with pytest.raises(UnsupportedProgram, match="no step"):
        transpile("class AEnv:\n    def reset(self, seed=None):\n        return 'x', {}\n")


BRUTE_FORCE = '''
import random

class BruteForceEnv:
    ITEMS = {items}

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.weight = [rng.randint(1, 9) for _ in range(self.ITEMS)]
        self.best = 0
        for mask in range(2**self.ITEMS):
            total = sum(self.weight[i] * ((mask // 2**i) % 2) for i in range(self.ITEMS))
            if total <= 20 and total > self.best:
                self.best = total
        return f"Best {{self.best}}", {{}}

    def step(self, action):
        return "ok", 0.0, True, False, {{}}
'''


def test_a_program_that_unrolls_into_a_huge_graph_is_refused_before_compiling():
    # A retuned knapsack that brute-forces 4096 subsets traced into 221k operations and its
    # compile exhausted 24 GiB; the transpiler now stops at its operation budget instead.
    assert transpile(BRUTE_FORCE.format(items=3)).program is not None
    start = time.perf_counter()
    with pytest.raises(UnsupportedProgram, match="too large to compile"):
        transpile(BRUTE_FORCE.format(items=12))
    assert time.perf_counter() - start < 60


def test_solution_sampling_stops_at_its_evaluation_budget(monkeypatch):
    import spade_jax.envs.backends.jax.env as env_module

    source = library_program("code_breaker").path.read_text()  # ~4k evaluations for 48 samples
    full = transpile(source)._solution_samples()
    monkeypatch.setattr(env_module, "MAX_SAMPLE_EVALS", 1_000)
    few = transpile(source)  # still transpiles, from fewer sampled solutions
    assert 0 < len(few._solution_samples()) < len(full)
