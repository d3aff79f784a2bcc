"""Curves of several runs side by side: per arm the mean over seeds with a 95% band, over iterations
and over training minutes; the figures experiments.compare writes (learning curves, designer side)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from spade_jax.run.budget import cumulative_seconds
from spade_jax.run.records import number

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal's.
_T95 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
        2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
        2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)
Z95 = 1.959963984540054

LEARNING_KEYS = (("agent/win_rate", "training win rate"), ("agent/mean_reward", "training mean reward"),
                 ("eval/success_rate", "held-out success"))
DESIGNER_KEYS = (("designer/valid_rate", "designer valid rate"), ("curriculum/in_band_share", "in-band share"),
                 ("designer/regret_mean", "mean regret"))
# Shares in [0, 1]: a t band over few seeds can overshoot, so theirs is drawn clipped to [0, 1].
RATE_KEYS = ("agent/win_rate", "eval/success_rate", "designer/valid_rate", "curriculum/in_band_share")


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else Z95


def mean_band(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean over seeds; the band is NaN with one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def curve(histories: Sequence[Sequence[Mapping]], key: str, *, every_seed: bool = False) -> list[dict]:
    """Per iteration that any seed logged `key` (finite): the mean over the seeds that did, the train
    minutes at its end (mean over those seeds) and a 95% band: the t-interval over seeds, or with a
    single run the interval it logged beside the metric (`<key>_low`/`_high`, a Wilson interval).
    `every_seed`: only the iterations that every seed logging `key` reached, so that the mean is over one
    set of runs (runs at an equal time budget end at different iterations; a mean over the few that went
    furthest jumps, and its minutes can go back)."""
    by_iteration: dict[int, list[tuple[float, float, float, float]]] = {}
    logging = set()  # the seeds that logged `key`
    for index, history in enumerate(histories):
        for record, seconds in zip(history, cumulative_seconds(history)):
            value, iteration = number(record.get(key)), record.get("iteration")
            if value is None or not math.isfinite(value) or not isinstance(iteration, int):
                continue
            logging.add(index)
            low, high = number(record.get(f"{key}_low")), number(record.get(f"{key}_high"))
            by_iteration.setdefault(iteration, []).append(
                (value, seconds / 60.0, math.nan if low is None else low, math.nan if high is None else high))
    points = []
    for iteration in sorted(by_iteration):
        seen = by_iteration[iteration]
        if every_seed and len(seen) < len(logging):
            continue
        mean, low, high = mean_band([v for v, *_ in seen])
        if len(histories) == 1:
            low, high = seen[0][2], seen[0][3]
        points.append({"iteration": iteration, "minutes": sum(m for _, m, *_ in seen) / len(seen),
                       "mean": mean, "low": low, "high": high, "seeds": len(seen)})
    return points


def _draw(ax, points: list[dict], x: str, label: str, color, *, rate: bool = False) -> None:
    import numpy as np

    xs = np.array([p[x] for p in points])
    ax.plot(xs, [p["mean"] for p in points], color=color, label=label, linewidth=1.6,
            marker="o" if len(points) < 30 else None, markersize=3)
    low, high = np.array([p["low"] for p in points]), np.array([p["high"] for p in points])
    if rate:
        low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)  # NaN stays NaN
        ax.set_ylim(-0.03, 1.03)
    where = np.isfinite(low) & np.isfinite(high)
    if where.any():
        ax.fill_between(xs, np.where(where, low, 0.0), np.where(where, high, 0.0), where=where, color=color,
                        alpha=0.18, linewidth=0)


def _draw_seeds(ax, histories, key: str, x: str, color, marker: str | None = None) -> None:
    """Each seed's own curve of `key`, thin, to its last iteration (nothing for a single seed)."""
    if len(histories) < 2:
        return
    for history in histories:
        points = curve([history], key)
        if points:
            ax.plot([p[x] for p in points], [p["mean"] for p in points], color=color, alpha=0.35, linewidth=0.8,
                    marker=marker)


