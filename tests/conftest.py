"""Test-session settings: a persistent XLA compilation cache, so programs compiled by one test
(or an earlier run) are not compiled again by the next; the suite is compile-bound on CPU."""

import os
import tempfile

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "spade-jax-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
