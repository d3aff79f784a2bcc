"""Sandbox cost: validation latency per program, step round-trip through the sandbox against
calling the same environment in-process (the reference implementation's way), and batched
steps/s with 2-16 workers. Prints our figure, the in-process baseline and their ratio.

    .venv/bin/python benchmarks/sandbox.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spade_jax.envs.backends.sandbox import SandboxConfig, SandboxPool, detect_isolation  # noqa: E402 (path set up above)
from spade_jax.envs.validate import ValidationConfig, validate  # noqa: E402 (path set up above)

PROGRAM = (ROOT / "tests" / "envs" / "corpus" / "good" / "guess_number.py").read_text()
CLASS = "GuessNumberEnv"


class _InProcessEnv:
    """The reference implementation's way: the program's class called directly."""

    def __init__(self, cls):
        self.env = cls()
        self.has_solution = hasattr(cls, "solution")
        self.max_turns = getattr(cls, "MAX_TURNS", None)
        self._cls = cls

    def reset(self, seed=None, *, timeout=None):
        return self.env.reset(seed=seed)

    def step(self, action, *, timeout=None):
        return self.env.step(action)

    def solution(self, *, timeout=None):
        return self.env.solution()

    def declared_turns(self, *, timeout=None):
        value = getattr(self.env, "max_turns", getattr(self.env, "MAX_TURNS", None))
        return value if isinstance(value, int) else None

    def clone(self, *, timeout=None):
        return _InProcessEnv(self._cls)

    def close(self):
        pass


class _InProcessPool:
    """Stands in for SandboxPool so validate() runs the very same checks in-process."""

    isolation = {"backend": "in-process", "layers": {}, "details": {}}
    config = SandboxConfig(workers=0)

    def load(self, source, class_name, *, timeout=None):
        namespace = {"__name__": "env_program"}
        exec(compile(source, "env_program.py", "exec"), namespace)
        return _InProcessEnv(namespace[class_name])


def _median_ms(samples):
    return statistics.median(samples) * 1e3


def bench_validation(pool, rounds):
    config = ValidationConfig()
    ours, base = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        verdict = validate(PROGRAM, config=config, pool=pool, backend="sandbox")
        ours.append(time.perf_counter() - t)
        assert verdict.valid, verdict.errors
        t = time.perf_counter()
        verdict = validate(PROGRAM, config=config, pool=_InProcessPool(), backend="sandbox")
        base.append(time.perf_counter() - t)
        assert verdict.valid, verdict.errors
        time.sleep(0.25)  # let the pool start its replacement idle worker, as between designer samples
    return _median_ms(ours), _median_ms(base)


def bench_cold_validation(rounds):
    """One-shot: a fresh pool per program (what `python -m spade_jax.envs check` pays)."""
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        verdict = validate(PROGRAM, config=ValidationConfig(), backend="sandbox")
        samples.append(time.perf_counter() - t)
        assert verdict.valid
    return _median_ms(samples)


def bench_step(pool, steps):
    env = pool.load(PROGRAM, CLASS)
    ref = _InProcessPool().load(PROGRAM, CLASS)
    actions = ["\\boxed{%d}" % (i % 60) for i in range(steps)]
    ours, base = [], []
    try:
        for _which, target, out in (("sandbox", env, ours), ("in-process", ref, base)):
            target.reset(seed=0)
            for action in actions:
                t = time.perf_counter_ns()
                _, _, terminated, truncated, _ = target.step(action)
                out.append(time.perf_counter_ns() - t)
                if terminated or truncated:
                    target.reset(seed=len(out))
    finally:
        env.close()
    return statistics.median(ours) / 1e3, statistics.median(base) / 1e3  # microseconds


def bench_throughput(workers, seconds):
    config = SandboxConfig(workers=0, max_workers=workers + 2)
    with SandboxPool(config) as pool:
        envs = [pool.load(PROGRAM, CLASS) for _ in range(workers)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        steps, start = 0, time.perf_counter()
        round_ = 0
        while time.perf_counter() - start < seconds:
            results = pool.step_many([(env, "\\boxed{%d}" % ((round_ + i) % 50)) for i, env in enumerate(envs)])
            steps += len(results)
            for env, result in zip(envs, results):
                if isinstance(result, Exception):
                    raise result
                if result[2] or result[3]:
                    env.reset(seed=steps)
            round_ += 1
        elapsed = time.perf_counter() - start
        for env in envs:
            env.close()
    return steps / elapsed


def bench_in_process_throughput(seconds):
    env = _InProcessPool().load(PROGRAM, CLASS)
    env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = env.step("\\boxed{%d}" % (steps % 50))
        steps += 1
        if result[2] or result[3]:
            env.reset(seed=steps)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    rounds, steps, seconds = (5, 2000, 1.0) if args.quick else (30, 20000, 3.0)

    iso = detect_isolation()
    layers = ",".join(k for k, v in iso["layers"].items() if v)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"sandbox backend {iso['backend']} [{layers}]")
    figures: dict = {"cores": os.cpu_count(), "isolation": iso}

    with SandboxPool(SandboxConfig(workers=2)) as pool:
        pool.load(PROGRAM, CLASS).close()  # warm caches
        val_ours, val_base = bench_validation(pool, rounds)
        print(f"validation latency, median of {rounds} (warm pool): sandbox {val_ours:.1f} ms | "
              f"in-process {val_base:.2f} ms | ratio {val_ours / val_base:.0f}x  (target < 200 ms)")
        step_ours, step_base = bench_step(pool, steps)
        overhead = step_ours - step_base
        print(f"step round-trip, median of {steps}: sandbox {step_ours:.1f} us | in-process {step_base:.2f} us | "
              f"ratio {step_ours / step_base:.0f}x | overhead {overhead:.1f} us  (target < 500 us)")
    cold = bench_cold_validation(max(3, rounds // 6))
    print(f"validation latency, one-shot with pool start-up (CLI path): {cold:.0f} ms")
    figures.update(validation_ms=val_ours, validation_in_process_ms=val_base, validation_cold_ms=cold,
                   step_us=step_ours, step_in_process_us=step_base, step_overhead_us=overhead)

    base_tp = bench_in_process_throughput(seconds)
    figures["in_process_steps_per_s"] = base_tp
    figures["steps_per_s"] = {}
    print(f"in-process steps/s (1 thread, reference way): {base_tp:,.0f}")
    for workers in (2, 4, 8, 16):
        tp = bench_throughput(workers, seconds)
        figures["steps_per_s"][workers] = tp
        print(f"batched steps/s with {workers:2d} workers (step_many): {tp:,.0f} | in-process {base_tp:,.0f} | "
              f"ratio {tp / base_tp:.3f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (timings are noisy when other work shares the cores)")
    figures["load_average"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
