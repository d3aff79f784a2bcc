"""Hugging Face checkpoints: config.json <-> ModelSpec (config), the HF-name mapping table (names),
safetensors without torch (safetensors_io), streaming load onto a mesh (load) and export (export)."""

from spade_jax.models.hf.config import hf_config_from_spec, read_hf_config, spec_from_hf_config, spec_from_hf_dir
from spade_jax.models.hf.export import SHARD_BYTES, TOKENIZER_FILES, export_hf, model_to_hf_items
from spade_jax.models.hf.load import load_hf, state_dict_items_to_model
from spade_jax.models.hf.names import hf_name_targets
from spade_jax.models.hf.safetensors_io import iter_safetensors, safetensors_files

__all__ = [
    "SHARD_BYTES",
    "TOKENIZER_FILES",
    "export_hf",
    "hf_config_from_spec",
    "hf_name_targets",
    "iter_safetensors",
    "load_hf",
    "model_to_hf_items",
    "read_hf_config",
    "safetensors_files",
    "spec_from_hf_config",
    "spec_from_hf_dir",
    "state_dict_items_to_model",
]
