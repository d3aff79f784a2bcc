"""The run directory's lock: one process at a time writes a run directory.

An OS lock (`flock`) on `DIR/.lock` is released by the kernel when its holder dies, so a lock can
never outlive its process; the file also names its holder (pid, host, start time) for messages.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger("spade_jax.run")

LOCK_NAME = ".lock"


class RunDirLocked(RuntimeError):
    """Another live process holds the run directory; the message is one line naming it."""


def _describe(holder: dict) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})"


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _alive(holder: dict) -> bool:
    """Whether the holder named in the file may still run (only knowable on this host)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True  # another host: trust its lock
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Holds `DIR/.lock` from `acquire()` to `release()` (or the end of a `with` block).

    `acquire` raises RunDirLocked at once when a live process holds the lock. A lock left by a dead
    holder (a crashed or killed run) is taken over with a log line. Where the filesystem has no
    `flock` (some network filesystems, gcsfuse) the lock falls back to an exclusive create plus a
    liveness check of the recorded pid; that check works only on the holder's own host, so a lock
    left by a run that died on another host is trusted until `DIR/.lock` is emptied by hand.
    In a multi-process run only process 0 takes it (see `RunDir`).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None
        self._exclusive_file = False
        self.took_over: dict | None = None  # the dead holder whose lock was taken over, if any

    def acquire(self) -> "RunLock":
        previous = _read_holder(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _read_holder(self.path) or previous
                raise RunDirLocked(
                    f"run directory {self.path.parent} is in use by {_describe(holder)}; "
                    "wait for it to finish or choose another --out"
                ) from None
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return self._acquire_exclusive(previous)
            raise
        self._fd = fd
        if previous.get("pid") not in (None, os.getpid()):
            self.took_over = previous
            log.warning("run directory %s: took over the lock of %s, which is no longer running",
                        self.path.parent, _describe(previous))
        self._write_holder()
        return self

    def _acquire_exclusive(self, previous: dict) -> "RunLock":
        if previous and _alive(previous) and previous.get("pid") != os.getpid():
            raise RunDirLocked(
                f"run directory {self.path.parent} is in use by {_describe(previous)}; "
                "wait for it to finish or choose another --out"
            )
        if previous:
            self.took_over = previous
            log.warning("run directory %s: took over the stale lock of %s", self.path.parent, _describe(previous))
        self._exclusive_file = True
        self._write_holder()
        return self

    def _write_holder(self) -> None:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        data = json.dumps(holder).encode()
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        else:
            self.path.write_bytes(data)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # an empty file: nobody holds it
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        elif self._exclusive_file:
            self.path.write_bytes(b"")
            self._exclusive_file = False

    @property
    def held(self) -> bool:
        return self._fd is not None or self._exclusive_file

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
