"""What a person reads in a run directory, derived from its metrics: `plots/<metric>.png` and
`summary.md` (run info, final and best metrics, failures, time per phase, generated environments)."""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spade_jax.run.archive import EnvArchive, archive_stats
from spade_jax.run.records import fmt, number, plain

# Metrics drawn in plots/, in this order; only those a run logged get a figure.
PLOT_KEYS = (
    "agent/win_rate",
    "agent/mean_reward",
    "eval/success_rate",
    "designer/valid_rate",
    "designer/regret_mean",
    "curriculum/in_band_share",
    "loss",
)
# Metrics where lower is better (used for the "best" column of summary.md); a key also counts when
# it starts with one of _LOWER_IS_BETTER_PREFIXES.
_LOWER_IS_BETTER = ("loss", "train/skipped", "train/skipped_steps")
_LOWER_IS_BETTER_PREFIXES = ("agent/env_errors",)
# Failure counts summed over the run for summary.md's "Failures" section: (metric, label).
_FAILURE_COUNTS = (
    ("agent/env_errors", "plays whose environment failed"),
    ("agent/env_errors/exception", "... the program raised"),
    ("agent/env_errors/timeout", "... a call timed out"),
    ("agent/env_errors/sandbox_died", "... the sandbox worker died"),
    ("train/skipped", "updates skipped as non-finite"),
)


def write_plots(run_dir: Path, history: list[dict]) -> list[Path]:
    """plots/<metric>.png for each metric of PLOT_KEYS that was logged; returns the paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plot_dir = run_dir / "plots"
    written = []
    for key in PLOT_KEYS:
        points = [
            (r["iteration"], number(r[key]))
            for r in history
            if key in r and number(r[key]) is not None
        ]
        if not points:
            continue
        plot_dir.mkdir(exist_ok=True)
        # A Figure with its own Agg canvas leaves pyplot's global backend untouched.
        fig = Figure(figsize=(6, 3.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, linewidth=1.5)
        band = [(r["iteration"], number(r.get(f"{key}_low")), number(r.get(f"{key}_high"))) for r in history]
        band = [(x, lo, hi) for x, lo, hi in band if lo is not None and hi is not None]
        if band:  # a 95% interval logged beside the metric as <key>_low / <key>_high
            bx, lo, hi = zip(*band)
            ax.fill_between(bx, lo, hi, alpha=0.2, linewidth=0, label="95% interval")
            ax.legend(loc="best", fontsize="small")
        ax.set_xlabel("iteration")
        ax.set_ylabel(key)
        ax.set_title(key)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = plot_dir / f"{key.replace('/', '_')}.png"
        fig.savefig(path)
        written.append(path)
    pool = _pool_plot(plot_dir, history)
    return written + ([pool] if pool else [])


def _pool_plot(plot_dir: Path, history: list[dict]) -> Path | None:
    """plots/pool_win_rate.png: a fixed pool's win rate per environment (`pool/<env>/win_rate`), one line
    each; None when no such metric was logged."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = sorted({k for r in history for k in r if k.startswith("pool/") and k.endswith("/win_rate")})
    if not keys:
        return None
    plot_dir.mkdir(exist_ok=True)
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for key in keys:
        points = [(r["iteration"], number(r[key])) for r in history if number(r.get(key)) is not None]
        if points:
            xs, ys = zip(*points)
            label = key[len("pool/"):-len("/win_rate")]
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, linewidth=1.2, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("win rate")
    ax.set_title("win rate per environment of the pool")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="x-small")
    fig.tight_layout()
    path = plot_dir / "pool_win_rate.png"
    fig.savefig(path)
    return path


def write_summary(
    run_dir: Path,
    history: list[dict],
    *,
    config: Any,
    started: _dt.datetime,
    total_iterations: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """summary.md: run info, final and best metrics, phase times, env archive, plots."""
    lines = [f"# Run summary: {run_dir.name}", ""]
    info = {
        "run directory": str(run_dir),
        "started (UTC)": started.strftime("%Y-%m-%d %H:%M:%S"),
        "updated (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "iterations logged": len(history),
        "last iteration": history[-1]["iteration"] if history else None,
    }
    if total_iterations is not None:
        info["planned iterations"] = total_iterations
    config = config if isinstance(config, dict) else {}
    model = config.get("model")
    if isinstance(model, dict):
        model = model.get("name") or model.get("path")
    if isinstance(model, str):
        info["model"] = model
    for key in ("mode", "iterations", "seed"):
        if isinstance(config.get(key), (str, int)) and not isinstance(config.get(key), bool):
            info[f"config {key}"] = config[key]
    if extra:
        info.update({str(k): plain(v) for k, v in extra.items()})
    lines += [f"- **{k}**: {fmt(v) if not isinstance(v, str) else v}" for k, v in info.items()]

    keys = []
    for record in history:
        for key, value in record.items():
            if (
                key not in keys
                and key not in ("iteration", "wall_s")
                and not key.startswith("time/")
                and number(value) is not None
            ):
                keys.append(key)
    if keys:
        lines += ["", "## Metrics", "", "| metric | final | best | best at |", "|---|---|---|---|"]
        for key in keys:
            points = [
                (r["iteration"], number(r[key]))
                for r in history
                if key in r and number(r[key]) is not None and math.isfinite(number(r[key]))
            ]
            if not points:
                continue
            lower = key in _LOWER_IS_BETTER or key.startswith(_LOWER_IS_BETTER_PREFIXES)
            pick = min if lower else max
            best_it, best = pick(points, key=lambda p: p[1])
            lines.append(f"| {key} | {fmt(points[-1][1])} | {fmt(best)} | {best_it} |")

    failures = []
    for key, label in _FAILURE_COUNTS:
        values = [(r["iteration"], number(r[key])) for r in history if number(r.get(key)) is not None]
        if values:
            hit = [it for it, v in values if v > 0]
            where = f"{len(hit)} iterations, last {hit[-1]}" if hit else "none"
            failures.append(f"| {label} | {fmt(sum(v for _, v in values))} | {where} |")
    if failures:
        lines += ["", "## Failures", "", "| what | total | iterations with any |", "|---|---|---|", *failures]

    phases: dict[str, list[float]] = {}
    for record in history:
        for key, value in record.items():
            if key.startswith("time/") and number(value) is not None:
                phases.setdefault(key[len("time/"):], []).append(number(value))
    if phases:
        total_all = sum(sum(v) for v in phases.values()) or 1.0
        lines += [
            "", "## Time per phase", "",
            "| phase | mean s/iteration | total s | share |", "|---|---|---|---|",
        ]
        for name, values in sorted(phases.items(), key=lambda kv: -sum(kv[1])):
            lines.append(
                f"| {name} | {sum(values) / len(values):.3f} | {sum(values):.1f} | "
                f"{100 * sum(values) / total_all:.1f}% |"
            )

    index = run_dir / "envs" / "index.jsonl"
    if index.exists():
        stats = archive_stats(EnvArchive(run_dir).read_index())
        lines += ["", "## Generated environments (envs/index.jsonl)", ""]
        lines.append(f"- programs: {stats['count']}")
        for label in ("verdicts", "backends", "skills"):
            if stats[label]:
                counts = ", ".join(f"{k}: {v}" for k, v in sorted(stats[label].items()))
                lines.append(f"- {label}: {counts}")
        lines.append(f"- mean regret: {fmt(stats['regret_mean'])}")
        lines.append(f"- mean agent win rate: {fmt(stats['win_rate_mean'])}")

    plots = sorted((run_dir / "plots").glob("*.png")) if (run_dir / "plots").exists() else []
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
    path = run_dir / "summary.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
