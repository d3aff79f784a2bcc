"""Device token buffers decode to exactly the host-rendered observation text."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.envs.backends.jax import transpile
from spade_jax.envs.backends.jax.tokens import ObservationTokens
from spade_jax.envs.library import library_program
from spade_jax.models.tokenizer import byte_tokenizer


@pytest.fixture(scope="module")
def lock_env():
    program = library_program("modular_lock")
    return transpile(program.source, program.class_name, fast_compile=True)


@pytest.fixture(scope="module")
def odd_env():
    program = library_program("odd_one_out")
    return transpile(program.source, program.class_name, fast_compile=True)


def test_token_buffer_decodes_to_rendered_text(lock_env):
    env, tok = lock_env, byte_tokenizer()
    render = jax.jit(jax.vmap(env.token_renderer(tok, 2048)))
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env.default_params)
    actions = jnp.array([0, 1, 2, 3, env.unrecognised_id, 0])
    step_obs, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, actions, env.default_params)
    for batch in (obs, step_obs):
        tokens, lengths = render(batch)
        assert tokens.shape == (6, 2048) and tokens.dtype == jnp.int32
        for i in range(6):
            one = jax.tree.map(lambda x: x[i], batch)  # noqa: B023 (called within this iteration)
            text = env.render_text(one)
            assert tok.decode(np.asarray(tokens[i, : int(lengths[i])]).tolist()) == text
            assert int(lengths[i]) == len(text.encode())  # byte tokenizer: one token per byte


def test_numbers_render_with_sign_and_width():
    source = (
        "import random\n\n"
        "class NumEnv:\n"
        "    def reset(self, seed=None):\n"
        "        rng = random.Random(seed)\n"
        "        self.a = rng.randint(-2000000000, 2000000000)\n"
        "        self.b = rng.randint(-9, 9)\n"
        "        self.f = rng.uniform(-50.0, 50.0)\n"
        "        return f'{self.a}|{self.b:4d}|{self.f:.2f}|{self.b:>3}|0', {}\n\n"
        "    def step(self, action):\n"
        "        return 'x', 0.0, True, False, {}\n"
    )
    env = transpile(source, fast_compile=True)
    tok = byte_tokenizer()
    render = jax.jit(jax.vmap(env.token_renderer(tok, 128)))
    keys = jax.random.split(jax.random.PRNGKey(3), 64)
    obs, _ = jax.vmap(env.reset, in_axes=(0, None))(keys, env.default_params)
    tokens, lengths = render(obs)
    for i in range(64):
        text = env.render_text(jax.tree.map(lambda x: x[i], obs))  # noqa: B023 (called within this iteration)
        assert tok.decode(np.asarray(tokens[i, : int(lengths[i])]).tolist()) == text


def test_buffer_is_cut_at_max_tokens(lock_env):
    tok = byte_tokenizer()
    obs, _ = lock_env.reset(jax.random.PRNGKey(0), lock_env.default_params)
    tokens, length = jax.jit(lock_env.token_renderer(tok, max_tokens=16))(obs)
    text = lock_env.render_text(obs)
    assert int(length) == 16 and tok.decode(np.asarray(tokens).tolist()) == text.encode()[:16].decode()


def test_unsupported_float_format_is_named():
    source = (
        "import random\n\n"
        "class FEnv:\n"
        "    def reset(self, seed=None):\n"
        "        self.f = random.Random(seed).random()\n"
        "        return f'{self.f}', {}\n\n"
        "    def step(self, action):\n"
        "        return 'x', 0.0, True, False, {}\n"
    )
    env = transpile(source)
    with pytest.raises(ValueError, match="floats formatted with '.Nf'"):
        env.token_renderer(byte_tokenizer(), 64)


def test_observation_tokens_decode_to_the_rendered_text(odd_env):
    tokenizer = byte_tokenizer()
    renderers = [ObservationTokens(odd_env, tokenizer, kind) for kind in (0, 1)]
    keys = jax.random.split(jax.random.PRNGKey(5), 12)
    records, states = jax.vmap(odd_env.reset_env, in_axes=(0, None))(keys, odd_env.default_params)
    rng = np.random.default_rng(0)
    step = jax.jit(jax.vmap(lambda k, s, a: odd_env.step_env(k, s, a, odd_env.default_params)[:2]),
                   compiler_options=odd_env.compiler_options)
    for kind in (0, 1, 1, 1):
        if kind == 1:
            records, states = step(keys, states, jnp.asarray(rng.integers(0, odd_env.num_actions, 12), jnp.int32))
        tokens, lengths = jax.jit(jax.vmap(renderers[kind]))(records)
        for row in range(12):
            text = odd_env.render_text(jax.tree.map(lambda x, row=row: x[row], records))
            assert tokenizer.decode(np.asarray(tokens[row, : int(lengths[row])]).tolist()) == text
            assert int(lengths[row]) <= renderers[kind].bound
