"""Multi-controller JAX: joining the processes of one run, and keeping host-only work (files, the
sandbox, program validation, environment steps) on process 0, the leader, with its results shared.

Every process runs the same program; arrays are global (`jax.Array` over the whole mesh). Host work
that must happen once runs inside `leader_only(fn)`: the leader calls `fn`, pickles its result (or
its exception) and broadcasts the bytes, and every process returns (or raises) the same thing.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, TypeVar

import jax
import numpy as np

T = TypeVar("T")

# Set by `tpu/launch.py local` (or by hand) for processes on one machine; a TPU pod or a cluster
# JAX detects by itself (SLURM, MPI, Kubernetes) needs none of them.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # host:port of process 0's coordinator (JAX reads it too)
ENV_NUM_PROCESSES = "SPADE_NUM_PROCESSES"
ENV_PROCESS_ID = "SPADE_PROCESS_ID"

_MIN_BUCKET = 256  # broadcast payloads are padded to a power of two (>= this) so few programs compile


def initialize() -> None:
    """`jax.distributed.initialize()` once; with SPADE_NUM_PROCESSES/SPADE_PROCESS_ID set (processes
    on one machine) it passes them and JAX_COORDINATOR_ADDRESS, else JAX detects the cluster."""
    if jax.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if os.environ.get(ENV_NUM_PROCESSES):
        coordinator = os.environ.get(ENV_COORDINATOR)
        if not coordinator:
            raise ValueError(f"{ENV_NUM_PROCESSES} is set but {ENV_COORDINATOR} (host:port) is not")
        try:
            kwargs = {"coordinator_address": coordinator,
                      "num_processes": int(os.environ[ENV_NUM_PROCESSES]),
                      "process_id": int(os.environ.get(ENV_PROCESS_ID, "")),
                      "cluster_detection_method": "deactivate"}
        except ValueError:
            raise ValueError(f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers") from None
    jax.distributed.initialize(**kwargs)


def process_count() -> int:
    return jax.process_count()


def is_leader() -> bool:
    """Process 0: the one that writes the run directory, runs the sandbox and validates programs."""
    return jax.process_index() == 0


def _bucket(n: int) -> int:
    return max(_MIN_BUCKET, 1 << max(n - 1, 0).bit_length())


def broadcast_bytes(payload: bytes | None) -> bytes:
    """The leader's `payload` on every process (the others pass None)."""
    from jax.experimental import multihost_utils

    leader = is_leader()
    size = np.array([len(payload) if leader else 0], np.int64)
    size = int(multihost_utils.broadcast_one_to_all(size)[0])
    buffer = np.zeros(_bucket(size), np.uint8)
    if leader:
        buffer[:size] = np.frombuffer(payload, np.uint8)
    return multihost_utils.broadcast_one_to_all(buffer)[:size].tobytes()


def _picklable(value: Any) -> Any:
    """`value`, or for an exception that does not survive pickling a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(value))
        return value
    except Exception:  # any unpicklable part (a lock, a generator) makes the whole value unpicklable
        if isinstance(value, BaseException):
            return RuntimeError(f"{type(value).__name__}: {value}")
        raise


def broadcast_object(value: Any) -> Any:
    """The leader's picklable `value` on every process (single process: `value` itself)."""
    if jax.process_count() == 1:
        return value
    return pickle.loads(broadcast_bytes(pickle.dumps(value) if is_leader() else None))


def leader_only(fn: Callable[[], T]) -> T:
    """Runs `fn()` on the leader only; every process returns its result, or raises its exception.

    Must be called by every process at the same point (it is a collective). A result holding
    exceptions (e.g. per-environment failures) travels as long as they pickle; an exception that
    does not is replaced by a RuntimeError naming it.
    """
    if jax.process_count() == 1:
        return fn()
    outcome: tuple[bool, Any] | None = None
    if is_leader():
        try:
            outcome = (True, fn())
        except Exception as err:  # raised on every process after the broadcast
            outcome = (False, _picklable(err))
        try:
            payload = pickle.dumps(outcome)
            pickle.loads(payload)
        except Exception:  # a result with an unpicklable exception inside: replace those
            ok, value = outcome
            value = [_picklable(v) for v in value] if isinstance(value, list) else _picklable(value)
            payload = pickle.dumps((ok, value))
    ok, value = pickle.loads(broadcast_bytes(payload if is_leader() else None))
    if not ok:
        raise value
    return value


def fetch(tree: Any) -> Any:
    """Host numpy copies of (possibly global) arrays on every process: `jax.device_get` where the
    process holds the whole value, an all-gather over processes where it holds only its shards."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def sync(name: str) -> None:
    """Waits until every process reaches the barrier `name` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
