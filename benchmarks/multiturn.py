"""Episodes per second of the host loop (`rollout.play_episodes`, one `Sampler.generate` per turn over
every live conversation) with the Sampler's defaults (ours: cross-call prefix reuse; `--ours KEY=VALUE`
sets `SamplingConfig` fields) against a baseline setting (by default reuse off: each turn re-prefills the
whole conversation; `--baseline KEY=VALUE` sets others), same model, environment, seeds and draws.

    .venv/bin/python benchmarks/multiturn.py [--model smollm2-135m-instruct|tiny] [--env odd_one_out]
        [--batch 16] [--group 1] [--turns 6] [--max-new-tokens 32] [--temperature 0] [--repeats 2]
        [--ours KEY=VALUE ...] [--baseline KEY=VALUE ...]

`--group N`: N consecutive conversations play one instance (one seed), as a GRPO group of
`group_instances: shared` does, so they open with the same prompt; `--temperature T` samples (one fixed
key per call on both sides, so a side's plays repeat exactly) where the default decodes greedily.

Each side first plays the same seeds once untimed (its compiles: prefill buckets for the baseline,
extend/grow programs for reuse), then `--repeats` timed plays; greedy decoding (or the fixed key when
sampling) makes every play of a side identical, so the timed plays compile nothing. The figure is the
best repeat.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import yaml
from rollout import load  # benchmarks/rollout.py: the same tiny-or-named model loader

from spade_jax import roles
from spade_jax.envs.library import load_library_env
from spade_jax.rollout import RolloutConfig, play_episodes
from spade_jax.sampling import Sampler, SamplingConfig
from spade_jax.selfplay import generations_of


class Counted:
    """A play_episodes generate function over one Sampler that tallies prompt tokens fed vs reused."""

    def __init__(self, sampler, sampling):
        self.sampler, self.sampling = sampler, sampling
        self.prompt_tokens = self.reused_tokens = self.calls = self.reused_calls = self.fed_rows = 0

    def __call__(self, prompts):
        result = self.sampler.generate(prompts, self.sampling, 0)
        self.calls += 1
        self.prompt_tokens += sum(len(p) for p in prompts)
        self.reused_tokens += self.sampler.last_reused_tokens
        self.reused_calls += self.sampler.last_reused_tokens > 0
        self.fed_rows += self.sampler.last_fed_tokens
        return generations_of(result)


def play(env_name, model, tokenizer, sampling, rollout, seeds):
    generate = Counted(Sampler(model, tokenizer), sampling)
    t0 = time.perf_counter()
    trajectories = play_episodes([load_library_env(env_name) for _ in seeds], seeds, generate, tokenizer,
                                 rollout, format_observation=roles.with_hint)
    return trajectories, generate, time.perf_counter() - t0


def _fields(items):
    """KEY=VALUE strings as SamplingConfig field changes (values read as YAML)."""
    return {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in items)}


def _label(changes):
    return " ".join(f"{key}={value}" for key, value in changes.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="odd_one_out")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group", type=int, default=1, help="conversations per instance (seed)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ours", action="append", metavar="KEY=VALUE", default=[],
                        help="SamplingConfig field of ours (repeatable; default: the defaults)")
    parser.add_argument("--baseline", action="append", metavar="KEY=VALUE",
                        help="SamplingConfig field of the baseline (repeatable; default reuse_prefix=false)")
    args = parser.parse_args()
    ours_changes, changes = _fields(args.ours), _fields(args.baseline or ["reuse_prefix=false"])

    model, tokenizer = load(args.model)
    base = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    rollout = RolloutConfig(max_turns=args.turns, max_context_tokens=model.spec.max_position - 2 * args.max_new_tokens)
    if args.group < 1 or args.batch % args.group:
        parser.error(f"--group {args.group} must be at least 1 and divide --batch {args.batch}")
    seeds = [row // args.group for row in range(args.batch)]
    decoding = f"temperature {args.temperature}" if args.temperature else "greedy"
    print(f"env {args.env}, model {args.model}, batch {args.batch} ({args.group} per instance), up to "
          f"{args.turns} turns, {args.max_new_tokens} new tokens per turn, {decoding}; {jax.devices()[0].platform}, "
          f"load average {os.getloadavg()[0]:.1f}")

    sides = {f"ours ({_label(ours_changes) or 'defaults'})": base.replace(**ours_changes),
             f"baseline ({_label(changes)})": base.replace(**changes)}
    best, first, outcome = {}, {}, {}
    for name, sampling in sides.items():  # untimed first play: compiles
        _, _, first[name] = play(args.env, model, tokenizer, sampling, rollout, seeds)
    for _ in range(args.repeats):
        for name, sampling in sides.items():
            trajectories, counts, seconds = play(args.env, model, tokenizer, sampling, rollout, seeds)
            best[name] = min(best.get(name, float("inf")), seconds)
            outcome[name] = (trajectories, counts)

    (ours_traj, ours_counts), (base_traj, base_counts) = outcome.values()
    same = sum(a.tokens == b.tokens for a, b in zip(ours_traj, base_traj))
    turns = sum(len(t.actions) for t in ours_traj)
    longest = max(len(t.tokens) for t in ours_traj)
    print(f"{turns} agent turns in {base_counts.calls} generate calls; longest conversation {longest} "
          f"tokens; identical trajectories: {same}/{args.batch}")
    for name, (_, counts) in outcome.items():
        print(f"{name}: {counts.prompt_tokens} prompt tokens, {counts.reused_tokens} taken from the kept cache "
              f"({counts.reused_calls}/{counts.calls} calls), {counts.prompt_tokens - counts.reused_tokens} "
              f"fed, {counts.fed_rows} token rows through the prefill (padding included)")
    for name in sides:
        print(f"{name:40s} {args.batch / best[name]:8.3f} episodes/s  ({best[name]:.1f}s per batch, best of "
              f"{args.repeats}; first play incl. compiles {first[name]:.1f}s)")
    ours, baseline = (args.batch / best[name] for name in sides)
    print(f"ratio: {ours / baseline:.2f}x")


if __name__ == "__main__":
    main()
