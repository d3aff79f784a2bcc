"""Run directory output: config.yaml, metrics.jsonl, TensorBoard events, progress bar, plots,
summary.md, the archive of generated environments (envs/), phase timing and package logging."""

# This module shadows the stdlib name only as `spade_jax.logging`; absolute imports keep
# `import logging` below (and in every other module of the package) bound to the stdlib.
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PLOT_KEYS",
    "PROGRESS_KEYS",
    "EnvArchive",
    "PhaseTimer",
    "RunLogger",
    "read_metrics",
    "setup_logging",
]

# Metrics drawn in plots/, in this order; only those a run logged get a figure.
PLOT_KEYS = (
    "agent/win_rate",
    "designer/valid_rate",
    "designer/regret_mean",
    "curriculum/in_band_share",
    "loss",
)
# Metrics shown in the progress bar's postfix when present.
PROGRESS_KEYS = ("loss", "agent/win_rate", "designer/valid_rate", "designer/regret_mean")
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

_PACKAGE_LOGGER = "spade_jax"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# ----------------------------------------------------------------------------- helpers


def _plain(value: Any) -> Any:
    """JSON/YAML-safe copy: dataclasses to dicts, tuples to lists, array scalars to numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    # numpy / jax arrays: scalars via .item(), small arrays as lists; anything else as text.
    if getattr(value, "ndim", 0) and callable(getattr(value, "tolist", None)):
        return _plain(value.tolist())
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def _number(value: Any) -> float | None:
    """The value as a float when it is a real scalar (bools and NaN included), else None."""
    value = _plain(value)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _json_line(record: Mapping[str, Any]) -> str:
    # NaN/inf are not JSON; store them as null so every reader can parse the file.
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(_plain(record)), ensure_ascii=False) + "\n"


def _read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return []
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All records of `run_dir/metrics.jsonl`, in file order."""
    return _read_jsonl(Path(run_dir) / "metrics.jsonl")


# ----------------------------------------------------------------------------- python logging


class _TqdmAwareHandler(logging.StreamHandler):
    """Stderr handler that prints through tqdm so log lines do not break a live progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def setup_logging(
    run_dir: str | os.PathLike | None = None, level: int | str = "INFO"
) -> logging.Logger:
    """Configure the `spade_jax` logger: one line per event to stderr and, with a run
    directory, to `run_dir/run.log`. Calling it again replaces the handlers it added."""
    logger = logging.getLogger(_PACKAGE_LOGGER)
    logger.setLevel(level)
    for handler in list(logger.handlers):
        if getattr(handler, "_spade_jax_handler", False):
            logger.removeHandler(handler)
            handler.close()
    formatter = logging.Formatter(_LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [_TqdmAwareHandler(sys.stderr)]
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(run_dir) / "run.log", encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._spade_jax_handler = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    # The package logger owns its output; letting records reach the root would print twice.
    logger.propagate = False
    return logger


# ----------------------------------------------------------------------------- phase timing


class PhaseTimer:
    """Wall-clock seconds per phase of one iteration: `with timer.phase("designer"): ...`;
    `pop()` returns `{"time/designer": s, ...}` and starts the next iteration at zero."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not name or "/" in name:
            raise ValueError(f"phase name must be non-empty without '/', got {name!r}")
        start = time.perf_counter()
        try:
            yield
        finally:
            # Re-entering a phase in the same iteration adds up (e.g. several designer calls).
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{name}": seconds for name, seconds in self._seconds.items()}

    def pop(self) -> dict[str, float]:
        out = self.metrics()
        self._seconds = {}
        return out


# ----------------------------------------------------------------------------- env archive


_ENV_ID = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


