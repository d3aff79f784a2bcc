"""Test-session settings: a persistent XLA compilation cache, so programs compiled by one test
(or an earlier run) are not compiled again by the next; the suite is compile-bound on CPU. A bound on
the compiled programs the process keeps (see `_bounded_memory_maps`). And the `usual_sigint` fixture for
tests of Ctrl-C handling."""

import os
import signal
import tempfile

import pytest

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "spade-jax-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _memory_maps() -> tuple[int, int]:
    """This process's memory mappings and the kernel's limit on them (0, 0 where /proc cannot say)."""
    try:
        with open("/proc/self/maps") as maps, open("/proc/sys/vm/max_map_count") as limit:
            return sum(1 for _ in maps), int(limit.read())
    except OSError:
        return 0, 0


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory_maps():
    """Every XLA:CPU program a jitted function still holds keeps about six memory mappings, and a
    process past `vm.max_map_count` (65530 by default) crashes in XLA's next compile or cache load
    (a segmentation fault or an abort, not an error). One pytest process holds the programs of
    every test module before it, so past half the limit the jit caches are emptied between
    modules; what the next module needs again comes back from the persistent cache above."""
    yield
    count, limit = _memory_maps()
    if limit and count > limit // 2:
        import jax

        jax.clear_caches()


@pytest.fixture
def usual_sigint():
    """Python's usual Ctrl-C handler for the test, whatever the suite inherited: a suite started as a
    background job (`pytest &`, nohup, some CI runners) starts with SIGINT ignored, and then Ctrl-C
    handling has nothing to test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
