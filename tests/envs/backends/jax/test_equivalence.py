"""Differential tests: the transpiled environment and the original program agree on every
observation, reward and flag, from the same state under the same action texts."""

import functools
import pathlib

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spade_jax.envs.backends.jax import InProcessProgram, check_equivalence, transpile, try_jax_backend
from spade_jax.envs.library import library_program, library_programs

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"
HEAVY = {"grid_maze", "sliding_puzzle", "odd_one_out", "knapsack", "delivery_route", "switch_lights", "causal_chain",
         "sequence_rule"}


@functools.lru_cache(maxsize=None)
def _library_env(name):
    program = library_program(name)
    return program, transpile(program.source, program.class_name, fast_compile=True)


@pytest.mark.parametrize(
    "name",
    [pytest.param(p.name, marks=pytest.mark.slow) if p.name in HEAVY else p.name for p in library_programs()],
)
def test_library_env_matches_program(name):
    program, env = _library_env(name)
    report = check_equivalence(program.source, program.class_name, n_episodes=8, n_steps=12, env=env, in_process=True)
    assert report.ok, report.summary()
    assert report.steps >= 16


@pytest.mark.parametrize(
    "file",
    ["guess_number.py", "word_match.py", "shop_budget.py", "collatz_while.py",
     pytest.param("lights_out.py", marks=pytest.mark.slow)],
)
def test_corpus_program_matches(file):
    source = (CORPUS / file).read_text()
    report = check_equivalence(source, n_episodes=8, n_steps=12, in_process=True)
    assert report.ok, report.summary()


def _play_both(program, env, key_seed, action_ids):
    python = InProcessProgram(program.source, program.class_name)
    python.reset(seed=key_seed)
    attrs, record = env._jit_reset(jax.random.PRNGKey(key_seed))
    python.set_attrs(env.python_state(env.state_with(attrs, record)))
    for action_id in action_ids:
        text = env.action_vocab[action_id % len(env.action_vocab)]
        p_obs, p_rew, p_term, p_trunc, _ = python.step(text)
        attrs, record, rew, term, trunc = env._jit_step(attrs, np.int32(env.action_id(text)))
        assert env.render_text(record) == p_obs
        assert float(rew) == pytest.approx(p_rew, abs=1e-6)
        assert (bool(term), bool(trunc)) == (p_term, p_trunc)
        if p_term or p_trunc:
            break


@pytest.mark.parametrize("name", ["target_number", "knights_knaves", "code_breaker"])
def test_hypothesis_action_sequences(name):
    program, env = _library_env(name)

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=st.integers(0, 2**31 - 1), actions=st.lists(st.integers(0, 10_000), min_size=1, max_size=14))
    def check(seed, actions):
        _play_both(program, env, seed, actions)

    check()


def test_hypothesis_from_python_reset():
    """Reverse direction: the program's own reset state (Python's random stream) loads into JAX;
    the reset distributions share their support, so every such state is representable."""
    program, env = _library_env("modular_lock")

    @settings(max_examples=20, deadline=None)
    @given(seed=st.integers(0, 10**6), actions=st.lists(st.sampled_from(range(5)), min_size=1, max_size=10))
    def check(seed, actions):
        python = InProcessProgram(program.source, program.class_name)
        python.reset(seed=seed)
        state = env.state_from_python(python.get_attrs())
        attrs = state.attrs
        for a in actions:
            text = env.action_vocab[a % len(env.action_vocab)]
            p = python.step(text)
            attrs, record, rew, term, trunc = env._jit_step(attrs, np.int32(env.action_id(text)))
            assert env.render_text(record) == p[0]
            if p[2] or p[3]:
                break

    check()


def test_try_jax_backend_reports_reasons():
    env, reason = try_jax_backend((CORPUS / "unsupported_step_random.py").read_text(), in_process=True)
    assert env is None and reason.startswith("line 13: random draw in step()")
    program = library_program("target_number")
    env, reason = try_jax_backend(program.source, program.class_name, in_process=True, n_episodes=2, n_steps=4)
    assert reason is None and env.name == "TargetNumberEnv"


def test_mismatch_is_reported():
    # A float rendered at full precision differs between float32 (device) and float64 (Python).
    source = (
        "import random\n\n"
        "class ThirdEnv:\n"
        "    def reset(self, seed=None):\n"
        "        rng = random.Random(seed)\n"
        "        self.n = rng.randint(1, 5)\n"
        "        return 'go', {}\n\n"
        "    def step(self, action):\n"
        "        return f'{self.n / 3}', 0.0, True, False, {}\n"
    )
    report = check_equivalence(source, n_episodes=2, n_steps=2, in_process=True)
    assert not report.ok and "observation differs" in report.mismatches[0]
