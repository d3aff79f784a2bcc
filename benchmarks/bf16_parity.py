"""Greedy parity and speed of bfloat16 compute against float32 for the agent's turns: the same
prompts (first observations of the library games in the agent's chat format, replies forced to
open with `\\boxed{`), the same sampler, greedy.

    .venv/bin/python benchmarks/bf16_parity.py [--model smollm2-135m-instruct] [--prompts 48] [--repeats 2]

Ours: `model.dtype=bfloat16` (bf16 activations and weights in the matmuls, float32 results and
float32 stored parameters); baseline: float32. Prints the share of replies that are token for
token identical, the share of reply tokens equal position by position, the mean absolute
difference of the chosen tokens' logprobs, and the best time of one generate call on each side.
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import numpy as np

from spade_jax.envs.library import library_programs, load_library_env
from spade_jax.models.registry import load_model
from spade_jax.rollout import AGENT_SYSTEM
from spade_jax.sampling import Sampler, SamplingConfig


def prompts_for(tokenizer, count: int) -> list[list[int]]:
    names = [p.name for p in library_programs()]
    prompts = []
    for i in range(count):
        env = load_library_env(names[i % len(names)])
        obs, _ = env.reset(seed=1000 + i)
        messages = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": obs}]
        prompts.append(tokenizer.encode_chat(messages, add_generation_prompt=True) + tokenizer.encode(
            "\\boxed{", add_special_tokens=False))
    return prompts


def run(model_name: str, dtype, prompts, config, repeats: int):
    loaded = load_model(model_name, dtype=dtype)
    sampler = Sampler(loaded.model, loaded.tokenizer)
    result = sampler.generate(prompts, config, 0)  # compiles
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        result = sampler.generate(prompts, config, 0)
        best = min(best, time.perf_counter() - started)
    return result, best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    tokenizer = load_model(args.model).tokenizer
    prompts = prompts_for(tokenizer, args.prompts)
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, stop_strings=("}",),
                            reuse_prefix=False)
    ours, ours_s = run(args.model, jnp.bfloat16, prompts, config, args.repeats)
    base, base_s = run(args.model, jnp.float32, prompts, config, args.repeats)
    same = [a == b for a, b in zip(ours.tokens, base.tokens)]
    positions = [(x == y) for a, b in zip(ours.tokens, base.tokens) for x, y in zip(a, b)]
    drift = [abs(x - y) for a, b in zip(ours.logprobs, base.logprobs) for x, y in zip(a, b)]
    print(f"{args.model}, {len(prompts)} prompts (library first observations), greedy, {args.max_new_tokens} tokens")
    print("| figure | ours: bf16 | baseline: f32 | ratio |")
    print("|---|---|---|---|")
    print(f"| one generate call (best of {args.repeats}) | {ours_s:.2f} s | {base_s:.2f} s | {base_s / ours_s:.2f}x |")
    print(f"| replies identical to f32 | {np.mean(same):.1%} | 100% | |")
    print(f"| reply tokens equal by position | {np.mean(positions):.1%} | 100% | |")
    print(f"| mean abs logprob difference, same tokens | {np.mean(drift):.4f} | 0 | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
