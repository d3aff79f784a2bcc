"""Language models: the NNX decoder, presets, HF/GGUF loading and export, tokenizers and chat.

`load_model(name_or_path)` is the entry point; `python -m spade_jax.models` is the command line.
"""

from spade_jax.models.decoder import Decoder, KVCache
from spade_jax.models.spec import ModelSpec

__all__ = ["Decoder", "KVCache", "ModelSpec", "load_model"]


def __getattr__(name):
    # Lazy: importing the registry pulls in transformers (seconds); most users need only the decoder.
    if name in ("load_model", "LoadedModel"):
        from spade_jax.models import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'spade_jax.models' has no attribute {name!r}")
