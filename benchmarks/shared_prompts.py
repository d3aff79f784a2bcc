"""Seconds per GRPO update when the plays of a group open with the same prompt: the prompt stored once per
row and attended to by every play of its group (ours, `rl.share_prefixes`) against a copy of it in every
play (the baseline, `share_prefixes=false`), the same samples, the same Learner otherwise, in one run.

The update is shaped like a `laptop` update: the config's `rl` and model settings (48 rows, 16
micro-batches, packed rows, loss columns only, remat, attention chunk), `--groups` groups of
`--group-size` plays of one instance (`group_instances: shared`; 6 x 8 = 48, a laptop iteration's
plays), each group's prompt 150-220 tokens (the laptop games' system turn and first observation measure
149-221), then 1-8 turns (laptop runs average 1.5-6.5) of a 3-8 token reply and, after all but the last,
40-100 tokens of the game's answer and the next turn's header, and 16 anchor replies of 60-140 tokens
(their questions differ: nothing to share). Random tokens, seed 0. Each variant's first update
compiles (`first_s`, compile included), its next ones are timed as `update_s` (median). Both start from
the same weights.

python benchmarks/shared_prompts.py [--config laptop --groups 6 --group-size 8 --steps 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np


def grouped_samples(args, vocab: int):
    from spade_jax.rl.batch import AGENT, ANCHOR
    from spade_jax.rl.collate import Sample

    rng = np.random.default_rng(args.seed)

    def sample(tokens: list[int], replies: list[tuple[int, int]], role: int) -> Sample:
        n = len(tokens)
        loss = np.zeros(n, int)
        for start, length in replies:
            loss[start: start + length] = 1
        behaviour = np.where(loss > 0, np.log(rng.uniform(0.05, 0.9, n)), 0.0).astype(np.float32)
        advantage = 0.0 if role == ANCHOR else float(rng.normal())
        return Sample(tokens, loss.tolist(), behaviour.tolist(), advantage, role=role)

    def words(n: int) -> list[int]:
        return rng.integers(3, vocab, n).tolist()

    samples = []
    for _ in range(args.groups):
        prompt = words(int(rng.integers(150, 221)))
        for _ in range(args.group_size):
            tokens, replies = list(prompt), []
            for turn in range(int(rng.integers(1, args.max_turns + 1))):
                if turn:
                    tokens += words(int(rng.integers(40, 101)))  # the game's answer and the next turn's header
                reply = int(rng.integers(3, 9))  # an action after the forced \boxed{
                replies.append((len(tokens), reply))
                tokens += words(reply)
            samples.append(sample(tokens, replies, AGENT))
    for _ in range(args.anchors):
        n = int(rng.integers(60, 141))
        samples.append(sample(words(n), [(n // 2, n - n // 2)], ANCHOR))
    return samples


def model_tokens(config, samples, share: bool) -> int:
    """Tokens the update runs through the model (its rows' real columns)."""
    from spade_jax.rl.collate import collate

    batch = collate(samples, pack=True, share_prefixes=share, min_length=config.rl.min_update_length,
                    length_multiple=config.rl.update_length_multiple)
    return int(np.asarray(batch.valid_bt).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="laptop")
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1, help="timed updates per variant after the first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="shared,copied", help="comma list of shared (ours), copied (baseline)")
    ap.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = ap.parse_args()

    import jax
    from update_widths import time_variant

    from spade_jax.config import load_config
    from spade_jax.models.registry import load_model

    config = load_config(args.config, args.overrides)
    if not config.rl.pack_sequences:
        raise SystemExit(f"config {args.config!r} does not pack update rows (rl.pack_sequences): nothing to share")
    vocab = load_model(config.model.name).model.spec.vocab_size
    samples = grouped_samples(args, vocab)
    results = {}
    for name in args.variants.split(","):
        share = name == "shared"
        results[name] = time_variant(config, samples, args.steps, share_prefixes=share)
        results[name]["model_tokens"] = model_tokens(config, samples, share)
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    print(json.dumps({"config": args.config, "backend": jax.default_backend(), "samples": len(samples),
                      "real_tokens": sum(len(s.tokens) for s in samples), "variants": results}, indent=1))
    if {"shared", "copied"} <= results.keys():
        ours, base = results["shared"], results["copied"]
        for key in ("first_s", "update_s"):
            if ours[key] and base[key]:
                print(f"{key}: ours (shared) {ours[key]:.1f} s; baseline (copied) {base[key]:.1f} s; "
                      f"ratio {base[key] / ours[key]:.2f}x")


if __name__ == "__main__":
    main()
