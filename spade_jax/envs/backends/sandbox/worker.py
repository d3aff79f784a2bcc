"""Sandbox worker: runs ONE untrusted environment program behind a length-prefixed JSON pipe.
Standard library only; process.py starts it inside the isolation layers and never imports it."""

# This file runs under the system interpreter inside the sandbox, never imported by the host
# package at run time. Everything it reports is treated by the host as untrusted data.

import builtins
import json
import os
import resource
import struct
import sys
import traceback
import types

_HEADER = struct.Struct(">I")
_PROGRAM_FILE = "env_program.py"
_MAX_REQUEST = 64 << 20
_isinstance = builtins.isinstance
_len = builtins.len
_str = builtins.str
_float = builtins.float


class _NullText:
    """Sink for the program's print(): the pipe to the host is not fd 1, and nothing the
    program prints may reach the host."""

    encoding = "utf-8"
    errors = "replace"

    def write(self, text):
        return _len(text) if _isinstance(text, _str) else 0

    def flush(self):
        pass

    def isatty(self):
        return False

    def fileno(self):
        return 1


class _Channel:
    def __init__(self, rfd, wfd):
        self.rfd = rfd
        self.wfd = wfd

    def _read_exact(self, n):
        chunks = []
        while n:
            chunk = os.read(self.rfd, min(n, 1 << 20))
            if not chunk:
                os._exit(0)  # host closed the pipe: nothing left to do
            chunks.append(chunk)
            n -= _len(chunk)
        return b"".join(chunks)

    def recv(self):
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size))
        if size > _MAX_REQUEST:
            os._exit(3)
        return json.loads(self._read_exact(size).decode("utf-8"))

    def send(self, message):
        try:
            payload = json.dumps(message, allow_nan=True, ensure_ascii=False).encode("utf-8", "replace")
        except (TypeError, ValueError, RecursionError) as exc:
            payload = json.dumps({"ok": False, "kind": "contract", "error": f"unencodable reply: {exc}"}).encode()
        data = _HEADER.pack(_len(payload)) + payload
        view = memoryview(data)
        while view:
            written = os.write(self.wfd, view)
            view = view[written:]


