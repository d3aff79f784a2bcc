"""Where derived artifacts are kept between runs (`$SPADE_JAX_CACHE`, default ~/.cache/spade_jax;
`SPADE_JAX_NO_CACHE=1` turns caching off): built tokenizers, and XLA's compiled programs."""

from __future__ import annotations

import os
import sys


def cache_root() -> str | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get("SPADE_JAX_NO_CACHE"):
        return None
    return os.environ.get("SPADE_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spade_jax"))


def warn_not_cached(what: str, where: str, err: BaseException) -> None:
    """One stderr line for a cache write that failed (full disk, read-only folder): the caller goes on
    without the copy, so only the next run's speed is lost, and the user learns why."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    print(f"warning: could not cache {what} in {where} ({reason}); going on without it, so the next load "
          "builds it again", file=sys.stderr)


# A compile shorter than this is not worth a file (XLA's own default is 1 s).
MIN_CACHED_COMPILE_SECONDS = 2.0


def enable_compilation_cache() -> str | None:
    """Keeps XLA's compiled programs under `<cache>/xla`, so a resumed run, another seed or the next
    run of a config loads its update and sampler programs instead of compiling them again (a compile of
    SmolLM2's update takes minutes on a 2-core CPU). A folder already named by JAX_COMPILATION_CACHE_DIR
    is kept. Returns the folder in use, None when caching is off."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return os.environ["JAX_COMPILATION_CACHE_DIR"]
    root = cache_root()
    if root is None:
        return None
    path = os.path.join(root, "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_SECONDS)
    # No size bound: JAX's least-recently-used eviction (jax_compilation_cache_max_size) fails every
    # write in a folder holding entries written without it (their access-time files are missing), so
    # the update was never cached (2026-12-05). The folder can be deleted at any time.
    return path
