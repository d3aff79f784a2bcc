"""Where derived artifacts are kept between runs (`$SPADE_JAX_CACHE`, default ~/.cache/spade_jax;
`SPADE_JAX_NO_CACHE=1` turns caching off): built tokenizers, and XLA's compiled programs."""

from __future__ import annotations

import os

# A compile shorter than this is not worth a file (XLA's own default is 1 s).
MIN_CACHED_COMPILE_SECONDS = 2.0


def cache_root() -> str | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get("SPADE_JAX_NO_CACHE"):
        return None
    return os.environ.get("SPADE_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spade_jax"))


def enable_compilation_cache() -> str | None:
    """Keeps XLA's compiled programs under `<cache>/xla`, so a resumed run, another seed or the next
    run of a config loads its update and sampler programs instead of compiling them again (a compile of
    SmolLM2's update takes minutes on a 2-core CPU). Returns the folder, None when caching is off."""
    root = cache_root()
    if root is None:
        return None
    import jax

    path = os.path.join(root, "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_SECONDS)
    return path
