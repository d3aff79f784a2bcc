"""Opening a run directory safely: a fresh run never writes into an existing run, a resumed run
holds the lock, and a start that fails before its first iteration leaves no stub behind.

`run.json` records how the run was started and every resume (command-line overrides included), each
with the machine it ran on (`spade_jax.run.machine`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from spade_jax.run.lock import LOCK_NAME, RunLock
from spade_jax.run.machine import describe as describe_machine

log = logging.getLogger("spade_jax.run")

RECORD_NAME = "run.json"
# Files and folders a run writes; any of them means the directory already holds a run.
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "envs", RECORD_NAME, "run.log", "summary.md")


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message is one line naming it and the fix."""


def check_writable(out: Path) -> None:
    """Raises RunDirError unless `out` is (or can be made) a writable directory; creates nothing."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, not a directory; choose a directory path")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"--out {out}: {probe} is a file, so the directory cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"--out {out}: {probe} is not writable; choose a writable path")


def run_contents(out: Path) -> list[str]:
    """Names in `out` other than the lock file."""
    try:
        return sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    except FileNotFoundError:
        return []


def read_record(out: Path) -> dict[str, Any]:
    """The run's `run.json` ({} for runs made before it existed); RunDirError if it is damaged."""
    path = out / RECORD_NAME
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunDirError(f"{path} cannot be read ({err}); fix or remove it") from None
    if not isinstance(record, dict):
        raise RunDirError(f"{path} must hold a JSON object")
    return record


def write_record(out: Path, record: dict[str, Any]) -> None:
    tmp = out / f"{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / RECORD_NAME)


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


class RunDir:
    """`with RunDir(out, resume=...) as run_dir:` holds `out` for one process.

    Fresh (`resume=False`): `out` must be absent or empty; it is created and locked. Resume: `out`
    must hold a run (a `config.yaml`); it is locked. Either way a second process is refused at once
    (RunDirLocked). If a fresh run's block fails before `mark_progress()`, what it wrote is removed
    (and the directory too when this call created it), so a failed start leaves nothing behind.

    In a multi-process run (jax.distributed) every process enters it together: the leader (process 0)
    does all of the above and the others touch nothing; an error the leader meets is raised by all.
    """

    def __init__(self, out: str | os.PathLike, *, resume: bool, config_name: str | None = None,
                 overrides: tuple[str, ...] | list[str] = ()):
        self.out = Path(out)
        self.resume = resume
        self.config_name = config_name
        self.overrides = list(overrides)
        self.created = False
        self.progressed = False
        self.lock = RunLock(self.out)

    def __enter__(self) -> "RunDir":
        if "jax" not in sys.modules:  # jax.distributed needs jax: without it this is the only process
            self._open()
            return self
        from spade_jax import distributed

        distributed.leader_only(self._open)
        return self

    def _open(self) -> None:
        check_writable(self.out)
        if self.resume:
            if not (self.out / "config.yaml").is_file():
                raise RunDirError(f"--resume: {self.out} holds no run (no config.yaml); start it without --resume")
        else:
            self._refuse_existing_run()  # before the lock file is created: nothing here is touched
            self.created = not self.out.exists()
            try:
                self.out.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise RunDirError(f"cannot create run directory {self.out} ({err.strerror})") from None
        try:
            self.lock.acquire()
        except OSError as err:
            raise RunDirError(f"cannot lock run directory {self.out} ({err.strerror})") from None
        try:
            self._record_start()
        except BaseException:
            self.lock.release()
            raise

    def _record_start(self) -> None:
        if self.resume:
            read_record(self.out)  # a damaged run.json is reported before any work
            return
        self._refuse_existing_run()  # again, under the lock: another start may have won the race
        write_record(self.out, {"config": self.config_name, "overrides": self.overrides, "created": _now(),
                                "machine": describe_machine(), "resumes": []})

    def _refuse_existing_run(self) -> None:
        existing = run_contents(self.out)
        if existing:
            marked = [name for name in existing if name in RUN_MARKERS]
            if marked:
                raise RunDirError(
                    f"{self.out} already holds a run ({', '.join(marked[:3])}); continue it with --resume "
                    "or choose a new --out"
                )
            raise RunDirError(f"{self.out} is not empty ({', '.join(existing[:3])}); choose a new or empty --out")

    def record_resume(self) -> None:
        """Appends this resume and its overrides to run.json; call it when the resumed config is written."""
        if self.resume and self.lock.held:  # only the leader of a multi-process run holds it
            record = read_record(self.out)
            record.setdefault("resumes", []).append({"time": _now(), "overrides": self.overrides,
                                                     "machine": describe_machine()})
            write_record(self.out, record)

    def mark_progress(self) -> None:
        """Something worth keeping exists (an iteration logged): never remove the directory now."""
        self.progressed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.lock.held:
            return  # a process other than the leader: it wrote nothing
        if exc_type is not None and not self.resume and not self.progressed:
            # Everything here is this start's own (the directory was absent or empty): remove it.
            for child in self.out.iterdir():
                if child.name != LOCK_NAME:
                    shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
            self.lock.release()
            (self.out / LOCK_NAME).unlink(missing_ok=True)
            if self.created:
                shutil.rmtree(self.out, ignore_errors=True)
            log.debug("cleaned %s: the run failed before its first iteration", self.out)
            return
        self.lock.release()
