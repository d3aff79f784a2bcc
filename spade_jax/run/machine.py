"""Which machine a run trained on, recorded in its `run.json` when it starts and at every resume.

A wall-clock budget (`max_minutes`) buys different work on different machines (40 minutes of `laptop`
were 5 iterations on a 2-core CPU without AVX-512 and 9 on one with it, docs/results.md session 34), so
this record tells apart the rows of a comparison made on different machines.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

# CPU features that change how fast the model's matmuls run here (x86 vector units, bf16 dot products).
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


def describe(matmul_size: int = 1024) -> dict[str, Any]:
    """The CPU's model, usable cores and vector features, the accelerator JAX sees (when JAX is already
    imported) and numpy's float32 matmul rate (best of three `matmul_size`^3 products, about 0.1 s): measured
    now, so other jobs sharing the machine lower it, which is worth knowing about a timed run too."""
    model, flags = _cpuinfo()
    machine: dict[str, Any] = {
        "cpu": model or platform.processor() or platform.machine() or "unknown",
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_features": [name for name in FEATURES if name in flags],
        "matmul_gflops": round(_matmul_rate(matmul_size) / 1e9, 1),
    }
    accelerator = _accelerator()
    if accelerator:
        machine["accelerator"] = accelerator
    return machine


def summary(machine: dict[str, Any]) -> str:
    """One line: 'AMD EPYC, 2 cores (avx2), numpy float32 matmul 95 GFLOP/s'."""
    features = ", ".join(machine.get("cpu_features") or []) or "no AVX2"
    text = f"{machine.get('cpu', 'unknown')}, {machine.get('cores', '?')} cores ({features})"
    if machine.get("accelerator"):
        text += f", {machine['accelerator']}"
    if machine.get("matmul_gflops") is not None:
        text += f", numpy float32 matmul {machine['matmul_gflops']:g} GFLOP/s"
    return text


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:  # x86, arm64
            flags = set(value.split())
    return model, flags


def _matmul_rate(n: int) -> float:
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / max(best, 1e-9)


def _accelerator() -> str | None:
    if "jax" not in sys.modules:  # importing JAX here would cost seconds and pick a backend too early
        return None
    import jax

    try:
        devices = jax.devices()
    except RuntimeError:  # no backend could start; the run itself reports that
        return None
    if devices[0].platform == "cpu":
        return None
    return f"{len(devices)} x {devices[0].device_kind}"
