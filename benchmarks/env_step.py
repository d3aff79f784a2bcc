"""Steps per second of one transpiled environment, vmapped over 4096 instances under jit, against
the same program stepped in the sandbox pool and in plain in-process Python (same machine).

    .venv/bin/python benchmarks/env_step.py [--env modular_lock] [--batch 4096] [--steps 64]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from spade_jax.envs.backends.jax import InProcessProgram, transpile
from spade_jax.envs.library import library_program


def jax_steps_per_second(env, batch: int, steps: int, repeats: int = 3, auto_reset: bool = True) -> float:
    params = env.default_params

    @jax.jit
    def rollout(key, state):
        def body(carry, key_t):
            state = carry
            k_act, k_step = jax.random.split(key_t)
            actions = jax.random.randint(k_act, (batch,), 0, env.num_actions)
            keys = jax.random.split(k_step, batch)
            if auto_reset:  # gymnax's step: also computes a fresh reset for every instance
                _, state, reward, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, actions, params)
            else:  # the program's own "episode is over" branch handles finished instances
                _, state, reward, *_ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(keys, state, actions, params)
            return state, reward.sum()
        state, rewards = jax.lax.scan(body, state, jax.random.split(key, steps))
        return state, rewards.sum()

    keys = jax.random.split(jax.random.PRNGKey(0), batch)
    _, state = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, params)
    t0 = time.perf_counter()
    jax.block_until_ready(rollout(jax.random.PRNGKey(1), state))
    print(f"  jax: compile + first rollout {time.perf_counter() - t0:.1f}s")
    best = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(rollout(jax.random.PRNGKey(2 + r), state))
        best = min(best, time.perf_counter() - t0)
    return batch * steps / best


def python_steps_per_second(stepper_factory, vocab, seconds: float) -> float:
    rng = np.random.default_rng(0)
    env = stepper_factory()
    env.reset(seed=0)
    n, seed = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, terminated, truncated, _ = env.step(vocab[int(rng.integers(len(vocab)))])
        n += 1
        if terminated or truncated:
            seed += 1
            env.reset(seed=seed)
    elapsed = time.perf_counter() - t0
    env.close()
    return n / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="modular_lock", help="library environment name")
    parser.add_argument("--batch", type=int, default=4096, help="instances vmapped under jit")
    parser.add_argument("--steps", type=int, default=64, help="steps per timed rollout (lax.scan)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing window of the Python baselines")
    args = parser.parse_args()

    program = library_program(args.env)
    env = transpile(program.source, program.class_name)
    print(f"{program.class_name}: {len(env.action_vocab)} actions, devices {jax.devices()}")

    jax_sps = jax_steps_per_second(env, args.batch, args.steps)
    print(f"jax (jit + vmap x{args.batch}, gymnax step with auto-reset): {jax_sps:,.0f} steps/s")
    plain_sps = jax_steps_per_second(env, args.batch, args.steps, auto_reset=False)
    print(f"jax (jit + vmap x{args.batch}, step_env without auto-reset): {plain_sps:,.0f} steps/s")

    inproc = python_steps_per_second(lambda: InProcessProgram(program.source, program.class_name), env.action_vocab,
                                     args.seconds)
    print(f"in-process Python: {inproc:,.0f} steps/s")

    sandbox = None
    try:
        from spade_jax.envs.backends.sandbox import SandboxPool

        pool = SandboxPool()
        try:
            sandbox = python_steps_per_second(lambda: pool.load(program.source, program.class_name), env.action_vocab,
                                              args.seconds)
        finally:
            pool.close()
        print(f"sandbox pool (one worker, RPC per step): {sandbox:,.0f} steps/s")
    except Exception as exc:  # no isolation on this host: report what we could measure
        print(f"sandbox pool: unavailable ({type(exc).__name__}: {exc})")

    print(f"ratio jax / in-process Python: {jax_sps / inproc:,.1f}x")
    if sandbox:
        print(
            f"ratio jax / sandbox pool: {jax_sps / sandbox:,.1f}x (auto-reset), {plain_sps / sandbox:,.1f}x (step_env)"
        )


if __name__ == "__main__":
    main()
