"""Where derived artifacts are kept between runs (`$SPADE_JAX_CACHE`, default ~/.cache/spade_jax;
`SPADE_JAX_NO_CACHE=1` turns caching off): built tokenizers."""

from __future__ import annotations

import os


def cache_root() -> str | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get("SPADE_JAX_NO_CACHE"):
        return None
    return os.environ.get("SPADE_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spade_jax"))
