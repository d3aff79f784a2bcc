"""Wall time per self-play phase, ours (JAX backend where programs fit) vs the sandbox forced for
every environment (the baseline: how a sandbox-only stack would run the same iteration), and the
share of our iteration that is model compute, against this CPU's measured matmul rate.

python benchmarks/iteration.py [--config tiny|default|laptop] [--iterations N] [--out DIR]
                               [--no-sandbox] [--async-staleness K] [--baseline key=value ...] [key=value ...]

With --out the two run directories are kept (DIR/auto, DIR/sandbox: metrics, envs, plots). One-iteration
warm-up runs of both go first (not reported), so that neither measured run pays one-off jit
compiles that the other would then reuse; programs first seen in a measured run still compile there.
--no-sandbox skips the sandbox-forced runs (the phases are then compared with the matmul rate only).

--baseline key=value (repeatable) compares the config as it is (its own backend, plus the positional
overrides) against the same with these settings instead of the sandbox: what a knob buys, phase by phase,
with the token rows each arm fed through the model.

--async-staleness K compares asynchronous play instead (ours: `async_staleness=K`, the next iteration's
rollouts sampled during the update; baseline: the synchronous loop, `async_staleness=0`), both with the
config's backend: seconds per iteration (the run's training clock, `run/train_s`, over its iterations),
the overlapped seconds, and the ratio. Its warm-up runs are whole runs of both arms (the sampler's
compiled programs are shared by every run in the process: a one-iteration warm-up left the later
iterations' shapes to the arm measured first).

Model compute: the run's metrics count the token rows the sampler fed through the model (prefill and
decode steps, padding included: `tokens/*`) and the update's rows x length. Their weight-matmul FLOPs
(2 x parameters per inference row, 6 x per trained token, plus a forward for the old policy's
logprobs; attention scores not counted, so a lower bound) divided by the rate of a large float32
matmul measured here give the seconds the model's arithmetic needs; against the phase's wall time
that is the share the rest (host work, dispatch, padding to buckets, environment steps) leaves.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("designer", "validation", "hints", "plays", "anchor", "update")  # anchor: once, at the first update


def run_once(config_name: str, overrides: list[str], out: Path) -> dict:
    from experiments.run import run
    from spade_jax.config import load_config
    from spade_jax.run import read_metrics

    config = load_config(config_name, ["progress=false", "tensorboard=false", *overrides])
    started = time.perf_counter()
    run(config, out)
    total = time.perf_counter() - started
    records = read_metrics(out)
    times = {p: sum(r.get(f"time/{p}", 0.0) or 0.0 for r in records) for p in PHASES}
    times["total"] = total
    clock = [r.get("run/train_s", 0.0) or 0.0 for r in records]  # training seconds so far, per iteration
    times["train_s"] = clock[-1] if clock else 0.0
    times["iterations"] = len(records)
    for key in ("async/overlap_s", "async/wait_s"):
        times[key] = sum(r.get(key, 0.0) or 0.0 for r in records)
    for key in ("tokens/prefill_rows", "tokens/decode_rows", "tokens/generated_tokens"):
        times[key] = sum(r.get(key, 0) or 0 for r in records)
    # Rows the update computed: with rl.update_rows its padding micro-batches are skipped, so the filled rows.
    times["train_tokens"] = sum(
        r.get("update/row_tokens")
        or (r.get("update/filled_rows", r.get("update/rows", 0)) or 0) * (r.get("update/length", 0) or 0)
        for r in records if not r.get("update/skipped")
    )
    times["params"] = _param_count(config.model.name)
    return times


def _param_count(model_name: str) -> int:
    import jax
    from flax import nnx

    from spade_jax.models.registry import load_model

    state = nnx.state(load_model(model_name).model, nnx.Param)
    return int(sum(x.size for x in jax.tree.leaves(state)))


def matmul_rate(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n float32 matmul here (best of `repeats`), the CPU's practical peak."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dot(a, a).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


def compute_share(times: dict, rate: float) -> dict:
    """Seconds the model's weight matmuls need at `rate`, and their share of the phases' wall time."""
    params = times["params"]
    infer_s = 2 * params * (times["tokens/prefill_rows"] + times["tokens/decode_rows"]) / rate
    train_s = 8 * params * times["train_tokens"] / rate  # 6 (forward + backward) + 2 (old-policy forward)
    sampled = sum(times[p] for p in ("designer", "hints", "plays", "anchor"))
    return {
        "inference_s": infer_s, "sampling_wall_s": sampled, "inference_share": infer_s / sampled if sampled else 0.0,
        "train_s": train_s, "update_wall_s": times["update"],
        "train_share": train_s / times["update"] if times["update"] else 0.0,
        "total_share": (infer_s + train_s) / times["total"] if times["total"] else 0.0,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--out", help="keep the two run directories here (default: a temporary one)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the unreported warm-up run")
    parser.add_argument("--no-sandbox", action="store_true", help="skip the sandbox-forced baseline runs")
    parser.add_argument("--async-staleness", type=int, default=None, metavar="K",
                        help="compare async_staleness=K against the synchronous loop instead")
    parser.add_argument("--baseline", action="append", metavar="KEY=VALUE",
                        help="the baseline is the config with this setting (repeatable) instead of the sandbox")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.async_staleness is not None:
        return compare_async(args)
    if args.baseline:
        return compare_settings(args)
    common = [f"iterations={args.iterations}", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        backends = ("auto",) if args.no_sandbox else ("auto", "sandbox")
        if not args.no_warmup:
            for backend in backends:
                run_once(args.config, [*common, "iterations=1", f"backend={backend}"], Path(tmp) / f"warmup-{backend}")
        ours = run_once(args.config, [*common, "backend=auto"], root / "auto")
        base = None if args.no_sandbox else run_once(args.config, [*common, "backend=sandbox"], root / "sandbox")
    rate = matmul_rate()
    share = compute_share(ours, rate)
    print(f"config {args.config}, {args.iterations} iterations; seconds per phase (sum over iterations)")
    if base is not None:
        print("| phase | ours (auto backend) | baseline (sandbox forced) | baseline / ours |")
        print("|---|---|---|---|")
        for phase in (*PHASES, "total"):
            a, b = ours[phase], base[phase]
            ratio = f"{b / a:.2f}x" if a > 0 else "n/a"
            print(f"| {phase} | {a:.1f} | {b:.1f} | {ratio} |")
    else:
        print("| phase | ours (auto backend) |")
        print("|---|---|")
        for phase in (*PHASES, "total"):
            print(f"| {phase} | {ours[phase]:.1f} |")
    print(f"\nmodel compute vs this CPU's float32 matmul rate ({rate / 1e9:.1f} GFLOP/s, 2048^3), "
          f"{ours['params'] / 1e6:.1f}M parameters:")
    print("| part | model arithmetic at the matmul rate (s) | wall (s) | share |")
    print("|---|---|---|---|")
    print(f"| sampling (designer + hints + plays + anchor): {ours['tokens/prefill_rows']} prefill + "
          f"{ours['tokens/decode_rows']} decode rows | {share['inference_s']:.1f} | {share['sampling_wall_s']:.1f} "
          f"| {share['inference_share']:.1%} |")
    print(f"| update: {ours['train_tokens']} tokens | {share['train_s']:.1f} | {share['update_wall_s']:.1f} "
          f"| {share['train_share']:.1%} |")
    print(f"| whole iteration | {share['inference_s'] + share['train_s']:.1f} | {ours['total']:.1f} "
          f"| {share['total_share']:.1%} |")
    print(json.dumps({"ours": ours, "sandbox": base, "matmul_flops": rate, "share": share}))
    return 0


def compare_settings(args) -> int:
    """The config as it is (ours) against the same with `--baseline` settings, same seeds."""
    common = [f"iterations={args.iterations}", *args.overrides]
    arms = {"ours": common, "baseline": [*common, *args.baseline]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        if not args.no_warmup:  # whole runs, as for --async-staleness: compiled programs are per process
            for name, overrides in arms.items():
                run_once(args.config, overrides, Path(tmp) / f"warmup-{name}")
        runs = {name: run_once(args.config, overrides, root / name) for name, overrides in arms.items()}
    ours, base = runs["ours"], runs["baseline"]
    print(f"config {args.config}, {args.iterations} iterations, {' '.join(args.overrides) or 'no overrides'}; "
          f"baseline: {' '.join(args.baseline)}")
    print("| | ours | baseline | baseline / ours |")
    print("|---|---|---|---|")
    for phase in (*PHASES, "total"):
        a, b = ours[phase], base[phase]
        print(f"| {phase} (s) | {a:.1f} | {b:.1f} | {f'{b / a:.2f}x' if a > 0 else 'n/a'} |")
    for key in ("tokens/prefill_rows", "tokens/decode_rows", "tokens/generated_tokens", "train_tokens"):
        a, b = ours[key], base[key]
        print(f"| {key} | {a} | {b} | {f'{b / a:.2f}x' if a > 0 else 'n/a'} |")
    print(json.dumps({"ours": ours, "baseline": base}))
    return 0


def compare_async(args) -> int:
    """Asynchronous play (async_staleness=K) against the synchronous loop, same config and seeds."""
    common = [f"iterations={args.iterations}", *args.overrides]
    arms = {"sync": [*common, "async_staleness=0"], "async": [*common, f"async_staleness={args.async_staleness}"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        if not args.no_warmup:  # whole runs: the sampler's programs compile once per process, for each shape
            for name, overrides in arms.items():  # a run meets, so the arm measured first would pay them all
                run_once(args.config, overrides, Path(tmp) / f"warmup-{name}")
        runs = {name: run_once(args.config, overrides, root / name) for name, overrides in arms.items()}
    ours, base = runs["async"], runs["sync"]
    per_ours, per_base = ours["train_s"] / ours["iterations"], base["train_s"] / base["iterations"]
    print(f"config {args.config}, {args.iterations} iterations, {' '.join(args.overrides) or 'no overrides'}")
    print(f"| | ours (async_staleness={args.async_staleness}) | baseline (synchronous) | baseline / ours |")
    print("|---|---|---|---|")
    print(f"| seconds per iteration | {per_ours:.1f} | {per_base:.1f} | {per_base / per_ours:.2f}x |")
    for phase in PHASES:
        print(f"| {phase} (s, sum) | {ours[phase]:.1f} | {base[phase]:.1f} | |")
    print(f"| overlapped (s, sum) | {ours['async/overlap_s']:.1f} | 0 | |")
    print(f"| update waiting for rollouts (s, sum) | {ours['async/wait_s']:.1f} | | |")
    print(json.dumps({"ours": ours, "baseline": base, "ratio": per_base / per_ours}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
