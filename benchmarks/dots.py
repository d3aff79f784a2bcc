"""The matmuls of one batched decode step alone: XLA (jitted) against PyTorch, same shapes, same
machine. It isolates the dot kernels from everything else the sampler does, to tell how much of
the generate benchmark's ratio the kernels themselves allow.

    .venv/bin/python benchmarks/dots.py [--model smollm2-135m-instruct] [--rows 16] [--repeats 5]

For every layer of the preset's architecture it runs its seven projections (q, k, v, o, gate, up,
down; random weights, each layer its own so they stream from memory as in a real step) and then
the output projection over the vocabulary, on `--rows` rows, chained so nothing can be skipped.
Ours: `x @ w` with `[in, out]` weights (our layout) and the tied head as `[vocab, hidden]`;
baseline: `torch.nn.functional.linear` with `[out, in]` weights (PyTorch's layout), no grad, its
default threads. Both in float32 and in bfloat16 (float32 accumulation on our side). Prints each
time, the ratio, and the FLOP rate against a jitted 2048^3 float32 matmul's. In float32 it also
runs our packed kernel (`spade_jax.kernels.packed_matmul`, weights packed beforehand as the
sampler keeps them), the one our decode steps use on AVX2/AVX-512 CPUs, with the weight bytes it
streams per second (`SPADE_JAX_KERNEL_ARCH=x86-64-v3` measures the AVX2 build on an AVX-512 CPU).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.generate import _time, matmul_flops
from spade_jax.models.presets import get_preset


def layer_shapes(spec) -> list[tuple[int, int]]:
    """(in, out) of one layer's projections, in the order the chain runs them."""
    e, f = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return [(e, q), (e, kv), (e, kv), (q, e), (e, f), (e, f), (f, e)]


def make_weights(spec, seed: int = 0) -> tuple[list[list[np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(seed)
    layers = [[rng.standard_normal(s, dtype=np.float32) * 0.02 for s in layer_shapes(spec)]
              for _ in range(spec.num_layers)]
    head = rng.standard_normal((spec.vocab_size, spec.hidden_size), dtype=np.float32) * 0.02
    return layers, head


def chain(x, layers, head, linear, head_linear):
    """One step's matmuls in order, each result used so none is dead code."""
    for q, k, v, o, gate, up, down in layers:
        kv = linear(x, k) + linear(x, v)  # both feed the KV cache in a real step
        x = x + linear(linear(x, q), o) + kv[:, :1]
        x = x + linear(linear(x, gate) * linear(x, up), down)
    return head_linear(x, head)


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: compiles ours, lets PyTorch pick its kernels
    return min(_time(fn, repeats))


def time_ours(layers, head, rows, dtype, repeats) -> float:
    dt = jnp.dtype(dtype)
    ws = [[jnp.asarray(w, dt) for w in layer] for layer in layers]
    hd = jnp.asarray(head, dt)

    def linear(x, w):
        return jnp.matmul(x.astype(dt), w, preferred_element_type=jnp.float32)

    def head_linear(x, w):  # the tied head in the embedding's [vocab, hidden] layout, as ours
        return jnp.einsum("me,ve->mv", x.astype(dt), w, preferred_element_type=jnp.float32)

    step = jax.jit(lambda x, ws, hd: chain(x, ws, hd, linear, head_linear))
    x = jnp.ones((rows, head.shape[1]), jnp.float32)
    return _best(lambda: step(x, ws, hd).block_until_ready(), repeats)


def time_packed(layers, head, rows, repeats) -> float:
    from spade_jax import kernels

    ws = jax.jit(lambda ls: [[kernels.pack(w) for w in layer] for layer in ls])(
        [[jnp.asarray(w) for w in layer] for layer in layers])
    hd = jax.jit(kernels.pack_rows)(jnp.asarray(head))
    step = jax.jit(lambda x, ws, hd: chain(x, ws, hd, kernels.packed_matmul, kernels.packed_matmul))
    x = jnp.ones((rows, head.shape[1]), jnp.float32)
    return _best(lambda: step(x, ws, hd).block_until_ready(), repeats)


def time_torch(layers, head, rows, dtype, repeats) -> float:
    import torch

    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    ws = [[torch.from_numpy(np.ascontiguousarray(w.T)).to(dt) for w in layer] for layer in layers]
    hd = torch.from_numpy(head).to(dt)
    x = torch.ones((rows, head.shape[1]), dtype=dt)

    def run():
        with torch.no_grad():
            chain(x, ws, hd, torch.nn.functional.linear, torch.nn.functional.linear)

    return _best(run, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a preset: its shapes only")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    spec = get_preset(args.model)
    layers, head = make_weights(spec)
    params = sum(w.size for layer in layers for w in layer) + head.size
    flops = 2 * args.rows * params
    peak = matmul_flops()
    print(f"backend={jax.default_backend()} cpus={os.cpu_count()} torch threads={torch.get_num_threads()} "
          f"load average={os.getloadavg()[0]:.1f}; {args.model}: {len(layers)} layers x 7 matmuls + head, "
          f"{args.rows} rows, {flops / 1e9:.2f} GFLOP; jitted 2048^3 float32 matmul {peak / 1e9:.0f} GFLOP/s")
    for dtype in ("float32", "bfloat16"):
        ours = time_ours(layers, head, args.rows, dtype, args.repeats)
        theirs = time_torch(layers, head, args.rows, dtype, args.repeats)
        print(f"{dtype:8s}: ours {ours * 1e3:6.1f} ms ({flops / ours / 1e9:5.0f} GFLOP/s, "
              f"{flops / ours / peak:4.0%} of the 2048^3 rate) | "
              f"torch {theirs * 1e3:6.1f} ms ({flops / theirs / 1e9:5.0f} GFLOP/s) | "
              f"ratio {theirs / ours:.2f}x", flush=True)
        if dtype == "float32":
            from spade_jax import kernels

            if not kernels.available():
                print(f"float32 packed kernel: unavailable ({kernels.unavailable_reason()})")
                continue
            packed = time_packed(layers, head, args.rows, args.repeats)
            print(f"float32 packed kernel ({kernels.vector_bits()}-bit build): {packed * 1e3:6.1f} ms "
                  f"({flops / packed / 1e9:5.0f} GFLOP/s, "
                  f"{4 * params / packed / 1e9:.1f} GB/s of weights) | XLA {ours / packed:.2f}x slower | "
                  f"torch {theirs / packed:.2f}x slower", flush=True)


if __name__ == "__main__":
    main()
