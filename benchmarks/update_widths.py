"""Seconds per GRPO update when a few designer samples are much longer than the agent's: their rows in a
batch of their own width (ours, `rl.long_samples_apart`) against every row at the longest sample's
width (the baseline, `long_samples_apart=false`), the same samples, the same Learner, in one run.

The update is shaped like a `laptop` self-play update with a design in it: the config's `rl` and model
settings (48 rows, 16 micro-batches, packed rows, loss columns only, remat, attention chunk), 24 plays
of 400-1024 tokens with eight 4-token replies each, 16 anchor replies of 60-140 tokens, and designer
samples of the lengths given (default two of 2900 and 3100 tokens, replies of 1024 tokens: an edit or
write request and its program). Each variant's first update compiles (timed as `first_s`, compile
included), its next ones are timed as `update_s` (median). Both variants start from the same weights.

python benchmarks/update_widths.py [--config laptop --designer-lengths 2900,3100 --steps 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np


def update_samples(args, vocab: int):
    from spade_jax.rl.batch import AGENT, ANCHOR, DESIGNER
    from spade_jax.rl.collate import Sample

    rng = np.random.default_rng(args.seed)

    def sample(n: int, replies: list[tuple[int, int]], role: int) -> Sample:
        loss = np.zeros(n, int)
        for start, length in replies:
            loss[start: start + length] = 1
        behaviour = np.where(loss > 0, np.log(rng.uniform(0.05, 0.9, n)), 0.0).astype(np.float32)
        advantage = 0.0 if role == ANCHOR else float(rng.normal())
        return Sample(rng.integers(3, vocab, n).tolist(), loss.tolist(), behaviour.tolist(), advantage, role=role)

    samples = []
    for _ in range(args.plays):
        n = int(rng.integers(400, 1025))
        ends = np.linspace(0, n, args.turns + 1)[1:].astype(int)
        samples.append(sample(n, [(max(1, end - 4), 4) for end in ends], AGENT))
    for _ in range(args.anchors):
        n = int(rng.integers(60, 141))
        samples.append(sample(n, [(n // 2, n - n // 2)], ANCHOR))
    for n in args.designer_lengths:
        reply = min(args.designer_reply, n - 1)
        samples.append(sample(n, [(n - reply, reply)], DESIGNER))
    return samples


def time_variant(config, samples, steps: int, **rl_changes) -> dict:
    """One Learner with `config`'s rl settings changed by `rl_changes`: its first update (with the compile)
    and the median of `steps` more, with the shapes and figures of the last."""
    import jax.numpy as jnp

    from spade_jax.models.registry import load_model
    from spade_jax.policy import Learner

    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    loaded = load_model(config.model.name, dtype=dtypes[config.model.dtype],
                        param_dtype=dtypes[config.model.param_dtype], seed=config.seed)
    loaded.model.remat = config.model.remat
    loaded.model.set_attn_chunk(config.model.attn_chunk)
    loaded.model.set_attention(config.model.attention)
    learner = Learner(loaded.model, config.rl.replace(**rl_changes), verbose=False)
    start = time.perf_counter()
    first = learner.update(samples)
    first_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = learner.update(samples)
        times.append(time.perf_counter() - start)
    return {
        "first_s": round(first_s, 1), "update_s": round(float(np.median(times)), 1) if times else None,
        "rows_x_width": [out["update/rows"], out["update/length"]],
        "long_rows_x_width": [out["update/long_rows"], out["update/long_length"]],
        "filled_rows": out["update/filled_rows"], "row_tokens": out["update/row_tokens"],
        "loss_first": first["loss"], "tokens": out["tokens"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="laptop")
    ap.add_argument("--plays", type=int, default=24)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--designer-lengths", default="2900,3100", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--designer-reply", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=1, help="timed updates per variant after the first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="apart,together", help="comma list of apart (ours), together (baseline)")
    ap.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = ap.parse_args()

    import jax

    from spade_jax.config import load_config
    from spade_jax.models.registry import load_model

    config = load_config(args.config, args.overrides)
    if config.rl.min_update_length is None:
        raise SystemExit(f"config {args.config!r} sets no rl.min_update_length: every row is as wide as the longest")
    vocab = load_model(config.model.name).model.spec.vocab_size
    samples = update_samples(args, vocab)
    results = {}
    for name in args.variants.split(","):
        results[name] = time_variant(config, samples, args.steps, long_samples_apart=(name == "apart"))
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    print(json.dumps({"config": args.config, "backend": jax.default_backend(), "samples": len(samples),
                      "real_tokens": sum(len(s.tokens) for s in samples), "variants": results}, indent=1))
    if {"apart", "together"} <= results.keys():
        ours, base = results["apart"], results["together"]
        for key in ("first_s", "update_s"):
            if ours[key] and base[key]:
                print(f"{key}: ours (apart) {ours[key]:.1f} s; baseline (together) {base[key]:.1f} s; "
                      f"ratio {base[key] / ours[key]:.2f}x")


if __name__ == "__main__":
    main()
