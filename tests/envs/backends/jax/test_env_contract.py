"""gymnax-style contract of a transpiled environment: jit, vmap over 1024 instances, auto-reset,
determinism per key, params split from state, host TextEnv wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.envs.api import TextEnv
from spade_jax.envs.backends.jax import EnvParams, transpile
from spade_jax.envs.library import library_program


@pytest.fixture(scope="module")
def env():
    program = library_program("target_number")
    return transpile(program.source, program.class_name, fast_compile=True)


def test_reset_and_step_are_jittable_and_pure(env):
    params = env.default_params
    key = jax.random.PRNGKey(0)
    obs, state = jax.jit(env.reset_env)(key, params)
    step = jax.jit(env.step_env)
    out1 = step(key, state, jnp.int32(0), params)
    out2 = step(key, state, jnp.int32(0), params)
    for a, b in zip(jax.tree.leaves(out1), jax.tree.leaves(out2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The input state is untouched (pure function of its arguments).
    obs_again, state_again = jax.jit(env.reset_env)(key, params)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state_again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vmap_over_1024_instances(env):
    params = env.default_params
    keys = jax.random.split(jax.random.PRNGKey(1), 1024)
    obs, state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, params)
    assert state.attrs["value"].shape == (1024,)
    actions = jax.random.randint(jax.random.PRNGKey(2), (1024,), 0, env.num_actions)
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    obs, state, reward, terminated, truncated, info = step(keys, state, actions, params)
    assert reward.shape == terminated.shape == (1024,)
    assert reward.dtype == jnp.float32 and terminated.dtype == jnp.bool_
    # Different keys draw different episodes; each instance renders like a single one.
    assert len(np.unique(np.asarray(state.attrs["target"]))) > 10
    for i in (0, 17, 1023):
        single = jax.tree.map(lambda x: x[i], obs)  # noqa: B023 (called within this iteration)
        state_i = jax.tree.map(lambda x: x[i], state)  # noqa: B023 (called within this iteration)
        assert env.render_text(single) == env.render_text(state_i)


def test_determinism_per_key(env):
    params = env.default_params
    _, s1 = env.reset(jax.random.PRNGKey(7), params)
    _, s2 = env.reset(jax.random.PRNGKey(7), params)
    _, s3 = env.reset(jax.random.PRNGKey(8), params)
    assert env.python_state(s1) == env.python_state(s2)
    starts = {env.python_state(env.reset(jax.random.PRNGKey(k), params)[1])["start"] for k in range(20)}
    assert len(starts) > 1
    del s3


def test_auto_reset_on_termination(env):
    params = env.default_params
    key = jax.random.PRNGKey(3)
    obs, state = env.reset(key, params)
    bad = env.unrecognised_id
    # Invalid actions waste turns until the program truncates at MAX_TURNS = 12.
    for t in range(12):
        key, sub = jax.random.split(key)
        obs, state, reward, terminated, truncated, info = env.step(sub, state, bad, params)
        if t < 11:
            assert not bool(truncated) and int(state.time) == t + 1
    assert bool(truncated) and not bool(terminated)
    assert "Out of turns." in env.render_text(info["final_observation"])
    # The returned state is a fresh episode.
    assert int(state.time) == 0 and env.python_state(state)["turn"] == 0
    assert env.render_text(obs).startswith("Turn the value")


def test_params_time_limit_truncates(env):
    params = EnvParams(max_steps_in_episode=2)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    _, state, _, _, truncated, _ = env.step(jax.random.PRNGKey(1), state, 0, params)
    assert not bool(truncated)
    _, state, _, _, truncated, _ = env.step(jax.random.PRNGKey(2), state, 0, params)
    assert bool(truncated) and int(state.time) == 0


def test_action_space_and_clipping(env):
    assert env.action_space(env.default_params).n == env.num_actions == len(env.action_vocab)
    obs, state = env.reset(jax.random.PRNGKey(0), env.default_params)
    far = env.step_env(jax.random.PRNGKey(0), state, 10_000, env.default_params)
    last = env.step_env(jax.random.PRNGKey(0), state, env.unrecognised_id, env.default_params)
    assert env.render_text(far[0]) == env.render_text(last[0])


def test_text_env_wrapper(env):
    text_env = env.text_env(seed=5)
    assert isinstance(text_env, TextEnv)
    obs, info = text_env.reset(5)
    assert obs.startswith("Turn the value") and info["backend"] == "jax"
    obs2, _ = text_env.reset(5)
    assert obs2 == obs
    obs, reward, terminated, truncated, info = text_env.step("Let me add: \\boxed{add}")
    assert obs.startswith("add: ") and isinstance(reward, float)
    assert info["action_id"] == 0
    obs, *_ = text_env.step("hmm")
    assert obs.startswith("Invalid action (turn lost)")
