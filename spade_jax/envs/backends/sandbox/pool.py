"""SandboxPool: long-lived workers kept started, one program each, with their shared files (worker
script, seccomp filter, numpy), batched stepping across workers, and the process-wide default pool."""

from __future__ import annotations

import logging
import os
import select
import shutil
import tempfile
import threading
import time
import weakref
from typing import Any, Iterable

from spade_jax.envs import tool_use
from spade_jax.envs.backends.sandbox.config import SandboxConfig
from spade_jax.envs.backends.sandbox.errors import EnvCrashed, EnvError, SandboxError, SandboxUnavailable
from spade_jax.envs.backends.sandbox.isolation import (
    _bwrap_base,
    _cgroup_roots,
    _numpy_dirs,
    _seccomp_program,
    _system_python,
    detect_isolation,
)
from spade_jax.envs.backends.sandbox.process import WORKER_FILE, WorkerProcess
from spade_jax.envs.backends.sandbox.proxy import SandboxEnv

log = logging.getLogger("spade_jax.envs.backends.sandbox")


def _others_can_read(path: str) -> bool:
    """Can a process of another uid, in no group of ours, read `path`? Each folder above it
    needs the others' search bit, and `path` their read and search bits."""
    path = os.path.realpath(path)
    if (os.stat(path).st_mode & 0o005) != 0o005:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & 0o001:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def _copy_readable(src: str, dst: str) -> None:
    """Copy a package tree so that any uid can read it (the source's own modes may be private)."""
    shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copyfile)
    for folder, _subfolders, files in os.walk(dst):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)


class SandboxPool:
    """Long-lived sandbox workers: `workers` idle ones are kept started, each load() takes one
    and gives it one program; a worker that timed out or crashed is killed, and a fresh idle
    one replaces what was taken. Closing the last instance of a program kills its worker."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config = config or SandboxConfig()
        self.isolation = detect_isolation(config)
        self.backend = self.isolation["backend"]
        if self.backend == "none" and not config.allow_unisolated:
            details = self.isolation["details"]
            raise SandboxUnavailable(
                "no sandbox isolation available ("
                + "; ".join(str(details.get(k)) for k in ("bwrap", "unshare") if k in details)
                + "): install bubblewrap (apt-get install bubblewrap) or set "
                "SandboxConfig(allow_unisolated=True) to run untrusted code without it"
            )
        if self.backend == "none":
            log.warning("sandbox: running untrusted code WITHOUT namespace isolation (allow_unisolated=True)")
        self.python, prefix = _system_python()
        self.setpriv = shutil.which("setpriv") if os.geteuid() == 0 else None
        self.tmpdir = tempfile.mkdtemp(prefix="spade-sandbox-")
        os.chmod(self.tmpdir, 0o755)
        self.worker_file = os.path.join(self.tmpdir, "worker.py")
        shutil.copyfile(WORKER_FILE, self.worker_file)
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
            link = os.path.join(self.site_dir, os.path.basename(d))
            if self.backend != "bwrap" and self.setpriv and not _others_can_read(d):
                # The worker's dropped uid cannot reach numpy under a private folder (a venv
                # below a 0700 home or `mktemp -d`); bwrap binds it instead, here we copy it.
                _copy_readable(d, link)
            else:
                os.symlink(d, link)
        self.bwrap_args = (
            _bwrap_base(self.python, prefix, _numpy_dirs(), os.geteuid() == 0) if self.backend == "bwrap" else []
        )
        self.cgroup_roots = _cgroup_roots() if self.isolation["layers"]["cgroups"] else {}
        self.cgroup_parent = f"spade-sandbox-{os.getpid()}-{id(self):x}"
        self._lock = threading.RLock()
        self._idle: list[WorkerProcess] = []
        self._busy: dict[WorkerProcess, set[int]] = {}
        self._dying: list[WorkerProcess] = []
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
                self._idle.append(WorkerProcess(self))

    def _take(self) -> WorkerProcess:
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
                worker = WorkerProcess(self)
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
                    worker = WorkerProcess(self)
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

    def _release(self, worker: WorkerProcess, instance: int, rpc: bool = True) -> None:
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

    def _new_instance(
        self, worker: WorkerProcess, class_name: str, meta: dict, timeout: float | None = None
    ) -> SandboxEnv:
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
            raise ValueError(
                f"program of {len(source)} characters exceeds max_input_chars={self.config.max_input_chars}"
            )
        worker = self._take()
        try:
            request = {"op": "load", "source": source, "class_name": class_name}
            if tool_use.needs_runtime(source):
                request["prelude"] = tool_use.runtime_units()
            meta = worker.call(request, timeout)
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
        queues: dict[WorkerProcess, list[int]] = {}
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
            inflight: dict[int, tuple[WorkerProcess, int, float]] = {}

            def start_next(worker: WorkerProcess) -> None:
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
