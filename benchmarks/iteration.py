"""Wall time per self-play phase, ours (JAX backend where programs fit) vs the sandbox forced for
every environment (the baseline: how a sandbox-only stack would run the same iteration).

python benchmarks/iteration.py [--config tiny|default] [--iterations N] [--out DIR] [key=value ...]

With --out the two run directories are kept (DIR/auto, DIR/sandbox: metrics, envs, plots). One-iteration
warm-up runs of both go first (not reported), so that neither measured run pays one-off jit
compiles that the other would then reuse; programs first seen in a measured run still compile there.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("designer", "validation", "hints", "plays", "update")


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
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--out", help="keep the two run directories here (default: a temporary one)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the unreported warm-up run")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    common = [f"iterations={args.iterations}", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        if not args.no_warmup:
            for backend in ("auto", "sandbox"):
                run_once(args.config, [*common, "iterations=1", f"backend={backend}"], Path(tmp) / f"warmup-{backend}")
        ours = run_once(args.config, [*common, "backend=auto"], root / "auto")
        base = run_once(args.config, [*common, "backend=sandbox"], root / "sandbox")
    print(f"config {args.config}, {args.iterations} iterations; seconds per phase (sum over iterations)")
    print("| phase | ours (auto backend) | baseline (sandbox forced) | baseline / ours |")
    print("|---|---|---|---|")
    for phase in (*PHASES, "total"):
        a, b = ours[phase], base[phase]
        ratio = f"{b / a:.2f}x" if a > 0 else "n/a"
        print(f"| {phase} | {a:.1f} | {b:.1f} | {ratio} |")
    print(json.dumps({"ours": ours, "sandbox": base}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