class EnvArchive:
    """`run_dir/envs/`: every generated program as `<env_id>.py` and `index.jsonl`, one
    `add` line per program and `update` lines for fields learned later (regret, win rate)."""

    # Fields every add record carries (None when unknown), so readers can rely on the keys.
    FIELDS = ("verdict", "backend", "errors", "regret", "win_rate", "skill", "iteration", "hint")

    def __init__(self, run_dir: str | os.PathLike, *, start_iteration: int | None = None):
        self.dir = Path(run_dir) / "envs"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index_path = self.dir / "index.jsonl"
        lines = _read_jsonl(self.index_path)
        if start_iteration is not None:
            lines = self._drop_from(lines, start_iteration)
        self._ids = {line["env_id"] for line in lines
                     if line.get("event", "add") == "add" and "env_id" in line}
        self._count = len(self._ids)

    def _drop_from(self, lines: list[dict], start_iteration: int) -> list[dict]:
        """On resume, forget programs added at iterations >= start_iteration (they are redone)."""
        dropped = {
            line["env_id"]
            for line in lines
            if line.get("event", "add") == "add"
            and isinstance(line.get("iteration"), int)
            and line["iteration"] >= start_iteration
        }
        if not dropped:
            return lines
        kept = [line for line in lines if line.get("env_id") not in dropped]
        self._rewrite(kept)
        for env_id in dropped:
            (self.dir / f"{env_id}.py").unlink(missing_ok=True)
        return kept

    def _rewrite(self, lines: list[dict]) -> None:
        tmp = self.index_path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(_json_line(line) for line in lines)
        os.replace(tmp, self.index_path)

    def _append(self, line: Mapping[str, Any]) -> None:
        with self.index_path.open("a", encoding="utf-8") as f:
            f.write(_json_line(line))
            f.flush()

    def add(self, program_source: str, record: Mapping[str, Any]) -> str:
        """Store one program and its record; returns its env id: `record["env_id"]` when the
        caller names it (so later `update` calls can use the caller's id), else a new one
        (`it00012-00345`). A boolean `valid` without `verdict` sets verdict valid/invalid."""
        if not isinstance(program_source, str):
            raise ValueError(f"program_source must be a str, got {type(program_source).__name__}")
        env_id = record.get("env_id")
        if env_id is None:
            iteration = record.get("iteration")
            prefix = f"it{int(iteration):05d}-" if isinstance(iteration, int) else "env-"
            env_id = f"{prefix}{self._count:05d}"
        elif not isinstance(env_id, str) or not _ENV_ID.fullmatch(env_id):
            raise ValueError(f"env_id {env_id!r} must be letters, digits, '_', '-' or '.'")
        if env_id in self._ids:
            raise ValueError(f"env_id {env_id!r} is already in the archive; ids must be unique")
        self._ids.add(env_id)
        self._count += 1
        (self.dir / f"{env_id}.py").write_text(program_source, encoding="utf-8")
        line = {"event": "add", "env_id": env_id, "path": f"envs/{env_id}.py"}
        line.update({field: None for field in self.FIELDS})
        line.update({k: v for k, v in record.items() if k not in ("event", "env_id", "path")})
        if line["verdict"] is None and isinstance(line.get("valid"), bool):
            line["verdict"] = "valid" if line["valid"] else "invalid"
        self._append(line)
        return env_id

    def update(self, env_id: str, **fields: Any) -> None:
        """Record fields learned after the program was added; `read_index` folds them in."""
        if not fields:
            raise ValueError("update needs at least one field, e.g. update(env_id, regret=0.2)")
        reserved = {"event", "env_id", "path"} & set(fields)
        if reserved:
            raise ValueError(f"fields {sorted(reserved)} are managed by the archive; rename them")
        self._append({"event": "update", "env_id": env_id, **fields})

    def read_index(self) -> list[dict]:
        """One dict per stored program, in the order added, with all updates folded in."""
        by_id: dict[str, dict] = {}
        for line in _read_jsonl(self.index_path):
            env_id = line.get("env_id")
            if env_id is None:
                continue
            fields = {k: v for k, v in line.items() if k != "event"}
            if line.get("event", "add") == "add":
                by_id[env_id] = fields
            elif env_id in by_id:
                by_id[env_id].update(fields)
        return list(by_id.values())

    def source(self, env_id: str) -> str:
        return (self.dir / f"{env_id}.py").read_text(encoding="utf-8")

    def __len__(self) -> int:
        return self._count


