"""Out-of-process sandbox for untrusted environment programs: isolation detection, a pool of
long-lived workers (one program each) and TextEnv proxies whose reset/step are cheap RPCs."""

from __future__ import annotations

import atexit
import dataclasses
import errno
import functools
import itertools
import json
import logging
import operator
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Iterable, Sequence

__all__ = [
    "SandboxConfig",
    "SandboxPool",
    "SandboxEnv",
    "SandboxError",
    "SandboxUnavailable",
    "EnvError",
    "EnvTimeout",
    "EnvCrashed",
    "detect_isolation",
    "default_pool",
]

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
_WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_worker.py")
# Modules the worker imports before the program arrives, so loading a program costs nothing
# for them and numpy's start-up (OpenBLAS buffers) happens before the memory limit.
_PREIMPORT = (
    "numpy", "random", "math", "re", "json", "itertools", "functools", "collections",
    "string", "heapq", "bisect", "copy", "dataclasses", "typing", "enum", "fractions",
    "statistics", "textwrap", "operator", "inspect", "hashlib", "decimal", "datetime", "abc",
)
# Environment inside the sandbox: nothing from the host survives.
_SANDBOX_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONHASHSEED": "0",  # same seed, same episode in every worker (set/dict-of-str order)
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",  # numpy must not start threads (threads are denied)
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# Syscalls denied (EPERM) to the program: no network, no new programs or processes or
# threads, no debugging of others, no namespace or mount games, no kernel attack surface.
_SECCOMP_DENY = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "execve", "execveat", "fork", "vfork", "clone", "ptrace", "process_vm_readv",
    "process_vm_writev", "mount", "umount2", "unshare", "setns", "chroot", "pivot_root",
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "name_to_handle_at", "open_by_handle_at", "syslog", "quotactl", "pidfd_open",
    "pidfd_getfd", "memfd_secret",
)


# --------------------------------------------------------------------------------------------
# errors


class SandboxError(RuntimeError):
    """Base class of sandbox failures; the message is one line."""


class SandboxUnavailable(SandboxError):
    """The machine offers no isolation and the config does not allow running without it."""


class EnvError(SandboxError):
    """The environment program raised or broke the TextEnv contract during a call."""


class EnvTimeout(EnvError):
    """A call did not return in time; its worker was killed."""


class EnvCrashed(EnvError):
    """The worker died (signal, exit, limit) or spoke garbage; it was killed."""


# --------------------------------------------------------------------------------------------
# config


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


# --------------------------------------------------------------------------------------------
# what the machine offers


