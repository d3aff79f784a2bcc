"""spade-jax: SPADE self-play (an LLM designs RL environments as code and learns by playing them) in JAX/Flax."""

__version__ = "0.1.0"
