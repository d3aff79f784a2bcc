"""One sandboxed worker process seen from the host: its launch inside the isolation layers with limits
and cgroups, one request/reply call under a deadline, and killing and reaping it."""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from spade_jax.envs.backends.sandbox.errors import EnvCrashed, EnvError, EnvTimeout, SandboxError
from spade_jax.envs.backends.sandbox.isolation import _SANDBOX_ENV
from spade_jax.envs.backends.sandbox.protocol import describe_request, recv_message, send_message

if TYPE_CHECKING:
    from spade_jax.envs.backends.sandbox.pool import SandboxPool


log = logging.getLogger("spade_jax.envs.backends.sandbox")

# The script each worker runs (standard library only); the pool copies it next to its other files.
WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
# Modules the worker imports before the program arrives, so loading a program costs nothing
# for them and numpy's start-up (OpenBLAS buffers) happens before the memory limit.
_PREIMPORT = (
    "numpy", "random", "math", "re", "json", "itertools", "functools", "collections",
    "string", "heapq", "bisect", "copy", "dataclasses", "typing", "enum", "fractions",
    "statistics", "textwrap", "operator", "inspect", "hashlib", "decimal", "datetime", "abc",
)


_uid_counter = itertools.count()
_live_workers: "weakref.WeakSet[WorkerProcess]" = weakref.WeakSet()


def _kill_all_workers() -> None:
    for worker in list(_live_workers):
        worker.kill()


atexit.register(_kill_all_workers)


class WorkerProcess:
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
                cmd = [
                    shutil.which("unshare") or "unshare", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"
                ]
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

    # ---- start-up -------------------------------------------------------------------------
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
            reply = recv_message(self.rfd, deadline, self.pool.config.max_output_bytes)
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
            send_message(self.wfd, request, deadline)
        except TimeoutError:
            self.kill("timed out")
            raise EnvTimeout(
                f"{describe_request(request)} did not accept input within {timeout:g} s; "
                "the environment process was killed"
            ) from None
        except EOFError:
            msg = self._death_message(describe_request(request))
            self.kill(msg)
            raise EnvCrashed(msg) from None
        return deadline

    def finish(self, request: dict, deadline: float, timeout: float) -> Any:
        what = describe_request(request)
        try:
            reply = recv_message(self.rfd, deadline, self.pool.config.max_output_bytes)
        except TimeoutError:
            self.kill("timed out")
            raise EnvTimeout(
                f"{what} did not return within {timeout:g} s; the environment process was killed"
            ) from None
        except EOFError:
            msg = self._death_message(what)
            self.kill(msg)
            raise EnvCrashed(msg) from None
        except OverflowError as exc:
            self.kill("output too large")
            raise EnvCrashed(
                f"{what} produced a reply of {exc.args[0]} bytes, over the "
                f"{self.pool.config.max_output_bytes}-byte output limit; the environment process was killed"
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
