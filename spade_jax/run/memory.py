"""Where a run's memory is, logged every iteration: the process's resident set (host RAM, which on a CPU
backend also holds JAX's buffers), the bytes of the JAX arrays alive now, and each accelerator's
in-use and peak bytes where the backend reports them; and giving freed host memory back between phases.

On XLA:CPU the resident set of a `laptop` run grew to 12 GiB while its live JAX arrays held 2 GiB:
glibc keeps the pages of freed buffers (XLA's temporaries of the sampler and of the update, allocated
from several threads' arenas) mapped. `release_free_memory` returns them (glibc `malloc_trim`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys

GIB = float(1 << 30)


def resident_bytes() -> int | None:
    """This process's resident set now (Linux /proc), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_resident_bytes() -> int:
    """The largest resident set this process has had (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another libc, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> int:
    """Gives the pages of freed host allocations back to the OS (glibc malloc_trim); returns the bytes the
    resident set shrank by (0 where there is no glibc or no /proc)."""
    trim = _malloc_trim()
    before = resident_bytes()
    if trim is None or before is None:
        return 0
    trim(0)
    after = resident_bytes()
    return max(before - (after if after is not None else before), 0)


def live_array_bytes() -> int:
    """Bytes of every JAX array alive in this process, counted per shard this process holds."""
    import jax

    total = 0
    for array in jax.live_arrays():
        try:
            total += sum(shard.data.nbytes for shard in array.addressable_shards)
        except Exception:  # deleted or donated while we looked
            continue
    return total


def memory_metrics() -> dict[str, float]:
    """`memory/*` in GiB: rss, peak_rss, jax_live and, per backend that reports it, device_in_use and
    device_peak (summed over this process's devices)."""
    import jax

    out = {"memory/peak_rss_gib": peak_resident_bytes() / GIB, "memory/jax_live_gib": live_array_bytes() / GIB}
    rss = resident_bytes()
    if rss is not None:
        out["memory/rss_gib"] = rss / GIB
    in_use = peak = 0
    reported = False
    for device in jax.local_devices():
        try:
            stats = device.memory_stats()
        except Exception:  # not implemented on this backend
            stats = None
        if stats and "bytes_in_use" in stats:
            reported = True
            in_use += stats["bytes_in_use"]
            peak += stats.get("peak_bytes_in_use", stats["bytes_in_use"])
    if reported:
        out["memory/device_in_use_gib"] = in_use / GIB
        out["memory/device_peak_gib"] = peak / GIB
    return out
