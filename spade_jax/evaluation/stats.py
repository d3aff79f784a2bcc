"""Success-rate statistics: the Wilson interval of one task's rate and a normal-approximation
interval for the macro average over independent tasks."""

from __future__ import annotations

import math
from collections.abc import Sequence


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default); (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n]; got {successes} of {n}")
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def macro_interval(
    counts: Sequence[tuple[int, int]], z: float = 1.959963984540054
) -> tuple[float, float, float]:
    """Mean of per-task success rates and a normal-approximation interval for it: the tasks
    are independent, so Var(mean) = sum p_i (1 - p_i) / n_i / K^2. Returns (mean, low, high)."""
    rates = [(k / n, n) for k, n in counts if n > 0]
    if not rates:
        return 0.0, 0.0, 1.0
    mean = sum(p for p, _ in rates) / len(rates)
    # Using each task's Wilson-adjusted centre keeps the variance positive at 0/n and n/n.
    var = 0.0
    for (k, n) in counts:
        if n > 0:
            p_adj = (k + z * z / 2) / (n + z * z)
            var += p_adj * (1 - p_adj) / n
    se = math.sqrt(var) / len(rates)
    return mean, max(0.0, mean - z * se), min(1.0, mean + z * se)
