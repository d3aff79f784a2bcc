"""Test-session settings: as many pytest-xdist workers as cores and memory allow; a persistent XLA
compilation cache for each, so programs compiled by one test (or an earlier run) are not compiled
again by the next, as the suite is compile-bound on CPU. A bound on
the compiled programs the process keeps (see `_bounded_memory_maps`). And the `usual_sigint` fixture for
tests of Ctrl-C handling."""

import os
import signal
import tempfile

import pytest

_default_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "spade-jax-xla")
_cache = os.environ.setdefault("SPADE_JAX_TEST_XLA_CACHE", _default_cache)  # the workers inherit it
# One cache per pytest-xdist worker: jax writes a cache entry in place, without a lock unless eviction is
# on, so one worker could read an entry another is still writing.
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_cache, os.environ.get("PYTEST_XDIST_WORKER", "main"))
# LLVM at -O0 for the test processes (and the subprocesses they start): the suite is compile-bound on
# CPU, and its programs run on small arrays. tests/rl/test_packing.py went from 128 to 76 s with empty
# caches. XLA's own (HLO) optimisations are unchanged.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):  # the workers inherit it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


WORKER_MEMORY = 6 * 2**30  # a test process's peak resident set, measured at 5.4 GB


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per core, as many as the memory holds. The suite is
    compile-bound and XLA compiles a program on one thread: one process kept 1.35 of 2 cores busy."""
    try:
        with open("/proc/meminfo") as meminfo:
            available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(os.cpu_count() or 1, available // WORKER_MEMORY))


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
