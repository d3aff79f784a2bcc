"""A run's per-iteration record: config.yaml once, then one metrics.jsonl line, TensorBoard scalars
and a progress-bar step per iteration; resumes drop iterations that will be redone."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spade_jax.run import report
from spade_jax.run.archive import EnvArchive, NullArchive
from spade_jax.run.records import fmt, json_line, number, plain, read_jsonl

# Metrics shown in the progress bar's postfix when present.
PROGRESS_KEYS = ("loss", "agent/win_rate", "designer/valid_rate", "designer/regret_mean")


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All records of `run_dir/metrics.jsonl`, in file order."""
    return read_jsonl(Path(run_dir) / "metrics.jsonl")


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
        plot_every: int = 1,
    ):
        if start_iteration < 0:
            raise ValueError(f"start_iteration must be >= 0, got {start_iteration}")
        if plot_every < 1:
            raise ValueError(f"plot_every must be >= 1, got {plot_every}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config = plain(config_dict)
        self.start_iteration = start_iteration
        self.total_iterations = total_iterations
        self.plot_every = plot_every
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = time.perf_counter()
        self.logger = logging.getLogger("spade_jax.run")

        self._write_config()
        self.metrics_path = self.run_dir / "metrics.jsonl"
        # Resume: keep only iterations before the resumed one, so none is logged twice.
        self.history = [
            r for r in read_metrics(self.run_dir)
            if isinstance(r.get("iteration"), int) and r["iteration"] < start_iteration
        ]
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(json_line(r) for r in self.history)
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
        record.update({k: v for k, v in plain(dict(metrics)).items() if k != "iteration"})
        record.setdefault("wall_s", round(time.perf_counter() - self._t0, 3))
        self._metrics_file.write(json_line(record))
        self._metrics_file.flush()
        self.history.append(record)

        if self._writer is not None:
            for key, value in record.items():
                as_number = number(value)
                if key != "iteration" and as_number is not None:
                    self._writer.add_scalar(key, as_number, global_step=iteration)
        if self._bar is not None:
            postfix = {
                key.split("/")[-1]: fmt(record[key]) for key in PROGRESS_KEYS if key in record
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
        """plots/<metric>.png for each metric of report.PLOT_KEYS that was logged; returns the paths."""
        return report.write_plots(self.run_dir, self.history)

    def write_summary(self, extra: Mapping[str, Any] | None = None) -> Path:
        """summary.md: run info, final and best metrics, phase times, env archive, plots."""
        return report.write_summary(
            self.run_dir, self.history, config=self.config, started=self.started,
            total_iterations=self.total_iterations, extra=extra,
        )

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


class FollowerLogger:
    """What processes other than the leader hold in place of a RunLogger in a multi-process run:
    the same calls, no files (the leader writes metrics, the archive, plots and summary.md)."""

    def __init__(self) -> None:
        self.envs = NullArchive()
        self.history: list[dict] = []

    def log(self, iteration: int, metrics: Mapping[str, Any]) -> dict:
        record = {"iteration": iteration, **{k: v for k, v in plain(dict(metrics)).items() if k != "iteration"}}
        self.history.append(record)
        return record

    def close(self, extra: Mapping[str, Any] | None = None) -> None:
        pass

    def __enter__(self) -> FollowerLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
