"""Tests of spade_jax.envs.validate on the corpus: good programs pass, each broken one fails at
its expected check with a one-line learnable message, within bounded time."""

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sandbox_helpers sits next to this file
from sandbox_helpers import corpus_files, expectation

from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool
from spade_jax.envs.program import extract_code
from spade_jax.envs.validate import CHECKS, ValidationConfig, Verdict, plan_to_actions, validate

# Short limits keep the infinite loops cheap; the reference budgets are the defaults.
FAST = ValidationConfig(step_timeout_s=2.0, budget_s=20.0)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(SandboxConfig(workers=2, call_timeout_s=2.0, load_timeout_s=2.0)) as p:
        yield p


def _source(path):
    text = path.read_text()
    return extract_code(text) if path.suffix == ".md" else text


@pytest.mark.parametrize("path", corpus_files("good"), ids=lambda p: p.name)
def test_good_programs_are_valid(path, pool):
    verdict = validate(_source(path), config=FAST, pool=pool, backend="sandbox")
    assert verdict.valid, verdict.errors
    assert verdict.errors == [] and verdict.backend == "sandbox"
    assert all(check["ok"] in (True, None) for check in verdict.checks.values())
    expected_solvable = {"solvable": True, "unknown": None}[expectation(path)[1]]
    assert verdict.solvable is expected_solvable


@pytest.mark.parametrize("path", corpus_files("broken"), ids=lambda p: p.name)
def test_broken_programs_fail_at_the_expected_check(path, pool):
    kind, check = expectation(path)
    assert kind == "invalid"
    start = time.monotonic()
    verdict = validate(_source(path), config=FAST, pool=pool, backend="sandbox")
    elapsed = time.monotonic() - start
    assert not verdict.valid
    assert verdict.checks[check]["ok"] is False, verdict.checks
    assert len(verdict.errors) == 1 and verdict.errors[0].startswith(f"{check}: ")
    message = verdict.errors[0]
    assert "\n" not in message and 20 < len(message) < 700
    assert "Traceback" not in message
    # Checks before the failing one passed; the ones after were skipped.
    order = list(CHECKS)
    for name in order[: order.index(check)]:
        assert verdict.checks[name]["ok"] in (True, None), (name, verdict.checks[name])
    for name in order[order.index(check) + 1 :]:
        assert verdict.checks[name]["ok"] is None
    assert elapsed < FAST.budget_s + 15


def test_library_programs_are_valid_and_solvable(pool):
    from spade_jax.envs.library import library_programs

    programs = library_programs()
    assert len(programs) >= 1
    for program in programs:
        verdict = validate(program.source, config=FAST, pool=pool, backend="sandbox")
        assert verdict.valid, (program.name, verdict.errors)
        assert verdict.class_name == program.class_name
        assert verdict.solvable is True, program.name


def test_verdict_json_shape(pool):
    path = corpus_files("good")[0]
    verdict = validate(_source(path), config=FAST, pool=pool, backend="sandbox")
    data = json.loads(verdict.to_json())
    assert set(data) >= {"valid", "backend", "errors", "checks", "solvable", "class_name", "isolation", "seconds"}
    assert list(data["checks"]) == list(CHECKS)
    assert data["isolation"]["backend"] == pool.backend
    assert isinstance(verdict, Verdict)


def test_validate_without_a_pool_makes_its_own():
    source = _source(corpus_files("good")[0])
    verdict = validate(source, config=FAST, backend="sandbox")
    assert verdict.valid, verdict.errors


def test_budget_bounds_the_whole_validation(pool):
    source = (
        "import time\nclass SlowEnv:\n    def reset(self, seed=None):\n        time.sleep(0.4)\n"
        "        return 'x', {}\n    def step(self, a):\n        return 'x', 0.0, True, False, {}\n"
    )
    verdict = validate(source, config=ValidationConfig(budget_s=1.0, step_timeout_s=5.0), pool=pool, backend="sandbox")
    assert not verdict.valid
    assert "budget" in verdict.errors[0]
    assert verdict.seconds < 5


def test_declared_turn_limit_is_used(pool):
    source = (
        "class ShortEnv:\n    max_turns = 3\n"
        "    def reset(self, seed=None):\n        self.t = 0\n        return 'go', {}\n"
        "    def step(self, a):\n        self.t += 1\n        return 'x', 0.0, False, self.t >= 4, {}\n"
    )
    verdict = validate(source, config=FAST, pool=pool, backend="sandbox")
    assert not verdict.valid and verdict.checks["episode_length"]["ok"] is False
    assert "within 3 steps" in verdict.errors[0]
    assert verdict.max_turns == 3


@pytest.mark.parametrize(
    "plan, actions",
    [
        (["\\boxed{up}", "left"], ["\\boxed{up}", "\\boxed{left}"]),
        ("\\boxed{1} then \\boxed{2}", ["\\boxed{1}", "\\boxed{2}"]),
        ("\\boxed{\\frac{1}{2}}", ["\\boxed{\\frac{1}{2}}"]),
        (" 42 ", ["\\boxed{42}"]),
    ],
)
def test_plan_to_actions(plan, actions):
    assert plan_to_actions(plan) == actions


def test_config_validation():
    with pytest.raises(ValueError, match="seeds"):
        ValidationConfig(seeds=())
    with pytest.raises(ValueError, match="win_threshold"):
        ValidationConfig(win_threshold=2.0)
    with pytest.raises(ValueError, match="backend"):
        validate("x = 1", backend="gpu")
