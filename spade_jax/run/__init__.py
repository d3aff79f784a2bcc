"""The run directory: who may write it (lock), how it is opened fresh or resumed (directory)."""

from spade_jax.run.directory import RunDir, RunDirError, check_writable, read_record
from spade_jax.run.lock import RunDirLocked, RunLock

__all__ = ["RunDir", "RunDirError", "RunDirLocked", "RunLock", "check_writable", "read_record"]
