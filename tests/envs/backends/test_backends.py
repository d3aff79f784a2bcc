"""Tests of spade_jax.envs.backends: backend choice, fallback to the sandbox with a reason."""

import pytest

import spade_jax.envs.backends.jax.env as jax_env
import spade_jax.envs.backends.jax.equivalence as jax_equivalence
from spade_jax.envs.backends import compile_env, select_backend
from spade_jax.envs.backends.jax.ir import UnsupportedProgram
from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool
from spade_jax.envs.program import ProgramError

PROGRAM = (
    "class EchoEnv:\n    def reset(self, seed=None):\n        self.seed = seed\n        return f'seed {seed}', {}\n"
    "    def step(self, action):\n        return action[:10], 0.0, True, False, {}\n"
)


def fake_transpiler(monkeypatch, behaviour):
    """The JAX backend's transpiler replaced by one that fails as told or gives a stub environment
    (whose equivalence check is skipped)."""

    class Transpiled:
        def text_env(self):
            return "jax-text-env"

    def transpile(source, class_name):
        if behaviour == "unsupported":
            raise UnsupportedProgram("while loops are outside the subset")
        if behaviour == "broken":
            raise RuntimeError("transpiler bug")
        return Transpiled()

    monkeypatch.setattr(jax_env, "transpile", transpile)
    monkeypatch.setattr(jax_equivalence, "verify_equivalence", lambda *args, **kwargs: None)


@pytest.fixture
def pool():
    with SandboxPool(SandboxConfig(workers=0, call_timeout_s=5.0)) as p:
        yield p


def test_sandbox_backend_runs_the_program(pool):
    compiled = compile_env(PROGRAM, backend="sandbox", pool=pool)
    assert compiled.backend == "sandbox" and compiled.class_name == "EchoEnv" and compiled.fallback_reason is None
    env = compiled.make()
    try:
        assert env.reset(seed=3) == ("seed 3", {})
        assert env.step("hello world!")[0] == "hello worl"
    finally:
        env.close()


@pytest.mark.parametrize(
    "behaviour, reason",
    [("unsupported", "outside the JAX subset: while loops"), ("broken", "JAX transpiler failed (RuntimeError")],
)
def test_auto_falls_back_with_reason(monkeypatch, pool, behaviour, reason):
    fake_transpiler(monkeypatch, behaviour)
    compiled = compile_env(PROGRAM, backend="auto", pool=pool)
    assert compiled.backend == "sandbox"
    assert compiled.fallback_reason.startswith(reason)
    assert select_backend(PROGRAM, "EchoEnv")[0] == "sandbox"
    with pytest.raises(ValueError, match="JAX backend cannot run EchoEnv"):
        compile_env(PROGRAM, backend="jax", pool=pool)


def test_auto_takes_jax_when_transpile_succeeds(monkeypatch):
    fake_transpiler(monkeypatch, "ok")
    compiled = compile_env(PROGRAM)
    assert compiled.backend == "jax" and compiled.make() == "jax-text-env"
    assert select_backend(PROGRAM, "EchoEnv") == ("jax", None)


def test_program_errors_raise():
    with pytest.raises(ProgramError, match="import of 'requests'"):
        compile_env("import requests\n" + PROGRAM, backend="sandbox")
    with pytest.raises(ValueError, match="backend"):
        compile_env(PROGRAM, backend="tpu")
