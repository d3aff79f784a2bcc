"""memory/* metrics: the live JAX bytes follow arrays made and freed (sizes from numpy), the resident set
is the kernel's (/proc/self/status VmRSS, read independently)."""

import ctypes
import ctypes.util
import gc
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.run.memory import GIB, memory_metrics, release_free_memory, resident_bytes


def test_live_bytes_follow_arrays_made_and_freed():
    size = np.ones((512, 1024), np.float32).nbytes  # 2 MiB
    gc.collect()  # arrays other tests left for the collector go now, not between the reads
    before = memory_metrics()["memory/jax_live_gib"] * GIB
    x = jnp.ones((512, 1024), jnp.float32)
    made = memory_metrics()["memory/jax_live_gib"] * GIB
    assert size <= made - before < size + (256 << 10)  # JAX may keep a small constant beside it
    del x
    gc.collect()
    assert memory_metrics()["memory/jax_live_gib"] * GIB < made - size + 1


def test_resident_set_matches_the_kernels_and_peak_is_at_least_it():
    with open("/proc/self/status") as f:
        vm_rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert abs(resident_bytes() - vm_rss) < 64 << 20  # the two reads are moments apart
    metrics = memory_metrics()
    assert metrics["memory/peak_rss_gib"] >= metrics["memory/rss_gib"] * 0.99 > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc")
def test_release_gives_freed_heap_pages_back():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunk, count = 64 << 10, 2048  # 128 MiB in heap-sized chunks (below glibc's mmap threshold)
    blocks = [libc.malloc(chunk) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, chunk)  # resident
    pin = libc.malloc(chunk)  # from the top, above them: freeing them leaves a hole glibc keeps mapped
    for block in blocks:
        libc.free(block)
    try:
        held = resident_bytes()
        released = release_free_memory()
        assert released > (count * chunk) // 2
        assert resident_bytes() < held - (count * chunk) // 2
    finally:
        libc.free(pin)
