"""Environment failures during play are told apart by kind."""

from spade_jax.rollout import ENV_ERROR_KINDS, classify_env_error


def test_env_errors_are_classified_by_kind():
    from spade_jax.envs.backends.sandbox import EnvCrashed, EnvError, EnvTimeout, SandboxError

    assert classify_env_error(EnvTimeout("step() did not return")) == "timeout"
    assert classify_env_error(TimeoutError()) == "timeout"
    assert classify_env_error(EnvCrashed("exited with code 3")) == "sandbox_died"
    assert classify_env_error(SandboxError("sandbox worker failed to start")) == "sandbox_died"
    assert classify_env_error(EnvError("step() raised ValueError")) == "exception"
    assert classify_env_error(KeyError("x")) == "exception"
    assert set(ENV_ERROR_KINDS) == {"exception", "timeout", "sandbox_died"}
