"""What this machine offers to confine a program: namespace launchers (bwrap, unshare), seccomp,
cgroups, and the interpreter and numpy to bind in; detect_isolation reports which layers a config gets."""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Sequence

from spade_jax.envs.backends.sandbox.config import SandboxConfig

log = logging.getLogger("spade_jax.envs.backends.sandbox")

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
