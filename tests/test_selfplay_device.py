"""`play_loop=device` in self-play: JAX-backend environments are played in the compiled device loop
and give the same trajectories as the host loop (greedy decoding); sandboxed ones stay on the host."""

import hashlib
import types

import pytest

from spade_jax.config import load_config
from spade_jax.envs.backends import compile_env
from spade_jax.envs.backends.sandbox import SandboxPool
from spade_jax.envs.library import library_program
from spade_jax.models.registry import load_model
from spade_jax.policy import Policy
from spade_jax.selfplay import PoolEnv, SelfPlay, env_error_metrics

OVERRIDES = ["agent_sampling.temperature=0", "agent_sampling.max_new_tokens=6", "group_size=2",
             "rollout.max_turns=2",
             # The device loop reads whole replies: no forced prefix, no host-side stop strings.
             "rollout.reply_prefix=", "agent_sampling.stop_strings=[]"]


@pytest.fixture(scope="module")
def parts():
    loaded = load_model("tiny", seed=0)
    pool = SandboxPool(load_config("tiny").sandbox)
    yield Policy(loaded.model, loaded.tokenizer), types.SimpleNamespace(sandbox=pool)
    pool.close()


def _played(play_loop, parts, backends):
    policy, learner = parts
    selfplay = SelfPlay(load_config("tiny", [*OVERRIDES, f"play_loop={play_loop}"]), policy, learner, None, None)
    for name, backend in backends:
        program = library_program(name)
        env = PoolEnv(f"lib-{name}", program.skill, "library", program.source, True, hint="think first")
        # The backend each program gets is fixed here (auto would pick jax for both library programs).
        selfplay._compiled[hashlib.sha256(env.source.encode()).hexdigest()] = compile_env(
            env.source, backend, pool=learner.sandbox)
        selfplay.pool.append(env)
    return sorted(selfplay.play(hinted=True), key=lambda t: (t.group, t.tokens))


@pytest.mark.slow
def test_device_loop_plays_jax_envs_like_the_host_loop(parts):
    backends = [("odd_one_out", "jax"), ("knapsack", "sandbox")]
    device = _played("device", parts, backends)
    host = _played("host", parts, backends)
    assert len(device) == len(host) == 8  # 2 envs x 2 arms x G=2
    assert [t.group for t in device] == [t.group for t in host]
    for a, b in zip(device, host):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        assert a.rewards == b.rewards and a.actions == b.actions
    # JAX environments cannot fail at play time; the failure counts are there, at 0.
    assert env_error_metrics(device) == {"agent/env_errors": 0, "agent/env_errors/exception": 0,
                                         "agent/env_errors/timeout": 0, "agent/env_errors/sandbox_died": 0}