def _run_quiet(cmd: Sequence[str], timeout: float = 10.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, env=_SANDBOX_ENV)
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def _system_python() -> tuple[str, str] | None:
    """(interpreter, prefix to bind) for the sandbox: Debian's /usr/bin/python3 when it is the
    host's minor version (numpy's binary ABI), else the host's own base interpreter."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in ("/usr/bin/python3", f"/usr/bin/python{want}"):
        if os.path.exists(candidate):
            out = _run_quiet([candidate, "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            if out is not None and out.returncode == 0 and out.stdout.decode().strip() == want:
                return candidate, ""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return base, os.path.realpath(sys.base_prefix)


@functools.lru_cache(maxsize=None)
def _numpy_dirs() -> tuple[str, ...]:
    try:
        import numpy
    except ImportError:
        return ()
    pkg = os.path.dirname(os.path.realpath(numpy.__file__))
    libs = pkg + ".libs"
    return (pkg, libs) if os.path.isdir(libs) else (pkg,)


@functools.lru_cache(maxsize=None)
def _seccomp_program() -> bytes | None:
    """BPF bytes of the deny-list, compiled on the host with pyseccomp, or None."""
    try:
        import pyseccomp as sc
    except Exception:  # missing package or missing libseccomp.so
        return None
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in _SECCOMP_DENY:
            try:
                flt.add_rule(sc.ERRNO(errno.EPERM), name)
            except Exception:  # syscall unknown on this architecture
                pass
        try:
            # glibc falls back to clone (denied above) when clone3 says ENOSYS.
            flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        except Exception:
            pass
        with tempfile.TemporaryFile() as f:
            flt.export_bpf(f)
            f.seek(0)
            return f.read()
    except Exception as exc:
        log.warning("sandbox: seccomp filter could not be built: %s", exc)
        return None


@functools.lru_cache(maxsize=None)
def _cgroup_roots() -> dict[str, str]:
    """cgroup v1 controllers under which we may create per-worker groups."""
    roots = {}
    if os.geteuid() != 0:
        return roots
    for controller, limit_file in (("pids", "pids.max"), ("memory", "memory.limit_in_bytes")):
        base = f"/sys/fs/cgroup/{controller}"
        probe = os.path.join(base, f"spade-sandbox-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            ok = os.path.exists(os.path.join(probe, limit_file))
            os.rmdir(probe)
        except OSError:
            continue
        if ok:
            roots[controller] = base
    return roots


def _bwrap_base(python: str, prefix: str, numpy_dirs: Sequence[str], uid_drop: bool) -> list[str]:
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--clearenv",
    ]
    if not uid_drop:
        # Not root: the user namespace gives the mount and network namespaces to us.
        args += ["--unshare-user"]
    for key, value in _SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    args += ["--ro-bind", "/usr", "/usr"]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/bin", "usr/bin"), ("/sbin", "usr/sbin")):
        if os.path.islink(link):
            args += ["--symlink", target, link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    if prefix and not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "0755", "--dir", "/sandbox", "--perms", "0755", "--dir", "/sandbox/site"]
    for d in numpy_dirs:
        args += ["--ro-bind", d, f"/sandbox/site/{os.path.basename(d)}"]
    args += ["--hostname", "sandbox", "--chdir", "/tmp"]
    return args


@functools.lru_cache(maxsize=None)
def _probe(kind: str) -> tuple[bool, str]:
    """Does a namespace launcher start Python here? (ok, reason)."""
    python, prefix = _system_python()
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    if kind == "bwrap":
        if not shutil.which("bwrap"):
            return False, "bwrap not installed (apt-get install bubblewrap)"
        cmd = _bwrap_base(python, prefix, (), root) + ["--size", "1048576", "--tmpfs", "/tmp"]
        if root and setpriv:
            cmd += [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"]
        cmd += [python, "-S", "-c", "import os; print(os.getuid())"]
    elif kind == "unshare":
        if not shutil.which("unshare"):
            return False, "unshare not installed"
        cmd = [shutil.which("unshare"), "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if not root:
            cmd += ["--user", "--map-root-user"]
        if root and setpriv:
            cmd += [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"]
        cmd += [python, "-S", "-c", "import os; print(os.getuid())"]
    else:
        raise ValueError(kind)
    out = _run_quiet(cmd)
    if out is None:
        return False, f"{kind} could not be started"
    if out.returncode != 0:
        err = out.stderr.decode(errors="replace").strip().splitlines()
        return False, f"{kind} failed: {err[-1] if err else 'exit ' + str(out.returncode)}"
    return True, f"uid {out.stdout.decode().strip()} inside"


def detect_isolation(config: SandboxConfig | None = None) -> dict[str, Any]:
    """Which isolation layers this machine offers, and which the given config will use.

    Keys: backend ("bwrap", "unshare" or "none"), layers (name -> bool: network, filesystem,
    pid_namespace, unprivileged_uid, rlimits, seccomp, cgroups, scrubbed_env), and details
    (python, why a launcher is missing, ...)."""
    config = config or SandboxConfig()
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv") is not None
    details: dict[str, Any] = {"root": root, "python": _system_python()[0]}
    backend = "none"
    order = ("bwrap", "unshare") if config.isolation == "auto" else (
        (config.isolation,) if config.isolation != "none" else ()
    )
    for kind in order:
        ok, reason = _probe(kind)
        details[kind] = reason
        if ok:
            backend = kind
            break
    seccomp = config.seccomp and _seccomp_program() is not None
    if config.seccomp and not seccomp:
        details["seccomp"] = "pyseccomp or libseccomp missing (pip install pyseccomp)"
    cgroups = bool(config.cgroups and _cgroup_roots())
    layers = {
        "network": backend in ("bwrap", "unshare"),
        "filesystem": backend == "bwrap",  # read-only root, private scratch, no host files
        "pid_namespace": backend in ("bwrap", "unshare"),
        "unprivileged_uid": (not root) or setpriv,
        "scrubbed_env": True,
        "rlimits": True,
        "seccomp": seccomp,
        "cgroups": cgroups,
    }
    details["numpy"] = bool(_numpy_dirs())
    return {"backend": backend, "layers": layers, "details": details}


# --------------------------------------------------------------------------------------------
# one worker process


_uid_counter = itertools.count()
_live_workers: "weakref.WeakSet[_Worker]" = weakref.WeakSet()


def _kill_all_workers() -> None:
    for worker in list(_live_workers):
        worker.kill()


atexit.register(_kill_all_workers)


class _Worker:
    """One sandboxed process hosting at most one program. Not thread-safe on its own; the
    pool serialises calls to a worker with its lock."""

    def __init__(self, pool: "SandboxPool"):
        self.pool = pool
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.ready: dict | None = None
        self.dead_reason: str | None = None
        self.instances = 0
        self.next_instance = 0
        self.cgroups: list[str] = []
        self.uid = None
        self._signalled = False
        self._reaped = False
        self._spawn()

    # ---- process life ---------------------------------------------------------------------
    def _spawn(self) -> None:
        pool, config = self.pool, self.pool.config
        root = os.geteuid() == 0
        uid = config.uid_base + (os.getpid() * 97 + next(_uid_counter)) % 50_000 if root else None
        self.uid = uid
        settings = {
            "site": ["/sandbox/site"] if pool.backend == "bwrap" else [pool.site_dir],
            "preimport": list(_PREIMPORT),
            "rlimits": {
                "as": config.memory_mb << 20,
                "cpu": config.cpu_seconds,
                # RLIMIT_NPROC counts the uid's tasks; without a uid drop it would count the
                # host's own processes too.
                "nproc": config.nproc if uid is not None else None,
                "fsize": config.fsize_mb << 20,
                "nofile": config.nofile,
                "core": 0,
            },
            "seccomp": None,
            "scratch": "/tmp" if pool.backend == "bwrap" else None,
            "max_obs_chars": config.max_obs_chars,
        }
        python = pool.python
        cmd: list[str] = []
        scratch_host = None
        if pool.backend == "bwrap":
            cmd = list(pool.bwrap_args)
            cmd += ["--size", str(config.scratch_mb << 20), "--perms", "01777", "--tmpfs", "/tmp"]
            cmd += ["--ro-bind", pool.worker_file, "/sandbox/worker.py"]
            if pool.seccomp_file:
                cmd += ["--ro-bind", pool.seccomp_file, "/sandbox/seccomp.bpf"]
                settings["seccomp"] = "/sandbox/seccomp.bpf"
            worker_path = "/sandbox/worker.py"
        else:
            if pool.backend == "unshare":
                cmd = [shutil.which("unshare") or "unshare", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
                if not root:
                    cmd += ["--user", "--map-root-user"]
            scratch_host = tempfile.mkdtemp(prefix="scratch-", dir=pool.tmpdir)
            os.chmod(scratch_host, 0o777 if uid is not None else 0o700)
            settings["scratch"] = scratch_host
            if pool.seccomp_file:
                settings["seccomp"] = pool.seccomp_file
            worker_path = pool.worker_file
        self.scratch_host = scratch_host
        if uid is not None and pool.setpriv:
            cmd += [pool.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
        cmd += [python, "-s", "-S", "-B", worker_path, json.dumps(settings)]
        if pool.cgroup_roots:
            cmd = self._cgroup_wrap(cmd)
        env = dict(_SANDBOX_ENV)
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                close_fds=True,
                start_new_session=True,
                cwd=scratch_host or "/",
            )
        except OSError as exc:
            self.dead_reason = f"could not start a sandbox worker: {exc}"
            raise SandboxError(self.dead_reason) from None
        self.rfd = self.proc.stdout.fileno()
        self.wfd = self.proc.stdin.fileno()
        os.set_blocking(self.wfd, False)
        os.set_blocking(self.proc.stderr.fileno(), False)
        _live_workers.add(self)

    def _cgroup_wrap(self, cmd: list[str]) -> list[str]:
        config = self.pool.config
        limits = {"pids": ("pids.max", str(config.nproc + 4)),
                  "memory": ("memory.limit_in_bytes", str((config.memory_mb + config.scratch_mb + 64) << 20))}
        name = f"w{os.getpid()}-{id(self):x}-{time.monotonic_ns() % 10**9}"
        joins = []
        for controller, base in self.pool.cgroup_roots.items():
            path = os.path.join(base, self.pool.cgroup_parent, name)
            try:
                os.makedirs(path, exist_ok=True)
                file, value = limits[controller]
                with open(os.path.join(path, file), "w") as f:
                    f.write(value)
                if controller == "memory":
                    try:
                        with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as f:
                            f.write(value)
                    except OSError:
                        pass
            except OSError:
                continue
            self.cgroups.append(path)
            joins.append(os.path.join(path, "cgroup.procs"))
        if not joins:
            return cmd
        script = "".join(f'echo $$ > "{p}" && ' for p in joins) + 'exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *cmd]

    @property
    def alive(self) -> bool:
        return self.dead_reason is None and self.proc is not None and self.proc.poll() is None

    def kill(self, reason: str = "closed", wait: bool = True) -> bool:
        """SIGKILL the worker's process group (the pid namespace dies with its init). With
        wait, reap it and remove its cgroups now; else return whether that already happened
        (reap(block=False) finishes later)."""
        if self.dead_reason is None:
            self.dead_reason = reason
        proc = self.proc
        if proc is None:
            return True
        if not self._signalled:
            self._signalled = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.kill()
            except OSError:
                pass
        return self.reap(block=wait)

    def reap(self, block: bool) -> bool:
        if self._reaped:
            return True
        proc = self.proc
        if block:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("sandbox: worker %d did not die after SIGKILL", proc.pid)
        elif proc.poll() is None:
            return False
        self._reaped = True
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        for path in self.cgroups:
            self._remove_cgroup(path)
        self.cgroups = []
        if self.scratch_host:
            shutil.rmtree(self.scratch_host, ignore_errors=True)
            self.scratch_host = None
        _live_workers.discard(self)
        return True

    @staticmethod
    def _remove_cgroup(path: str) -> None:
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                # Tasks still exiting: kill what is left, wait a moment.
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        for pid in f.read().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except OSError:
                                pass
                except OSError:
                    pass
                time.sleep(0.01)

    def _death_message(self, during: str) -> str:
        proc = self.proc
        code = None
        if proc is not None:
            try:
                code = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
        if code is None:
            how = "stopped answering"
        elif code < 0 or code > 128:
            # bwrap's init reports a child killed by signal N as exit status 128 + N.
            signum = -code if code < 0 else code - 128
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal {signum}"
            hint = {
                "SIGSEGV": " (segmentation fault: ctypes, deep recursion or a crashed extension)",
                "SIGKILL": " (killed: CPU time or memory limit)",
                "SIGXCPU": " (CPU time limit)",
                "SIGXFSZ": " (file size limit)",
                "SIGABRT": " (aborted)",
            }.get(name, "")
            how = f"died from {name}{hint}"
        else:
            how = f"exited with code {code} (the program called exit or killed the process)"
        return f"the environment process {how} during {during}"

    # ---- messaging ------------------------------------------------------------------------
    def send(self, message: dict, deadline: float) -> None:
        payload = json.dumps(message).encode("ascii")  # \u escapes carry lone surrogates safely
        data = memoryview(_HEADER.pack(len(payload)) + payload)
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            _, writable, _ = select.select([], [self.wfd], [], remaining)
            if not writable:
                raise TimeoutError
            try:
                written = os.write(self.wfd, data)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise EOFError from None
            data = data[written:]

    def _read(self, n: int, deadline: float) -> bytes:
        chunks, need = [], n
        while need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable, _, _ = select.select([self.rfd], [], [], remaining)
            if not readable:
                raise TimeoutError
            chunk = os.read(self.rfd, min(need, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            need -= len(chunk)
        return b"".join(chunks)

    def recv(self, deadline: float) -> dict:
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        if size > self.pool.config.max_output_bytes:
            raise OverflowError(size)
        raw = self._read(size, deadline)
        try:
            message = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            raise ValueError("unparseable reply") from None
        if not isinstance(message, dict) or "ok" not in message:
            raise ValueError("malformed reply")
        return message

    def stderr_tail(self) -> str:
        try:
            data = os.read(self.proc.stderr.fileno(), 4096)
        except (OSError, ValueError, AttributeError):
            return ""
        return data.decode(errors="replace").strip().splitlines()[-1:][0] if data.strip() else ""

    def wait_ready(self) -> dict:
        if self.ready is not None:
            return self.ready
        deadline = time.monotonic() + self.pool.config.start_timeout_s
        try:
            reply = self.recv(deadline)
        except (TimeoutError, EOFError, OverflowError, ValueError) as exc:
            tail = self.stderr_tail()
            self.kill("failed to start")
            why = "timed out" if isinstance(exc, TimeoutError) else "exited"
            raise SandboxError(
                f"sandbox worker failed to start ({why}){': ' + tail if tail else ''}"
            ) from None
        self.ready = reply.get("value") or {}
        if self.pool.seccomp_file and self.ready.get("seccomp") is not True:
            log.warning("sandbox: seccomp not active in worker: %s", self.ready.get("seccomp"))
        return self.ready

    # ---- one call -------------------------------------------------------------------------
    def begin(self, request: dict, timeout: float) -> float:
        """Send a request; returns its deadline. Raises an Env* error (worker killed)."""
        if self.dead_reason is not None:
            raise EnvCrashed(f"the environment is no longer running ({self.dead_reason}); load it again")
        deadline = time.monotonic() + timeout
        try:
            self.send(request, deadline)
        except TimeoutError:
            self.kill("timed out")
            raise EnvTimeout(f"{_what(request)} did not accept input within {timeout:g} s; the environment process was killed") from None
        except EOFError:
            msg = self._death_message(_what(request))
            self.kill(msg)
            raise EnvCrashed(msg) from None
        return deadline

    def finish(self, request: dict, deadline: float, timeout: float) -> Any:
        what = _what(request)
        try:
            reply = self.recv(deadline)
        except TimeoutError:
            self.kill("timed out")
            raise EnvTimeout(f"{what} did not return within {timeout:g} s; the environment process was killed") from None
        except EOFError:
            msg = self._death_message(what)
            self.kill(msg)
            raise EnvCrashed(msg) from None
        except OverflowError as exc:
            self.kill("output too large")
            raise EnvCrashed(
                f"{what} produced a reply of {exc.args[0]} bytes, over the {self.pool.config.max_output_bytes}-byte output limit; the environment process was killed"
            ) from None
        except ValueError as exc:
            self.kill("protocol violation")
            raise EnvCrashed(f"the environment process sent a {exc} during {what}; it was killed") from None
        if reply.get("ok") is True:
            return reply.get("value")
        error = reply.get("error")
        error = " ".join(str(error).split())[:600] if error else f"{what} failed"
        if reply.get("kind") in ("fatal", "protocol"):
            self.kill(error)
            raise EnvCrashed(error)
        raise EnvError(error)

    def call(self, request: dict, timeout: float) -> Any:
        with self.lock:
            deadline = self.begin(request, timeout)
            return self.finish(request, deadline, timeout)


def _what(request: dict) -> str:
    op = request.get("op")
    return {"load": "loading the program", "new": "the constructor"}.get(op, f"{op}()")


# --------------------------------------------------------------------------------------------
# decoding of instance attributes (mirrors the worker's encoding)


def _decode_attr(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_attr(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tuple__" in value:
        return tuple(_decode_attr(v) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: _decode_attr(v) for k, v in value["__dict__"].items()}
    if "__random__" in value:
        import random

        rng = random.Random()
        rng.setstate(_decode_attr(value["__random__"]))
        return rng
    if "__ndarray__" in value:
        import numpy as np

        return np.asarray(value["__ndarray__"], dtype=value["dtype"]).reshape(value["shape"])
    if "__npscalar__" in value:
        import numpy as np

        return np.dtype(value["dtype"]).type(value["__npscalar__"])
    return {k: _decode_attr(v) for k, v in value.items()}


def _encode_attr(value: Any, depth: int = 0) -> Any:
    if depth > 32:
        raise ValueError("attribute nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode_attr(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode_attr(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"__dict__": {str(k): _encode_attr(v, depth + 1) for k, v in value.items()}}
    import random

    if type(value) is random.Random:
        return {"__random__": _encode_attr(value.getstate(), depth + 1)}
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if np is not None and isinstance(value, np.generic):
        return {"__npscalar__": value.item(), "dtype": str(value.dtype)}
    if hasattr(value, "__array__") and np is not None:  # jax arrays
        arr = np.asarray(value)
        return {"__ndarray__": arr.tolist(), "dtype": str(arr.dtype), "shape": list(arr.shape)}
    raise ValueError(f"cannot send an attribute of type {type(value).__name__} to the sandbox")


# --------------------------------------------------------------------------------------------
# the TextEnv proxy


def _check_step_reply(value: Any) -> tuple[str, float, bool, bool, dict]:
    if not (isinstance(value, list) and len(value) == 5):
        raise ValueError
    obs, reward, terminated, truncated, info = value
    if not (isinstance(obs, str) and isinstance(reward, (int, float)) and not isinstance(reward, bool)
            and isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)):
        raise ValueError
    return obs, float(reward), terminated, truncated, info


class SandboxEnv:
    """A TextEnv whose instance lives in a sandbox worker. reset/step/solution are RPCs;
    errors from the program raise EnvError (EnvTimeout, EnvCrashed when the worker died)."""

    def __init__(self, pool: "SandboxPool", worker: _Worker, instance: int, class_name: str, meta: dict):
        self._pool = pool
        self._worker = worker
        self._instance = instance
        self.class_name = class_name
        # Whether the class defines solution().
        self.has_solution = bool(meta.get("has_solution"))
        # The environment's declared turn limit (attribute max_turns), if any.
        self.max_turns = meta.get("max_turns")
        self._closed = False

    def __repr__(self) -> str:
        return f"SandboxEnv({self.class_name}, instance={self._instance}, alive={self.alive})"

    @property
    def alive(self) -> bool:
        return not self._closed and self._worker.alive

    @property
    def isolation(self) -> dict:
        return self._pool.isolation

    def _request(self, op: str, **fields) -> dict:
        if self._closed:
            raise EnvError(f"{op}() on a closed environment")
        return {"op": op, "id": self._instance, **fields}

    def _timeout(self, timeout: float | None) -> float:
        return self._pool.config.call_timeout_s if timeout is None else max(1e-3, float(timeout))

    def reset(self, seed: int | None = None, *, timeout: float | None = None) -> tuple[str, dict]:
        if seed is not None:
            try:
                seed = operator.index(seed)  # numpy integers too
            except TypeError:
                raise ValueError(f"reset(seed=...) takes an int or None, got {type(seed).__name__}") from None
        value = self._worker.call(self._request("reset", seed=seed), self._timeout(timeout))
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict)):
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed reset() reply; it was killed")
        return value[0], value[1]

    def _step_request(self, action: str) -> dict:
        if not isinstance(action, str):
            raise TypeError(f"step(action) takes a str, got {type(action).__name__}")
        if len(action) > self._pool.config.max_input_chars:
            raise ValueError(f"action of {len(action)} characters exceeds max_input_chars={self._pool.config.max_input_chars}")
        return self._request("step", action=action)

    def _step_result(self, value: Any) -> tuple[str, float, bool, bool, dict]:
        try:
            return _check_step_reply(value)
        except ValueError:
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed step() reply; it was killed") from None

    def step(self, action: str, *, timeout: float | None = None) -> tuple[str, float, bool, bool, dict]:
        value = self._worker.call(self._step_request(action), self._timeout(timeout))
        return self._step_result(value)

    def solution(self, *, timeout: float | None = None) -> str | list[str]:
        value = self._worker.call(self._request("solution"), self._timeout(timeout))
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(a, str) for a in value)):
            return value
        self._worker.kill("protocol violation")
        raise EnvCrashed("the environment process sent a malformed solution() reply; it was killed")

    def declared_turns(self, *, timeout: float | None = None) -> int | None:
        """The instance's current max_turns / MAX_TURNS (some programs set it in reset)."""
        value = self._worker.call(self._request("declared_turns"), self._timeout(timeout))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def get_attrs(self) -> dict[str, Any]:
        """The instance's attributes that survive JSON (numbers, str, lists, dicts, tuples,
        numpy arrays and scalars, random.Random state); others are left out."""
        value = self._worker.call(self._request("get_attrs"), self._pool.config.call_timeout_s)
        if not isinstance(value, dict) or not isinstance(value.get("attrs"), dict):
            self._worker.kill("protocol violation")
            raise EnvCrashed("the environment process sent a malformed get_attrs() reply; it was killed")
        return {str(k): _decode_attr(v) for k, v in value["attrs"].items()}

    def set_attrs(self, attrs: dict[str, Any]) -> None:
        """Assign attributes on the instance (values as get_attrs returns them)."""
        encoded = {str(k): _encode_attr(v) for k, v in attrs.items()}
        self._worker.call(self._request("set_attrs", attrs=encoded), self._pool.config.call_timeout_s)

    def clone(self, *, timeout: float | None = None) -> "SandboxEnv":
        """A second, independent instance of the same class in the same worker (no new
        process); calls on the two are serialised."""
        return self._pool._new_instance(
            self._worker, self.class_name, {"has_solution": self.has_solution}, self._timeout(timeout)
        )

    def close(self, _rpc: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool._release(self._worker, self._instance, rpc=_rpc)

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close(_rpc=False)
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# the pool


class SandboxPool:
    """Long-lived sandbox workers: `workers` idle ones are kept started, each load() takes one
    and gives it one program; a worker that timed out or crashed is killed, and a fresh idle
    one replaces what was taken. Closing the last instance of a program kills its worker."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config = config or SandboxConfig()
        self.isolation = detect_isolation(config)
        self.backend = self.isolation["backend"]
        if self.backend == "none" and not config.allow_unisolated:
            raise SandboxUnavailable(
                "no sandbox isolation available (" + "; ".join(
                    str(self.isolation["details"].get(k)) for k in ("bwrap", "unshare") if k in self.isolation["details"]
                ) + "): install bubblewrap (apt-get install bubblewrap) or set "
                "SandboxConfig(allow_unisolated=True) to run untrusted code without it"
            )
        if self.backend == "none":
            log.warning("sandbox: running untrusted code WITHOUT namespace isolation (allow_unisolated=True)")
        self.python, prefix = _system_python()
        self.setpriv = shutil.which("setpriv") if os.geteuid() == 0 else None
        self.tmpdir = tempfile.mkdtemp(prefix="spade-sandbox-")
        os.chmod(self.tmpdir, 0o755)
        self.worker_file = os.path.join(self.tmpdir, "worker.py")
        shutil.copyfile(_WORKER_FILE, self.worker_file)
        os.chmod(self.worker_file, 0o644)
        self.seccomp_file = None
        if self.isolation["layers"]["seccomp"]:
            self.seccomp_file = os.path.join(self.tmpdir, "seccomp.bpf")
            with open(self.seccomp_file, "wb") as f:
                f.write(_seccomp_program())
            os.chmod(self.seccomp_file, 0o644)
        self.site_dir = os.path.join(self.tmpdir, "site")
        os.mkdir(self.site_dir)
        for d in _numpy_dirs():
            os.symlink(d, os.path.join(self.site_dir, os.path.basename(d)))
        self.bwrap_args = _bwrap_base(self.python, prefix, _numpy_dirs(), os.geteuid() == 0) if self.backend == "bwrap" else []
        self.cgroup_roots = _cgroup_roots() if self.isolation["layers"]["cgroups"] else {}
        self.cgroup_parent = f"spade-sandbox-{os.getpid()}-{id(self):x}"
        self._lock = threading.RLock()
        self._idle: list[_Worker] = []
        self._busy: dict[_Worker, set[int]] = {}
        self._dying: list[_Worker] = []
        self._closed = False
        log.info("sandbox: backend=%s layers=%s", self.backend,
                 ",".join(k for k, v in self.isolation["layers"].items() if v))
        self._finalizer = weakref.finalize(self, SandboxPool._cleanup, list(), self.tmpdir,
                                           [os.path.join(r, self.cgroup_parent) for r in self.cgroup_roots.values()])
        self._refill()

    # ---- bookkeeping ----------------------------------------------------------------------
    @staticmethod
    def _cleanup(workers: list, tmpdir: str, cgroup_dirs: list[str]) -> None:
        for worker in workers:
            worker.kill()
        shutil.rmtree(tmpdir, ignore_errors=True)
        for path in cgroup_dirs:
            try:
                os.rmdir(path)
            except OSError:
                pass

    def _live_count(self) -> int:
        return len(self._idle) + len(self._busy)

    def _refill(self) -> None:
        with self._lock:
            self._dying = [w for w in self._dying if not w.reap(block=False)]
            self._idle = [w for w in self._idle if w.dead_reason is None]
            while (not self._closed and len(self._idle) < self.config.workers
                   and self._live_count() < self.config.max_workers):
                self._idle.append(_Worker(self))

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            worker = None
            while self._idle:
                candidate = self._idle.pop(0)
                if candidate.dead_reason is None and candidate.proc.poll() is None:
                    worker = candidate
                    break
                candidate.kill("died while idle")
            if worker is None:
                if self._live_count() >= self.config.max_workers:
                    raise SandboxError(
                        f"all {self.config.max_workers} sandbox workers are in use; close environments "
                        "or raise SandboxConfig.max_workers"
                    )
                worker = _Worker(self)
            self._busy[worker] = set()
        try:
            try:
                worker.wait_ready()
            except SandboxError as exc:
                # One retry with a fresh process: a start can fail on a transiently
                # overloaded host; a second failure is a real problem.
                log.warning("sandbox: %s; starting another worker", exc)
                with self._lock:
                    self._busy.pop(worker, None)
                    worker = _Worker(self)
                    self._busy[worker] = set()
                worker.wait_ready()
        except SandboxError:
            with self._lock:
                self._busy.pop(worker, None)
            raise
        finally:
            # Keep start-ups off the caller's path while a spare is still waiting; they
            # happen when a program's worker is released.
            if not self._idle:
                self._refill()
        return worker

    def _release(self, worker: _Worker, instance: int, rpc: bool = True) -> None:
        with self._lock:
            instances = self._busy.get(worker)
            if instances is None:
                return
            instances.discard(instance)
            last = not instances
            if last:
                del self._busy[worker]
        if not last:
            # Other instances live on in this worker; forget this one there too. Skipped from
            # __del__, which may run while this thread holds the worker's lock.
            if rpc and worker.alive:
                try:
                    worker.call({"op": "drop", "id": instance}, self.config.call_timeout_s)
                except EnvError:
                    pass
            return
        # A worker that ran a program is never reused for another program. Reaping happens
        # later so closing an environment does not wait for the namespace teardown.
        if not worker.kill("closed", wait=False):
            with self._lock:
                self._dying.append(worker)
        self._refill()

    def _new_instance(self, worker: _Worker, class_name: str, meta: dict, timeout: float | None = None) -> SandboxEnv:
        with self._lock:
            if worker not in self._busy:
                raise EnvCrashed("the environment's process is gone; load the program again")
            instance = worker.next_instance
            worker.next_instance += 1
            self._busy[worker].add(instance)
        try:
            reply = worker.call({"op": "new", "id": instance}, timeout or self.config.load_timeout_s)
        except EnvError:
            self._release(worker, instance)
            raise
        meta = dict(meta)
        if isinstance(reply, dict) and isinstance(reply.get("max_turns"), int):
            meta["max_turns"] = reply["max_turns"]
        return SandboxEnv(self, worker, instance, class_name, meta)

    # ---- public ---------------------------------------------------------------------------
    def load(self, source: str, class_name: str, *, timeout: float | None = None) -> SandboxEnv:
        """Start the program in a fresh worker and make one instance of `class_name`
        (`timeout` overrides load_timeout_s for executing the module and the constructor)."""
        timeout = self.config.load_timeout_s if timeout is None else max(1e-3, float(timeout))
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        if len(source) > self.config.max_input_chars:
            raise ValueError(f"program of {len(source)} characters exceeds max_input_chars={self.config.max_input_chars}")
        worker = self._take()
        try:
            meta = worker.call({"op": "load", "source": source, "class_name": class_name}, timeout)
        except BaseException:
            with self._lock:
                self._busy.pop(worker, None)
            worker.kill("load failed")
            raise
        if not isinstance(meta, dict):
            meta = {}
        return self._new_instance(worker, class_name, meta, timeout)

    def step_many(self, calls: Iterable[tuple[SandboxEnv, str]], *, return_exceptions: bool = True) -> list:
        """Step many environments at once: requests to different workers run in parallel,
        those to one worker in order. Returns results in input order; a failed call gives its
        EnvError in place of the 5-tuple (or raises it when return_exceptions is False)."""
        calls = list(calls)
        timeout = self.config.call_timeout_s
        results: list[Any] = [None] * len(calls)
        queues: dict[_Worker, list[int]] = {}
        requests: dict[int, dict] = {}
        for i, (env, action) in enumerate(calls):
            try:
                requests[i] = env._step_request(action)
            except (EnvError, TypeError, ValueError) as exc:
                results[i] = exc
                continue
            queues.setdefault(env._worker, []).append(i)
        held = [w for w in queues]
        for w in held:
            w.lock.acquire()
        try:
            inflight: dict[int, tuple[_Worker, int, float]] = {}

            def start_next(worker: _Worker) -> None:
                queue = queues[worker]
                while queue:
                    i = queue.pop(0)
                    try:
                        deadline = worker.begin(requests[i], timeout)
                    except EnvError as exc:
                        results[i] = exc
                        continue
                    inflight[worker.rfd] = (worker, i, deadline)
                    return

            for worker in queues:
                start_next(worker)
            while inflight:
                now = time.monotonic()
                wait = max(0.0, min(d for _, _, d in inflight.values()) - now)
                readable, _, _ = select.select(list(inflight), [], [], wait)
                ready = set(readable)
                for fd, (worker, i, deadline) in list(inflight.items()):
                    if fd not in ready and time.monotonic() < deadline:
                        continue
                    del inflight[fd]
                    try:
                        results[i] = calls[i][0]._step_result(worker.finish(requests[i], deadline, timeout))
                    except EnvError as exc:
                        results[i] = exc
                    start_next(worker)
        finally:
            for w in held:
                w.lock.release()
        if not return_exceptions:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = self._idle + list(self._busy) + self._dying
            self._idle, self._busy, self._dying = [], {}, []
        for worker in workers:
            worker.kill("pool closed")
        self._finalizer()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def live_pids(self) -> list[int]:
        """Host pids of the live workers' launch processes (for tests and monitoring)."""
        with self._lock:
            return [w.proc.pid for w in self._idle + list(self._busy) if w.proc is not None and w.proc.poll() is None]


_default_pool: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """A process-wide pool with the default config, started on first use."""
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = SandboxPool()
        return _default_pool
