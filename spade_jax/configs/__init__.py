"""The experiment configs (YAML), shipped with the package and found by name (spade_jax.config.CONFIG_DIR)."""
