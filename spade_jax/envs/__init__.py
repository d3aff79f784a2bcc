"""spade-jax."""