def archive_stats(entries: list[dict]) -> dict[str, Any]:
    """Counts and means over archived environments for summary.md."""

    def mean(key: str) -> float | None:
        values = [_number(e.get(key)) for e in entries]
        values = [v for v in values if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    verdicts: dict[str, int] = {}
    backends: dict[str, int] = {}
    skills: dict[str, int] = {}
    for e in entries:
        verdicts[str(e.get("verdict"))] = verdicts.get(str(e.get("verdict")), 0) + 1
        if e.get("backend") is not None:
            backends[str(e["backend"])] = backends.get(str(e["backend"]), 0) + 1
        if e.get("skill") is not None:
            skills[str(e["skill"])] = skills.get(str(e["skill"]), 0) + 1
    return {
        "count": len(entries),
        "verdicts": verdicts,
        "backends": backends,
        "skills": skills,
        "regret_mean": mean("regret"),
        "win_rate_mean": mean("win_rate"),
    }


# ----------------------------------------------------------------------------- run logger


def _fmt(value: Any) -> str:
    number = _number(value)
    if number is None:
        return "-" if value is None else str(value)
    if number != number:
        return "nan"
    if float(number).is_integer() and abs(number) < 1e9:
        return str(int(number))
    return f"{number:.4g}"


class RunLogger:
    """Writes a run directory as iterations finish: `log(iteration, metrics)` per iteration,
    `close()` at the end (plots and summary.md are also refreshed every `plot_every`)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config_dict: Any,
        *,
        tensorboard: bool = True,
        progress: bool = True,
        total_iterations: int | None = None,
        start_iteration: int = 0,
        plot_every: int = 10,
    ):
        if start_iteration < 0:
            raise ValueError(f"start_iteration must be >= 0, got {start_iteration}")
        if plot_every < 1:
            raise ValueError(f"plot_every must be >= 1, got {plot_every}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config = _plain(config_dict)
        self.start_iteration = start_iteration
        self.total_iterations = total_iterations
        self.plot_every = plot_every
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = time.perf_counter()
        self.logger = logging.getLogger(f"{_PACKAGE_LOGGER}.run")

        self._write_config()
        self.metrics_path = self.run_dir / "metrics.jsonl"
        # Resume: keep only iterations before the resumed one, so none is logged twice.
        self.history = [
            r for r in read_metrics(self.run_dir)
            if isinstance(r.get("iteration"), int) and r["iteration"] < start_iteration
        ]
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(_json_line(r) for r in self.history)
        os.replace(tmp, self.metrics_path)
        self._metrics_file = self.metrics_path.open("a", encoding="utf-8")

        self._writer = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            # purge_step hides events of iterations >= start_iteration left by the crashed run.
            self._writer = SummaryWriter(
                logdir=str(self.run_dir / "tensorboard"),
                purge_step=start_iteration if start_iteration > 0 else None,
                flush_secs=30,
            )
        self._bar = None
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_iterations,
                initial=start_iteration,
                desc="spade",
                unit="it",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        self._envs: EnvArchive | None = None

    # -- files written once

    def _write_config(self) -> None:
        import yaml

        with (self.run_dir / "config.yaml").open("w", encoding="utf-8") as f:
            yaml.safe_dump(self.config, f, sort_keys=False, default_flow_style=False)

    @property
    def envs(self) -> EnvArchive:
        """The run's environment archive (created on first use; resumes like metrics)."""
        if self._envs is None:
            self._envs = EnvArchive(self.run_dir, start_iteration=self.start_iteration)
        return self._envs

    # -- per iteration

    def log(self, iteration: int, metrics: Mapping[str, Any]) -> dict:
        """Append one iteration's metrics everywhere; returns the stored record."""
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be an int >= 0, got {iteration!r}")
        if self.history and iteration <= self.history[-1]["iteration"]:
            raise ValueError(
                f"iteration {iteration} already logged (last is {self.history[-1]['iteration']}); "
                "pass start_iteration=<resumed iteration> to RunLogger when resuming"
            )
        # The iteration argument wins over an "iteration" key inside metrics.
        record = {"iteration": iteration}
        record.update({k: v for k, v in _plain(dict(metrics)).items() if k != "iteration"})
        record.setdefault("wall_s", round(time.perf_counter() - self._t0, 3))
        self._metrics_file.write(_json_line(record))
        self._metrics_file.flush()
        self.history.append(record)

        if self._writer is not None:
            for key, value in record.items():
                number = _number(value)
                if key != "iteration" and number is not None:
                    self._writer.add_scalar(key, number, global_step=iteration)
        if self._bar is not None:
            postfix = {
                key.split("/")[-1]: _fmt(record[key]) for key in PROGRESS_KEYS if key in record
            }
            self._bar.set_postfix(postfix, refresh=False)
            self._bar.update(1)
        # Plots and summary are cheap next to an iteration, but not free: refresh periodically.
        if (iteration + 1) % self.plot_every == 0:
            self.write_plots()
            self.write_summary()
        return record

    # -- derived files

    def write_plots(self) -> list[Path]:
        """plots/<metric>.png for each metric of PLOT_KEYS that was logged; returns the paths."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        plot_dir = self.run_dir / "plots"
        written = []
        for key in PLOT_KEYS:
            points = [
                (r["iteration"], _number(r[key]))
                for r in self.history
                if key in r and _number(r[key]) is not None
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
            ax.set_xlabel("iteration")
            ax.set_ylabel(key)
            ax.set_title(key)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            path = plot_dir / f"{key.replace('/', '_')}.png"
            fig.savefig(path)
            written.append(path)
        return written

    def write_summary(self, extra: Mapping[str, Any] | None = None) -> Path:
        """summary.md: run info, final and best metrics, phase times, env archive, plots."""
        lines = [f"# Run summary: {self.run_dir.name}", ""]
        info = {
            "run directory": str(self.run_dir),
            "started (UTC)": self.started.strftime("%Y-%m-%d %H:%M:%S"),
            "updated (UTC)": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "iterations logged": len(self.history),
            "last iteration": self.history[-1]["iteration"] if self.history else None,
        }
        if self.total_iterations is not None:
            info["planned iterations"] = self.total_iterations
        config = self.config if isinstance(self.config, dict) else {}
        model = config.get("model")
        if isinstance(model, dict):
            model = model.get("name") or model.get("path")
        if isinstance(model, str):
            info["model"] = model
        for key in ("mode", "iterations", "seed"):
            if isinstance(config.get(key), (str, int)) and not isinstance(config.get(key), bool):
                info[f"config {key}"] = config[key]
        if extra:
            info.update({str(k): _plain(v) for k, v in extra.items()})
        lines += [f"- **{k}**: {_fmt(v) if not isinstance(v, str) else v}" for k, v in info.items()]

        keys = []
        for record in self.history:
            for key, value in record.items():
                if (
                    key not in keys
                    and key not in ("iteration", "wall_s")
                    and not key.startswith("time/")
                    and _number(value) is not None
                ):
                    keys.append(key)
        if keys:
            lines += ["", "## Metrics", "", "| metric | final | best | best at |", "|---|---|---|---|"]
            for key in keys:
                points = [
                    (r["iteration"], _number(r[key]))
                    for r in self.history
                    if key in r and _number(r[key]) is not None and math.isfinite(_number(r[key]))
                ]
                if not points:
                    continue
                lower = key in _LOWER_IS_BETTER or key.startswith(_LOWER_IS_BETTER_PREFIXES)
                pick = min if lower else max
                best_it, best = pick(points, key=lambda p: p[1])
                lines.append(f"| {key} | {_fmt(points[-1][1])} | {_fmt(best)} | {best_it} |")

        failures = []
        for key, label in _FAILURE_COUNTS:
            values = [(r["iteration"], _number(r[key])) for r in self.history if _number(r.get(key)) is not None]
            if values:
                hit = [it for it, v in values if v > 0]
                where = f"{len(hit)} iterations, last {hit[-1]}" if hit else "none"
                failures.append(f"| {label} | {_fmt(sum(v for _, v in values))} | {where} |")
        if failures:
            lines += ["", "## Failures", "", "| what | total | iterations with any |", "|---|---|---|", *failures]

        phases: dict[str, list[float]] = {}
        for record in self.history:
            for key, value in record.items():
                if key.startswith("time/") and _number(value) is not None:
                    phases.setdefault(key[len("time/"):], []).append(_number(value))
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

        index = self.run_dir / "envs" / "index.jsonl"
        if index.exists():
            stats = archive_stats(EnvArchive(self.run_dir).read_index())
            lines += ["", "## Generated environments (envs/index.jsonl)", ""]
            lines.append(f"- programs: {stats['count']}")
            for label in ("verdicts", "backends", "skills"):
                if stats[label]:
                    counts = ", ".join(f"{k}: {v}" for k, v in sorted(stats[label].items()))
                    lines.append(f"- {label}: {counts}")
            lines.append(f"- mean regret: {_fmt(stats['regret_mean'])}")
            lines.append(f"- mean agent win rate: {_fmt(stats['win_rate_mean'])}")

        plots = sorted((self.run_dir / "plots").glob("*.png")) if (self.run_dir / "plots").exists() else []
        if plots:
            lines += ["", "## Plots", ""]
            lines += [f"![{p.stem}](plots/{p.name})" for p in plots]
        path = self.run_dir / "summary.md"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def close(self, extra: Mapping[str, Any] | None = None) -> None:
        """Flush and close everything; writes the final plots and summary.md."""
        self.write_plots()
        self.write_summary(extra)
        if not self._metrics_file.closed:
            self._metrics_file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