def _load_seccomp(path):
    """Install the host-compiled BPF deny-list (execve, sockets, fork/clone, ptrace, ...)."""
    import ctypes

    with open(path, "rb") as f:
        program = f.read()
    if not program or _len(program) % 8:
        raise OSError("malformed seccomp program")

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(program, _len(program))
    fprog = _SockFprog(_len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(SECCOMP) failed")


def _apply_rlimits(limits):
    applied = {}
    names = {
        "as": resource.RLIMIT_AS,
        "cpu": resource.RLIMIT_CPU,
        "nproc": resource.RLIMIT_NPROC,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
        "core": resource.RLIMIT_CORE,
    }
    for key, value in limits.items():
        if value is None:
            continue
        # Soft below hard for CPU so SIGXCPU comes first, then SIGKILL a second later.
        hard = value + 1 if key == "cpu" else value
        try:
            resource.setrlimit(names[key], (value, hard))
            applied[key] = value
        except (ValueError, OSError) as exc:
            applied[key] = f"failed: {exc}"
    return applied


def _program_frame(exc):
    """(line number, source line) of the innermost frame inside the program, if any."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == _PROGRAM_FILE:
            found = frame
    if found is None and _isinstance(exc, SyntaxError) and exc.filename == _PROGRAM_FILE:
        return exc.lineno, (exc.text or "").strip()
    if found is None:
        return None, ""
    return found.lineno, (found.line or "").strip()


def _describe(where, exc):
    try:
        text = _str(exc)
    except BaseException:  # a hostile __str__
        text = "<unprintable>"
    text = " ".join(text.split())[:300]
    name = type(exc).__name__
    if _isinstance(exc, MemoryError):
        text = text or "memory limit reached"
    if _isinstance(exc, RecursionError):
        text = text or "maximum recursion depth exceeded"
    lineno, line = _program_frame(exc)
    at = f" at line {lineno}: `{line[:120]}`" if lineno else ""
    return f"{where} raised {name}{': ' + text if text else ''}{at}"


def _jsonable(value, depth=0, budget=None):
    """A JSON-safe copy of a returned value; numpy scalars and arrays become numbers and
    lists, tuples become lists, anything else its repr. Size-bounded."""
    if budget is None:
        budget = [200_000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 32:
        return "<truncated>"
    if value is None or _isinstance(value, (bool, int, _float, _str)):
        if _isinstance(value, int) and not _isinstance(value, bool) and abs(value) > 2**63:
            return _str(value)
        return value
    if _isinstance(value, dict):
        return {_str(k): _jsonable(v, depth + 1, budget) for k, v in list(value.items())[:10_000]}
    if _isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1, budget) for v in list(value)[:100_000]]
    np = sys.modules.get("numpy")
    if np is not None:
        if _isinstance(value, np.generic):
            return _jsonable(value.item(), depth + 1, budget)
        if _isinstance(value, np.ndarray):
            if value.size > 100_000:
                return f"<ndarray shape={value.shape}>"
            return _jsonable(value.tolist(), depth + 1, budget)
    try:
        return repr(value)[:1000]
    except BaseException:
        return "<unrepresentable>"


# Attribute encoding that round-trips numpy arrays, tuples and random.Random state, so the
# host can read and inject an instance's state (JAX backend equivalence checks).
def _encode_attr(value, depth=0):
    if depth > 32:
        raise TypeError("nested too deeply")
    if value is None or _isinstance(value, (bool, int, _float, _str)):
        return value
    if _isinstance(value, (list,)):
        return [_encode_attr(v, depth + 1) for v in value]
    if _isinstance(value, tuple):
        return {"__tuple__": [_encode_attr(v, depth + 1) for v in value]}
    if _isinstance(value, dict):
        if all(_isinstance(k, _str) for k in value):
            return {"__dict__": {k: _encode_attr(v, depth + 1) for k, v in value.items()}}
        raise TypeError("dict with non-str keys")
    import random

    if type(value) is random.Random:
        return {"__random__": _encode_attr(value.getstate(), depth + 1)}
    np = sys.modules.get("numpy")
    if np is not None:
        if _isinstance(value, np.ndarray):
            return {"__ndarray__": value.tolist(), "dtype": _str(value.dtype), "shape": list(value.shape)}
        if _isinstance(value, np.generic):
            return {"__npscalar__": value.item(), "dtype": _str(value.dtype)}
    raise TypeError(type(value).__name__)


def _decode_attr(value):
    if _isinstance(value, list):
        return [_decode_attr(v) for v in value]
    if not _isinstance(value, dict):
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


def _declared_turns(obj):
    """The turn limit an environment declares (max_turns or MAX_TURNS), if it is an int."""
    for name in ("max_turns", "MAX_TURNS"):
        try:
            value = getattr(obj, name, None)
        except BaseException:
            value = None
        if _isinstance(value, int) and not _isinstance(value, bool):
            return value
    return None


class _ContractError(Exception):
    pass


def _is_bool(value):
    if _isinstance(value, bool):
        return True
    np = sys.modules.get("numpy")
    return np is not None and _isinstance(value, np.bool_)


def _as_number(value, what):
    np = sys.modules.get("numpy")
    if _isinstance(value, bool) or (np is not None and _isinstance(value, np.bool_)):
        raise _ContractError(f"{what} must be a float, got bool")
    if _isinstance(value, (int, _float)) or (np is not None and _isinstance(value, (np.integer, np.floating))):
        return _float(value)
    raise _ContractError(f"{what} must be a float, got {type(value).__name__}")


class Worker:
    def __init__(self, channel, settings):
        self.channel = channel
        self.settings = settings
        self.max_obs_chars = settings.get("max_obs_chars", 100_000)
        self.single_thread_check = not settings.get("seccomp_active", False)
        self.env_class = None
        self.reset_style = "keyword"
        self.instances = {}

    # ---- helpers -------------------------------------------------------------------------
    def _instance(self, request):
        inst = self.instances.get(request.get("id"))
        if inst is None:
            raise _ContractError(f"no environment instance {request.get('id')!r}")
        return inst

    def _check_obs(self, obs, where):
        if not _isinstance(obs, _str):
            raise _ContractError(f"{where} must return the observation as a str, got {type(obs).__name__}")
        obs = _str.__str__(obs)
        if _len(obs) > self.max_obs_chars:
            raise _ContractError(
                f"{where} returned an observation of {_len(obs)} characters; the limit is {self.max_obs_chars}"
            )
        return obs

    # ---- operations ----------------------------------------------------------------------
    def op_ping(self, request):
        return "pong"

    def op_load(self, request):
        source = request["source"]
        class_name = request["class_name"]
        import linecache

        # Tracebacks then quote the program's own line back to its author.
        linecache.cache[_PROGRAM_FILE] = (_len(source), None, source.splitlines(True), _PROGRAM_FILE)
        code = compile(source, _PROGRAM_FILE, "exec")
        module = types.ModuleType("env_program")
        module.__file__ = _PROGRAM_FILE
        sys.modules["env_program"] = module
        # A runtime the program builds on (the tool-use base class and its parser) runs first, in the
        # program's namespace, each part under its own file name so the program's line numbers stay its own.
        for name, unit in request.get("prelude") or []:
            exec(compile(unit, name, "exec"), module.__dict__)
        exec(code, module.__dict__)
        cls = module.__dict__.get(class_name)
        if not _isinstance(cls, type):
            raise _ContractError(f"the program does not define a class named {class_name}")
        for method in ("reset", "step"):
            if not callable(getattr(cls, method, None)):
                raise _ContractError(f"class {class_name} has no {method}() method")
        self.env_class = cls
        self.reset_style = self._reset_style(cls)
        return {"has_solution": callable(getattr(cls, "solution", None)), "max_turns": _declared_turns(cls)}

    @staticmethod
    def _reset_style(cls):
        import inspect

        try:
            params = list(inspect.signature(cls.reset).parameters.values())[1:]
        except (TypeError, ValueError):
            return "keyword"
        if any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params):
            return "keyword"
        if any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params):
            return "positional"
        return "none"

    def op_new(self, request):
        if self.env_class is None:
            raise _ContractError("no program loaded")
        instance = self.env_class()
        self.instances[request["id"]] = instance
        return {"max_turns": _declared_turns(instance)}

    def op_drop(self, request):
        self.instances.pop(request.get("id"), None)
        return None

    def op_reset(self, request):
        inst = self._instance(request)
        seed = request.get("seed")
        if self.reset_style == "keyword":
            result = inst.reset(seed=seed)
        elif self.reset_style == "positional":
            result = inst.reset(seed)
        else:
            result = inst.reset()
        if not _isinstance(result, tuple) or _len(result) != 2:
            got = f"a tuple of length {_len(result)}" if _isinstance(result, tuple) else type(result).__name__
            raise _ContractError(f"reset() must return a tuple (observation: str, info: dict), got {got}")
        obs, info = result
        obs = self._check_obs(obs, "reset()")
        if not _isinstance(info, dict):
            raise _ContractError(f"reset() must return info as a dict, got {type(info).__name__}")
        return [obs, _jsonable(info)]

    def op_step(self, request):
        inst = self._instance(request)
        result = inst.step(request["action"])
        if not _isinstance(result, tuple) or _len(result) != 5:
            got = f"a tuple of length {_len(result)}" if _isinstance(result, tuple) else type(result).__name__
            raise _ContractError(
                "step() must return a 5-tuple (observation: str, reward: float, terminated: bool, "
                f"truncated: bool, info: dict), got {got}"
            )
        obs, reward, terminated, truncated, info = result
        obs = self._check_obs(obs, "step()")
        reward = _as_number(reward, "step() reward")
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            if not _is_bool(flag):
                raise _ContractError(f"step() {name} must be a bool, got {type(flag).__name__}")
        if not _isinstance(info, dict):
            raise _ContractError(f"step() must return info as a dict, got {type(info).__name__}")
        return [obs, reward, bool(terminated), bool(truncated), _jsonable(info)]

    def op_solution(self, request):
        inst = self._instance(request)
        method = getattr(inst, "solution", None)
        if not callable(method):
            raise _ContractError("the environment has no solution() method")
        plan = method()
        if _isinstance(plan, _str):
            return _str.__str__(plan)[: self.max_obs_chars]
        if _isinstance(plan, (list, tuple)):
            return [_str(a)[:10_000] for a in list(plan)[:10_000]]
        if _isinstance(plan, (int, _float)) and not _isinstance(plan, bool):
            return _str(plan)
        raise _ContractError(f"solution() must return a str or a list of actions, got {type(plan).__name__}")

    def op_declared_turns(self, request):
        return _declared_turns(self._instance(request))

    def op_get_attrs(self, request):
        inst = self._instance(request)
        attrs, skipped = {}, []
        for name, value in list(vars(inst).items()):
            try:
                attrs[name] = _encode_attr(value)
            except (TypeError, ValueError, RecursionError):
                skipped.append(name)
        return {"attrs": attrs, "skipped": skipped}

    def op_set_attrs(self, request):
        inst = self._instance(request)
        for name, value in request["attrs"].items():
            setattr(inst, name, _decode_attr(value))
        return None

    # ---- loop ----------------------------------------------------------------------------
    def handle(self, request):
        op = request.get("op") if _isinstance(request, dict) else None
        method = getattr(self, f"op_{op}", None) if _isinstance(op, _str) else None
        if method is None:
            return {"ok": False, "kind": "protocol", "error": f"unknown operation {op!r}"}
        where = (
            f"{op}()"
            if op in ("reset", "step", "solution")
            else {"load": "loading the program", "new": "the constructor"}.get(op, op)
        )
        try:
            value = method(request)
        except _ContractError as exc:
            return {"ok": False, "kind": "contract", "error": exc.args[0]}
        except BaseException as exc:  # untrusted code: SystemExit and KeyboardInterrupt too
            return {"ok": False, "kind": "raised", "error": _describe(where, exc)}
        if self.single_thread_check and op not in ("ping", "drop"):
            try:
                tasks = _len(os.listdir("/proc/self/task"))
            except OSError:
                tasks = 1
            if tasks > 1:
                error = f"{where} started a thread; environment programs must be single-threaded"
                return {"ok": False, "kind": "fatal", "error": error}
        return {"ok": True, "value": value}

    def serve(self):
        while True:
            request = self.channel.recv()
            reply = self.handle(request)
            try:
                self.channel.send(reply)
            except RecursionError:
                self.channel.send({"ok": False, "kind": "contract", "error": "reply nested too deeply"})
            if reply.get("kind") == "fatal":
                os._exit(4)


def main():
    settings = json.loads(sys.argv[1])
    # Keep the protocol pipe off fds 0-2 so stray prints and os.write(1, ...) go nowhere.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    sys.stdin = None
    sys.stdout = sys.stderr = _NullText()
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # the worker's own folder is not for the program
    sys.path.extend(settings.get("site", []))
    imported = []
    for name in settings.get("preimport", []):
        try:
            __import__(name)
            imported.append(name)
        except BaseException:
            pass
    scratch = settings.get("scratch")
    if scratch:
        try:
            os.chdir(scratch)
        except OSError:
            pass
    limits = _apply_rlimits(settings.get("rlimits", {}))
    seccomp = None
    if settings.get("seccomp"):
        try:
            _load_seccomp(settings["seccomp"])
            seccomp = True
        except BaseException as exc:
            seccomp = f"failed: {exc}"
    settings["seccomp_active"] = seccomp is True
    channel = _Channel(rfd, wfd)
    channel.send(
        {
            "ok": True,
            "value": {
                "uid": os.getuid(),
                "euid": os.geteuid(),
                "pid": os.getpid(),
                "python": sys.version.split()[0],
                "numpy": "numpy" in imported,
                "rlimits": limits,
                "seccomp": seccomp,
            },
        }
    )
    Worker(channel, settings).serve()


if __name__ == "__main__":
    main()
