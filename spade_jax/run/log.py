"""Package logging (one line per event to stderr, through a live progress bar, and to run.log) and
per-phase wall-clock timing of an iteration (`time/<phase>` metrics)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

_PACKAGE_LOGGER = "spade_jax"
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TqdmAwareHandler(logging.StreamHandler):
    """Stderr handler that prints through tqdm so log lines do not break a live progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never raise into the caller
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