def _figure(rows: int, cols: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with its own Agg canvas leaves pyplot's global backend untouched.
    fig = Figure(figsize=(5.2 * cols, 3.2 * rows), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False)


def _save(fig, path: Path) -> Path:
    """Writes the PNG beside its final name and renames it: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fig.tight_layout()
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A held-out row to beat, drawn level across the held-out panels: a label, the success rate and its
    95% interval (an `experiments.eval --out` report's `success_rate`, `ci_low`, `ci_high`)."""

    label: str
    rate: float
    low: float
    high: float


def write_learning_curves(path: Path, arms: Mapping[str, Sequence[Sequence[Mapping]]],
                          baseline: Baseline | None = None) -> Path:
    """`arms`: label -> one metrics history per seed. Rows: training win rate, mean reward and (when
    logged, or a `baseline` is given) held-out success; columns: over training minutes, over iterations."""
    keys = [(k, name) for k, name in LEARNING_KEYS
            if k != "eval/success_rate" or baseline is not None or any(curve(h, k) for h in arms.values())]
    fig, axes = _figure(len(keys), 2)
    colors = _colors(len(arms))
    for row, (key, name) in enumerate(keys):
        for col, x in enumerate(("minutes", "iteration")):
            ax = axes[row][col]
            for color, (label, histories) in zip(colors, arms.items()):
                _draw_seeds(ax, histories, key, x, color)
                points = curve(histories, key, every_seed=True)
                if points:
                    seeds = f"{len(histories)} seed{'s' if len(histories) != 1 else ''}"
                    _draw(ax, points, x, f"{label} ({seeds})", color, rate=key in RATE_KEYS)
            if key == "eval/success_rate" and baseline is not None:
                ax.axhline(baseline.rate, color="0.3", linestyle="--", linewidth=1.2,
                           label=f"{baseline.label}: {baseline.rate:.3f} [{baseline.low:.3f}, {baseline.high:.3f}]")
                ax.axhspan(baseline.low, baseline.high, color="0.5", alpha=0.12, linewidth=0)
                ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("training minutes" if x == "minutes" else "iteration")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(loc="best", fontsize="x-small")
    fig.suptitle("bold: mean over seeds at the iterations every seed reached, 95% band (t over seeds; one seed: "
                 "the logged Wilson interval); thin: each seed", fontsize=9)
    return _save(fig, path)


def write_designer_curves(path: Path, arms: Mapping[str, Sequence[Sequence[Mapping]]]) -> Path:
    """One row per arm with a designer: its valid rate, in-band share and mean regret over iterations,
    each seed thin and the mean over seeds bold with its band, at the iterations every seed reached. Arms that
    logged none (a fixed pool) are named in the title."""
    colors = dict(zip(arms, _colors(len(arms))))
    designed = {label: h for label, h in arms.items() if any(curve(h, key) for key, _ in DESIGNER_KEYS)}
    fig, axes = _figure(max(len(designed), 1), len(DESIGNER_KEYS))
    without = [label for label in arms if label not in designed]
    if without:
        fig.suptitle(f"no designer metrics logged by: {', '.join(without)}", fontsize=9)
    if not designed:
        axes[0][0].text(0.5, 0.5, "no arm logged designer metrics", ha="center", va="center",
                        transform=axes[0][0].transAxes)
    for row, (label, histories) in enumerate(designed.items()):
        color = colors[label]
        for col, (key, name) in enumerate(DESIGNER_KEYS):
            ax = axes[row][col]
            _draw_seeds(ax, histories, key, "iteration", color, marker=".")
            points = curve(histories, key, every_seed=True)
            if points:
                _draw(ax, points, "iteration", "mean over seeds", color, rate=key in RATE_KEYS)
            else:
                ax.text(0.5, 0.5, "not logged by this arm", ha="center", va="center", transform=ax.transAxes,
                        fontsize=9, color="0.4")
            ax.set_title(f"{label}: {name}", fontsize=9)
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    return _save(fig, path)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]
