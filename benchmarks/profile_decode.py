"""Where one `Sampler.generate` call spends its time on the device: a `jax.profiler` trace of one
steady call, summarised as device busy time against wall time and the kernels that take it.

    .venv/bin/python benchmarks/profile_decode.py [--model smollm2-135m-instruct] [--random-weights]
        [--batch 16] [--new-tokens 64] [--dtype float32|bfloat16] [--top 15] [--trace-dir DIR]

For a GPU or TPU: busy time is the union of the kernel intervals on the accelerator's streams.
Busy well below the call's span means launch- or host-bound; busy near it, the kernels listed are
the time. The trace stays in --trace-dir (Perfetto JSON: open it at ui.perfetto.dev). On a CPU the
trace mixes XLA's thunks with Python frames and this summary does not apply (docs/benchmarks.md
says how the CPU step was profiled).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
from generate import bench_model, bench_prompts

from spade_jax.models.registry import EMBEDDED_MODEL
from spade_jax.sampling import Sampler, SamplingConfig


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def device_summary(trace_file: str, top: int) -> dict:
    """Kernel time by name on the accelerator's streams in a Perfetto JSON trace."""
    with gzip.open(trace_file, "rt") as fh:
        events = json.load(fh)
    events = events["traceEvents"] if isinstance(events, dict) else events
    meta = [e for e in events if e.get("ph") == "M"]
    devices = {e["pid"] for e in meta if e.get("name") == "process_name"
               and e["args"]["name"].startswith("/device:")}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta
               if e.get("name") == "thread_name" and e["pid"] in devices}
    # GPU traces hold the kernels on "Stream #N" lines (beside XLA's module/op summary lines).
    streams = {key for key, name in threads.items() if name.startswith("Stream")} or set(threads)
    kernels = [e for e in events if e.get("ph") == "X" and "dur" in e
               and (e.get("pid"), e.get("tid")) in streams]
    if not kernels:
        raise SystemExit(f"no accelerator kernels in {trace_file}: this script profiles a GPU or TPU "
                         f"(threads seen: {sorted(set(threads.values()))[:8]})")
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    busy = _union_us([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])
    return {"span_us": span, "busy_us": busy, "kernel_launches": len(kernels),
            "kernel_us_total": sum(v[0] for v in by_name.values()),
            "streams": sorted({threads[k] for k in streams}),
            "top": [{"name": n, "us": us, "count": c} for n, (us, c) in ranked[:top]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--random-weights", action="store_true")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--trace-dir", default=None, help="default: a new temporary directory")
    args = parser.parse_args()
    if jax.default_backend() == "cpu":
        raise SystemExit("profile_decode.py summarises accelerator kernels; this JAX has only a CPU "
                         "(docs/benchmarks.md says how the CPU decode step was profiled)")

    dtype = jnp.dtype(args.dtype)
    model, tokenizer, spec = bench_model(args.model, args.random_weights, dtype)
    prompts = bench_prompts(tokenizer, spec, args.batch, args.random_weights)
    sampler = Sampler(model, tokenizer)
    config = SamplingConfig(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True,
                            reuse_prefix=False)
    sampler.generate(prompts, config)  # compile
    start = time.perf_counter()
    sampler.generate(prompts, config)
    steady_s = time.perf_counter() - start
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile-decode-")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        start = time.perf_counter()
        sampler.generate(prompts, config)
        traced_s = time.perf_counter() - start
    trace_file = max(glob.glob(os.path.join(trace_dir, "**", "*.json.gz"), recursive=True),
                     key=os.path.getmtime)
    summary = device_summary(trace_file, args.top)
    steps = args.new_tokens
    print(f"{jax.devices()[0].device_kind} {args.model}{' (random weights)' if args.random_weights else ''} "
          f"{args.dtype} batch {args.batch} + {steps} new: call {1e3 * steady_s:.1f} ms untraced, "
          f"{1e3 * traced_s:.1f} ms traced; device busy {summary['busy_us'] / 1e3:.1f} ms of a "
          f"{summary['span_us'] / 1e3:.1f} ms span ({100 * summary['busy_us'] / summary['span_us']:.0f}%), "
          f"{summary['kernel_launches']} kernels ({summary['kernel_launches'] / steps:.0f} per new token)")
    for row in summary["top"]:
        print(f"  {row['us'] / 1e3:9.2f} ms {100 * row['us'] / summary['kernel_us_total']:5.1f}% "
              f"x{row['count']:<6d} {row['name'][:100]}")
    print(f"streams: {', '.join(summary['streams'])}; trace: {trace_file}")
    print(json.dumps({"steady_s": steady_s, "traced_s": traced_s, **summary}))


if __name__ == "__main__":
    main()
