"""Test-session settings: a persistent XLA compilation cache, so programs compiled by one test
(or an earlier run) are not compiled again by the next; the suite is compile-bound on CPU. And the
`usual_sigint` fixture for tests of Ctrl-C handling."""

import os
import signal
import tempfile

import pytest

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "spade-jax-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


@pytest.fixture
def usual_sigint():
    """Python's usual Ctrl-C handler for the test, whatever the suite inherited: a suite started as a
    background job (`pytest &`, nohup, some CI runners) starts with SIGINT ignored, and then Ctrl-C
    handling has nothing to test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
