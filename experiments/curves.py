"""Learning curves of finished (or running) run directories: mean over seeds with a 95% band.

  python -m experiments.curves runs/lap-s0 runs/lap-s1 runs/lap-s2 --out curves.png
  python -m experiments.curves --arm "fixed pool=runs/fp-s0,runs/fp-s1" --arm "SPADE=runs/sp-s0,runs/sp-s1" --out c.png
  python -m experiments.curves runs/lap-s0 runs/lap-s1 --baseline base_small.json --out c.png

Writes the PNG experiments.compare draws (training win rate, mean reward and, when logged, held-out
success; over training minutes and over iterations) and prints, per arm and iteration, the mean over
the seeds that reached it with its t-band (a markdown table, for docs/results.md). `--baseline` draws a
model's held-out row (an `experiments.eval --out` report, such as the base model's on the runs' suite) as
a level line with its interval across the held-out panels.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

TABLE_KEYS = (("agent/win_rate", "win rate"), ("agent/mean_reward", "mean reward"),
              ("eval/success_rate", "held-out success"))


class UsageError(ValueError):
    """A bad command line or run directory; printed as one line, exit status 2."""


def _histories(dirs: list[str]) -> list[list[dict]]:
    from spade_jax.run import read_metrics

    histories = []
    for name in dirs:
        path = Path(name)
        if not (path / "metrics.jsonl").is_file():
            raise UsageError(f"{path} holds no metrics.jsonl; pass run directories of python -m experiments.run")
        try:
            records = [r for r in read_metrics(path) if isinstance(r.get("iteration"), int)]
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read {path / 'metrics.jsonl'}: {err}") from None
        if not records:
            raise UsageError(f"{path / 'metrics.jsonl'} has no finished iteration yet")
        histories.append(records)
    return histories


def _cell(point: dict | None) -> str:
    if point is None:
        return ""
    if math.isfinite(point["low"]):
        return f"{point['mean']:.3f} [{point['low']:.3f}, {point['high']:.3f}]"
    return f"{point['mean']:.3f}"


def table(arms: dict[str, list[list[dict]]]) -> str:
    """Markdown: one row per (arm, iteration), the seeds that reached it, mean minutes, each key's mean [band]."""
    from spade_jax.run.curves import curve

    keys = [(k, name) for k, name in TABLE_KEYS if any(curve(h, k) for h in arms.values())]
    lines = ["| arm | iteration | seeds | minutes | " + " | ".join(name for _, name in keys) + " |",
             "|---|---|---|---|" + "---|" * len(keys)]
    for label, histories in arms.items():
        curves = {k: {p["iteration"]: p for p in curve(histories, k)} for k, _ in keys}
        for i in sorted({i for points in curves.values() for i in points}):
            reached = next(points[i] for points in curves.values() if i in points)
            cells = [_cell(curves[k].get(i)) for k, _ in keys]
            lines.append(f"| {label} | {i} | {reached['seeds']} | {reached['minutes']:.1f} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="run directories: the seeds of one arm")
    ap.add_argument("--label", default="run", help="the arm's name for the positional runs")
    ap.add_argument("--arm", action="append", default=[], metavar="LABEL=DIR,DIR",
                    help="another arm: its label (no \"=\") and its seeds' run directories (repeatable)")
    ap.add_argument("--baseline", metavar="REPORT",
                    help="an experiments.eval --out JSON report (the base model's, say) drawn as a level line "
                         "with its 95%% interval on the held-out panels")
    ap.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    try:
        specs = ([(args.label, args.runs)] if args.runs else []) + [_parse_arm(a) for a in args.arm]
        if not specs:
            raise UsageError("name at least one run directory (or --arm LABEL=DIR,DIR)")
        arms = {label: _histories(dirs) for label, dirs in specs}
        if len(arms) != len(specs):
            raise UsageError("two arms share a label")
        out = Path(args.out)
        if not out.parent.is_dir():
            raise UsageError(f"{out.parent} does not exist")
        baseline = _baseline(Path(args.baseline)) if args.baseline else None
        from spade_jax.run.curves import write_learning_curves

        write_learning_curves(out, arms, baseline)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(arms))
    print(f"\nwrote {out}")
    return 0


def _baseline(path: Path):
    """The held-out row of an experiments.eval report: its model (or run) and suite name the line."""
    from spade_jax.run.curves import Baseline

    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"--baseline {path}: cannot read it as JSON ({err.__class__.__name__})") from None
    try:
        rate, low, high = (float(report[k]) for k in ("success_rate", "ci_low", "ci_high"))
    except (TypeError, KeyError, ValueError):
        raise UsageError(f"--baseline {path}: not an experiments.eval report "
                         "(no success_rate, ci_low, ci_high)") from None
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in (rate, low, high)) or not low <= rate <= high:
        raise UsageError(f"--baseline {path}: success_rate {rate} with interval [{low}, {high}] "
                         "is not a rate in its interval")
    source = report.get("source") if isinstance(report.get("source"), dict) else {}
    name = Path(str(source["run"])).name if source.get("run") else source.get("model") or path.stem
    suite = report.get("suite")
    return Baseline(f"{name} on {suite}" if suite else str(name), rate, low, high)


def _parse_arm(text: str) -> tuple[str, list[str]]:
    label, sep, dirs = text.partition("=")
    if not sep or not label.strip() or not dirs.strip():
        raise UsageError(f"--arm {text!r}: expected LABEL=DIR[,DIR...]")
    return label.strip(), [d for d in dirs.split(",") if d]


if __name__ == "__main__":
    sys.exit(main())
