"""The run directory: who may write it (lock), how it is opened (directory), what it records (metrics,
archive, report, log) and how training resumes (checkpoint)."""

from spade_jax.run.archive import EnvArchive, NullArchive, archive_stats
from spade_jax.run.directory import RunDir, RunDirError, check_writable, read_record
from spade_jax.run.lock import RunDirLocked, RunLock
from spade_jax.run.log import PhaseTimer, setup_logging
from spade_jax.run.metrics import PROGRESS_KEYS, FollowerLogger, RunLogger, read_metrics
from spade_jax.run.report import PLOT_KEYS

__all__ = [
    "PLOT_KEYS",
    "PROGRESS_KEYS",
    "CheckpointError",
    "Checkpointer",
    "EnvArchive",
    "FollowerLogger",
    "NullArchive",
    "PhaseTimer",
    "RunDir",
    "RunDirError",
    "RunDirLocked",
    "RunLock",
    "RunLogger",
    "archive_stats",
    "check_writable",
    "read_metrics",
    "read_record",
    "setup_logging",
]


def __getattr__(name):
    # Lazy: the checkpointer pulls in jax and orbax (seconds); reading metrics or the archive needs neither.
    if name in ("Checkpointer", "CheckpointError"):
        from spade_jax.run import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'spade_jax.run' has no attribute {name!r}")
