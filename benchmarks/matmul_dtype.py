"""bfloat16 against float32 matmuls on this CPU, at the shapes of a SmolLM2-135M iteration: is bf16
compute worth turning on for the laptop config?

    .venv/bin/python benchmarks/matmul_dtype.py [--repeats 20]

Ours: bf16 inputs with float32 accumulation and results (`preferred_element_type`, how the model
asks for its dots); baseline: float32. Rows are tokens fed at once: a decode step of the laptop
config's 48 conversations, a prefill or extension of 1024 token rows, a training micro-batch of
8 x 896 tokens; the weight is an MLP projection (576 -> 1536) of SmolLM2-135M. Best of `--repeats`.
A ratio above 1 means bf16 is faster.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

SHAPES = (("decode step, 48 rows", 48), ("prefill, 1024 rows", 1024), ("training micro-batch, 7168 rows", 7168))
HIDDEN, INNER = 576, 1536


def rate(rows: int, dtype, repeats: int) -> float:
    x = jax.random.normal(jax.random.key(0), (rows, HIDDEN), dtype)
    w = jax.random.normal(jax.random.key(1), (HIDDEN, INNER), dtype)
    dot = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    dot(x, w).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dot(x, w).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * rows * HIDDEN * INNER / best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    print("| shape | ours: bf16 GFLOP/s | baseline: f32 GFLOP/s | bf16 / f32 |")
    print("|---|---|---|---|")
    for label, rows in SHAPES:
        ours, base = rate(rows, jnp.bfloat16, args.repeats), rate(rows, jnp.float32, args.repeats)
        print(f"| {label} | {ours / 1e9:.1f} | {base / 1e9:.1f} | {ours / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
