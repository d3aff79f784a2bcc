"""A run's wall-clock training budget (`max_minutes`): the seconds its iterations took, summed across
resumes through the `run/train_s` metric each iteration records, and whether the budget is spent."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from spade_jax.run.records import number

# Metric: training seconds of all iterations up to and including this one, resumes included (the
# iteration's self-play step: design, plays, update; held-out evaluation and checkpoint saves excluded).
TRAIN_SECONDS = "run/train_s"


def cumulative_seconds(history: Iterable[Mapping]) -> list[float]:
    """Per record, the training seconds of the run up to the end of that iteration: its `run/train_s`.
    A record without it (a run from before the budget existed) adds its own iteration's time from
    `wall_s`, which counts from its process's start (so it includes a held-out evaluation)."""
    out = []
    spent = previous_wall = 0.0
    for record in history:
        total = number(record.get(TRAIN_SECONDS))
        wall = number(record.get("wall_s"))
        if total is not None and math.isfinite(total):
            spent = total
        elif wall is not None:
            spent += wall - previous_wall if wall >= previous_wall else wall
        if wall is not None:
            previous_wall = wall
        out.append(spent)
    return out


def spent_seconds(history: Iterable[Mapping]) -> float:
    """Training seconds of the run's kept iterations (0 when none)."""
    totals = cumulative_seconds(history)
    return totals[-1] if totals else 0.0


class Budget:
    """`max_minutes` of training wall time (None or 0: unlimited), `spent` seconds so far."""

    def __init__(self, max_minutes: float | None, spent: float = 0.0):
        self.limit_s = max_minutes * 60.0 if max_minutes else math.inf
        self.spent = float(spent)

    def add(self, seconds: float) -> float:
        """Counts one iteration's seconds; returns the total so far (what `run/train_s` records)."""
        self.spent += seconds
        return self.spent

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.limit_s
