"""The host's half of the wire protocol with a worker (worker.py holds the other): length-prefixed JSON
frames over its pipes, the shapes of replies, and the JSON encoding of instance attributes."""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")  # frame header: the payload's length, big-endian


def send_message(wfd: int, message: dict, deadline: float) -> None:
    """Write one frame; TimeoutError past the deadline, EOFError when the pipe is closed."""
    payload = json.dumps(message).encode("ascii")  # \u escapes carry lone surrogates safely
    data = memoryview(HEADER.pack(len(payload)) + payload)
    while data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        _, writable, _ = select.select([], [wfd], [], remaining)
        if not writable:
            raise TimeoutError
        try:
            written = os.write(wfd, data)
        except BlockingIOError:
            continue
        except (BrokenPipeError, OSError):
            raise EOFError from None
        data = data[written:]


def _read_exact(rfd: int, n: int, deadline: float) -> bytes:
    chunks, need = [], n
    while need:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        readable, _, _ = select.select([rfd], [], [], remaining)
        if not readable:
            raise TimeoutError
        chunk = os.read(rfd, min(need, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        need -= len(chunk)
    return b"".join(chunks)


def recv_message(rfd: int, deadline: float, max_bytes: int) -> dict:
    """Read one reply frame: TimeoutError, EOFError, OverflowError (over max_bytes) or ValueError
    (not a reply) when it cannot."""
    (size,) = HEADER.unpack(_read_exact(rfd, HEADER.size, deadline))
    if size > max_bytes:
        raise OverflowError(size)
    raw = _read_exact(rfd, size, deadline)
    try:
        message = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise ValueError("unparseable reply") from None
    if not isinstance(message, dict) or "ok" not in message:
        raise ValueError("malformed reply")
    return message


def describe_request(request: dict) -> str:
    op = request.get("op")
    return {"load": "loading the program", "new": "the constructor"}.get(op, f"{op}()")


def check_step_reply(value: Any) -> tuple[str, float, bool, bool, dict]:
    if not (isinstance(value, list) and len(value) == 5):
        raise ValueError
    obs, reward, terminated, truncated, info = value
    if not (isinstance(obs, str) and isinstance(reward, (int, float)) and not isinstance(reward, bool)
            and isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)):
        raise ValueError
    return obs, float(reward), terminated, truncated, info


# decoding of instance attributes (mirrors the worker's encoding)


def decode_attr(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_attr(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tuple__" in value:
        return tuple(decode_attr(v) for v in value["__tuple__"])
    if "__dict__" in value:
        return {k: decode_attr(v) for k, v in value["__dict__"].items()}
    if "__random__" in value:
        import random

        rng = random.Random()
        rng.setstate(decode_attr(value["__random__"]))
        return rng
    if "__ndarray__" in value:
        import numpy as np

        return np.asarray(value["__ndarray__"], dtype=value["dtype"]).reshape(value["shape"])
    if "__npscalar__" in value:
        import numpy as np

        return np.dtype(value["dtype"]).type(value["__npscalar__"])
    return {k: decode_attr(v) for k, v in value.items()}


def encode_attr(value: Any, depth: int = 0) -> Any:
    if depth > 32:
        raise ValueError("attribute nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode_attr(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode_attr(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"__dict__": {str(k): encode_attr(v, depth + 1) for k, v in value.items()}}
    import random

    if type(value) is random.Random:
        return {"__random__": encode_attr(value.getstate(), depth + 1)}
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
