"""Seconds per GRPO update on a laptop-shaped batch: loss-column scoring and packed rows (ours) against
the old path (every column projected onto the vocabulary, one sample per row) in the same run.

The batch is shaped like the `laptop` config's updates: 32 samples of 300-1536 tokens (uniform, fixed
seed) with ~12 loss tokens each (three 4-token replies at turn ends), micro_batches 8, the embedded
SmolLM2-135M with the laptop's model settings (remat, attention chunk 512, logprob chunk 128; `--no-remat`
keeps the forward's activations for the backward instead).

python benchmarks/update_packing.py [--samples 32 --min-len 300 --max-len 1536
    --variants old,loss_only,packed,packed_bf16,packed_loss_only --baseline old]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

# name -> (RLConfig changes, pack rows)
VARIANTS = {
    "old": (dict(score_loss_only=False), False),
    "loss_only": (dict(score_loss_only=True), False),
    "packed": (dict(score_loss_only=False, pack_sequences=True), True),
    "packed_bf16": (dict(score_loss_only=False, pack_sequences=True, compute_dtype="bfloat16"), True),
    "packed_loss_only": (dict(score_loss_only=True, pack_sequences=True), True),
    "packed_loss_only_bf16": (dict(score_loss_only=True, pack_sequences=True, compute_dtype="bfloat16"), True),
}


def laptop_samples(args, vocab: int):
    from spade_jax.rl.collate import Sample

    rng = np.random.default_rng(args.seed)
    samples = []
    for _ in range(args.samples):
        n = int(rng.integers(args.min_len, args.max_len + 1))
        tokens = rng.integers(3, vocab, n).tolist()
        loss = np.zeros(n, int)
        for turn_end in np.linspace(0, n, args.turns + 1)[1:].astype(int):  # replies end each turn
            loss[max(1, turn_end - args.reply_tokens): turn_end] = 1
        behaviour = np.where(loss > 0, np.log(rng.uniform(0.05, 0.9, n)), 0.0).astype(np.float32)
        samples.append(Sample(tokens, loss.tolist(), behaviour.tolist(), advantage=float(rng.normal()),
                              role=0, stale=False))
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=300)
    ap.add_argument("--max-len", type=int, default=1536)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--reply-tokens", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--logprob-chunk", type=int, default=128)
    ap.add_argument("--attn-chunk", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1, help="timed updates per variant (after compiling)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True,
                    help="recompute each block in the backward pass (the model.remat default)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--baseline", default="old", help="the variant every other one is compared with")
    args = ap.parse_args()

    import jax

    from spade_jax.models.registry import load_model
    from spade_jax.rl import RLConfig, make_train_step
    from spade_jax.rl.collate import collate
    from spade_jax.rl.train import format_memory

    loaded = load_model(args.model)
    model = loaded.model
    model.remat = args.remat
    model.set_attn_chunk(args.attn_chunk)
    samples = laptop_samples(args, model.spec.vocab_size)
    results = {}
    for name in args.variants.split(","):
        changes, pack = VARIANTS[name]
        cfg = RLConfig(micro_batches=args.micro_batches, logprob_chunk=args.logprob_chunk, lr=1e-6, **changes)
        batch = collate(samples, row_multiple=args.micro_batches, max_length=args.max_len, pack=pack)
        train_step = make_train_step(model, cfg, verbose=False)
        state = train_step.init(model)
        start = time.perf_counter()
        compiled = train_step.compile(state, train_step.place_batch(batch))
        compile_s = time.perf_counter() - start
        times, loss = [], None
        for _ in range(args.steps):
            start = time.perf_counter()
            state, metrics = train_step(state, batch)
            loss = float(metrics["loss"])  # blocks until the update is done
            times.append(time.perf_counter() - start)
        results[name] = {
            "rows_x_width": list(np.shape(batch.tokens_bt)), "compile_s": round(compile_s, 1),
            "memory": format_memory(compiled),
            "update_s": round(float(np.median(times)), 1), "loss": loss,
            "loss_tokens": float(metrics["tokens"]), "sequences": float(metrics["sequences"]),
        }
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
        del state
    tokens = sum(min(len(s.tokens), args.max_len) for s in samples)
    summary = {"model": args.model, "backend": jax.default_backend(), "samples": args.samples, "remat": args.remat,
               "real_tokens": tokens, "variants": results}
    print(json.dumps(summary, indent=1))
    if args.baseline in results:
        base = results[args.baseline]["update_s"]
        for name, r in results.items():
            if name != args.baseline:
                print(f"{name}: {r['update_s']:.1f} s per update; {args.baseline} {base:.1f} s; "
                      f"ratio {base / r['update_s']:.2f}x")


if __name__ == "__main__":
    main()
