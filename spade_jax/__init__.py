"""spade-jax: SPADE self-play (an LLM designs RL environments as code and learns by playing them) in JAX/Flax."""

import os as _os

__version__ = "0.1.0"

# XLA:CPU's concurrency-optimised scheduler (on by default in jaxlib 0.10) runs every layer's
# rematerialised forward pass as early as it can, which undoes `jax.checkpoint`: a SmolLM2-135M
# gradient over 4 x 1024 tokens needed 17.9 GiB of temporaries with it, 0.84 GiB without, and the
# self-play update ran out of memory. It must be off before JAX creates its CPU client, so it is set
# here, at import, unless the user's XLA_FLAGS already choose. Other backends ignore the flag.
CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
if CPU_SCHEDULER_FLAG not in _os.environ.get("XLA_FLAGS", ""):
    _os.environ["XLA_FLAGS"] = f"{_os.environ.get('XLA_FLAGS', '')} {CPU_SCHEDULER_FLAG}=false".strip()
