"""SandboxConfig: the sandbox's knobs (time, memory, process, file and output limits, pool size, which
isolation layers to use), validated when built."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    # Wall-clock limit of one reset/step/solution call, seconds (SPADE: 30 s per step).
    call_timeout_s: float = 30.0
    # Wall-clock limit for loading a program (executing its module body and constructor).
    load_timeout_s: float = 30.0
    # Wall-clock limit for a fresh worker to start and report ready (generous: a loaded host
    # can take seconds to start Python and import numpy).
    start_timeout_s: float = 60.0
    # Address-space limit of a worker, MiB (RLIMIT_AS; allocations beyond raise MemoryError).
    memory_mb: int = 1024
    # CPU seconds a worker may use over its whole life (RLIMIT_CPU; SIGKILL after).
    cpu_seconds: int = 600
    # Processes/threads the worker's uid may hold (RLIMIT_NPROC; enforced for non-root uids).
    nproc: int = 16
    # Largest file the program may write in its scratch dir, MiB (RLIMIT_FSIZE).
    fsize_mb: int = 16
    # Open file descriptors (RLIMIT_NOFILE).
    nofile: int = 64
    # Size of the private scratch tmpfs (/tmp inside the sandbox), MiB.
    scratch_mb: int = 64
    # Largest reply a worker may send, bytes; a larger one kills the worker.
    max_output_bytes: int = 4 << 20
    # Longest observation accepted from reset/step, characters.
    max_obs_chars: int = 100_000
    # Largest action or source sent to a worker, characters.
    max_input_chars: int = 1_000_000
    # Idle workers kept started and waiting for a program (loads take one, a new one starts).
    workers: int = 2
    # Most live workers (idle + loaded); load() raises beyond it.
    max_workers: int = 256
    # Run untrusted code even when no namespace isolation is available (unsafe).
    allow_unisolated: bool = False
    # Which isolation to use: "auto" (strongest available), "bwrap", "unshare" or "none".
    isolation: str = "auto"
    # Deny dangerous syscalls with a seccomp filter when pyseccomp and libseccomp exist.
    seccomp: bool = True
    # Put each worker in its own pids/memory cgroup (v1) when the host lets us create them.
    cgroups: bool = True
    # First uid of the unprivileged uids the workers run as when the host is root.
    uid_base: int = 210_000

    def __post_init__(self):
        for name in ("call_timeout_s", "load_timeout_s", "start_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):  # NaN fails too
                raise ValueError(f"SandboxConfig.{name} must be a finite number > 0, got {getattr(self, name)}")
        for name in ("memory_mb", "cpu_seconds", "nproc", "fsize_mb", "nofile", "scratch_mb",
                     "max_output_bytes", "max_obs_chars", "max_input_chars", "max_workers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"SandboxConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.memory_mb < 128:
            raise ValueError(f"SandboxConfig.memory_mb must be >= 128 (Python and numpy need it), got {self.memory_mb}")
        if self.nofile < 16:
            raise ValueError(f"SandboxConfig.nofile must be >= 16, got {self.nofile}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"SandboxConfig.workers must be an int >= 0, got {self.workers!r}")
        if self.isolation not in ("auto", "bwrap", "unshare", "none"):
            raise ValueError(
                f"SandboxConfig.isolation must be auto, bwrap, unshare or none, got {self.isolation!r}"
            )
        if not 1000 <= self.uid_base <= 2**31 - 100_000:
            raise ValueError(f"SandboxConfig.uid_base must be in [1000, 2**31 - 100000], got {self.uid_base}")
