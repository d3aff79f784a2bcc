"""How the embedded agent plays the library's games with its replies forced to open with `\\boxed{`
and stopped at `}` (ours: the `default` config) against free replies (baseline: SPADE's format,
a system line asking for one `\\boxed{...}` action), same model, games and seeds.

    .venv/bin/python benchmarks/agent_format.py [--model smollm2-135m-instruct] [--episodes 4]
        [--turns 12] [--temperatures 0.7,1.0] [--free-tokens 64] [--forced-tokens 16]

Every library game is played `--episodes` times per arm and temperature by `rollout.play_episodes`
with our sampler, as self-play plays them. Per arm: the share of replies holding a complete
`\\boxed{...}` action, the share of actions the game accepted (its observation does not start with
the library's "Invalid action"), the share of games won, and the wall time (compiles included).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
from rollout import load  # benchmarks/rollout.py: the same tiny-or-named model loader

from spade_jax import roles
from spade_jax.envs.api import extract_boxed
from spade_jax.envs.library import library_programs, load_library_env
from spade_jax.rollout import RolloutConfig, play_episodes
from spade_jax.sampling import Sampler, SamplingConfig
from spade_jax.selfplay import generations_of


def play_arm(model, tokenizer, names, episodes, rollout, sampling, seed):
    sampler = Sampler(model, tokenizer)
    calls = iter(range(1 << 30))

    def generate(prompts):
        return generations_of(sampler.generate(prompts, sampling, jax.random.key(seed + next(calls))))

    envs = [load_library_env(name) for name in names for _ in range(episodes)]
    seeds = [1000 + i for i in range(len(envs))]
    t0 = time.perf_counter()
    trajectories = play_episodes(envs, seeds, generate, tokenizer, rollout, format_observation=roles.with_hint)
    seconds = time.perf_counter() - t0
    replies = [a for t in trajectories for a in t.actions]
    # observations[k + 1] answers actions[k]; an episode that ended has no reply after its last one.
    answers = [o for t in trajectories for o in t.observations[1 : len(t.actions) + 1]]
    return {
        "replies": len(replies),
        "boxed": sum(extract_boxed(a) is not None for a in replies) / max(len(replies), 1),
        "accepted": sum(not o.startswith("Invalid action") for o in answers) / max(len(answers), 1),
        "won": sum(t.won for t in trajectories) / len(trajectories),
        "episodes": len(trajectories),
        "seconds": seconds,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=4, help="plays of each library game per arm")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--free-tokens", type=int, default=64, help="reply budget of the free arm")
    parser.add_argument("--forced-tokens", type=int, default=16, help="reply budget of the forced arm")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model, tokenizer = load(args.model)
    names = [p.name for p in library_programs()]
    print(f"model {args.model}; {len(names)} library games x {args.episodes} episodes per arm, up to "
          f"{args.turns} turns; {jax.devices()[0].platform}, load average {os.getloadavg()[0]:.1f}")
    base = RolloutConfig(max_turns=args.turns, max_context_tokens=2048, system_prompt=roles.AGENT_SYSTEM)
    arms = {
        "forced \\boxed{ (ours)": (dataclasses.replace(base, reply_prefix="\\boxed{"),
                                   dict(max_new_tokens=args.forced_tokens, stop_strings=("}",))),
        "free reply (baseline)": (base, dict(max_new_tokens=args.free_tokens)),
    }
    print(f"{'arm':24s} {'temp':>5s} {'replies':>8s} {'boxed':>7s} {'accepted':>9s} {'won':>6s} {'seconds':>8s}")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        won = {}
        for name, (rollout, knobs) in arms.items():
            sampling = SamplingConfig(temperature=temperature, **knobs)
            r = play_arm(model, tokenizer, names, args.episodes, rollout, sampling, args.seed)
            won[name] = r["won"]
            print(f"{name:24s} {temperature:5.2f} {r['replies']:8d} {r['boxed']:7.1%} {r['accepted']:9.1%} "
                  f"{r['won']:6.1%} {r['seconds']:8.1f}", flush=True)
        ours, baseline = won.values()
        ratio = f"{ours / baseline:.2f}x" if baseline else ("inf" if ours else "n/a (both 0)")
        print(f"win rate ratio at temperature {temperature}: {ratio}")


if __name__ == "__main__":
    main()
