"""Episodes per second of the device loop (`rollout.play_episodes_device`: whole episodes in one
compiled loop) against the host loop (`rollout.play_episodes` over `text_env()` instances with a
`Sampler` generate), same transpiled environment, model, batch, greedy decoding, same machine.

    .venv/bin/python benchmarks/rollout.py [--model tiny|smollm2-135m-instruct] [--env odd_one_out]
        [--batch 16] [--turns 6] [--max-new-tokens 32] [--repeats 3] [--cache-windows 4]

Compile time is reported apart: the first call of each loop, timed alone. The tiny model is the
`tiny` preset with its context raised to 8192 positions (random weights: replies never end early,
so every episode plays all its turns in both loops).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax

from spade_jax import roles
from spade_jax.envs.backends.jax import transpile
from spade_jax.envs.library import library_program
from spade_jax.rollout import DeviceRollout, Generation, RolloutConfig, play_episodes
from spade_jax.sampling import Sampler, SamplingConfig


def load(name: str):
    if name == "tiny":
        from spade_jax.models.presets import get_preset, init_decoder
        from spade_jax.models.tokenizer import byte_tokenizer

        spec = dataclasses.replace(get_preset("tiny"), max_position=8192)
        return init_decoder(spec, seed=0), byte_tokenizer(eos_token_ids=spec.eos_token_ids)
    from spade_jax.models.registry import load_model

    loaded = load_model(name)
    return loaded.model, loaded.tokenizer


def host_episodes(env, model, tokenizer, sampling, rollout, seeds):
    sampler = Sampler(model, tokenizer)

    def generate(prompts):
        result = sampler.generate(prompts, sampling, 0)
        return [Generation(t, lp, r) for t, lp, r in zip(result.tokens, result.logprobs, result.finish_reasons)]

    return play_episodes([env.text_env() for _ in seeds], seeds, generate, tokenizer, rollout,
                         format_observation=roles.with_hint)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--env", default="odd_one_out")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-windows", type=int, default=4, help="compiled attention windows (1: fastest compile)")
    args = parser.parse_args()

    program = library_program(args.env)
    env = transpile(program.source, program.class_name)
    model, tokenizer = load(args.model)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    rollout = RolloutConfig(max_turns=args.turns, max_context_tokens=8192 - 2048)
    print(f"env {args.env}, model {args.model}, batch {args.batch}, {args.turns} turns, "
          f"{args.max_new_tokens} new tokens per turn, greedy; {jax.devices()[0].platform}")

    runner = DeviceRollout(env, model, tokenizer, sampling, rollout, cache_windows=args.cache_windows)
    seeds = list(range(args.batch))
    _, device_first = timed(lambda: runner.play(seeds, 0))
    _, host_first = timed(lambda: host_episodes(env, model, tokenizer, sampling, rollout, seeds))
    device_best = host_best = float("inf")
    steps = 0
    for r in range(args.repeats):
        seeds = [1000 * (r + 1) + i for i in range(args.batch)]
        device, t = timed(lambda seeds=seeds: runner.play(seeds, 0))
        device_best = min(device_best, t)
        host, t = timed(lambda seeds=seeds: host_episodes(env, model, tokenizer, sampling, rollout, seeds))
        host_best = min(host_best, t)
        steps = sum(len(tr.actions) for tr in device)
        same = sum(h.tokens == d.tokens for h, d in zip(host, device))
    print(f"device loop: first call (trace + compile + run) {device_first:.1f}s; "
          f"compile ~{device_first - device_best:.1f}s")
    print(f"host loop:   first call (sampler compiles per prompt bucket + run) {host_first:.1f}s")
    print(f"{steps} env steps per batch; identical token streams in the last repeat: {same}/{args.batch}")
    ours, baseline = args.batch / device_best, args.batch / host_best
    print(f"device loop (ours):      {ours:8.2f} episodes/s  ({device_best:.2f}s per batch, best of {args.repeats})")
    print(f"host loop (baseline):    {baseline:8.2f} episodes/s  ({host_best:.2f}s per batch)")
    print(f"ratio: {ours / baseline:.1f}x (target >= 5x)")


if __name__ == "__main__":
    main()
