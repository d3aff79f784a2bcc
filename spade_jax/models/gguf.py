"""GGUF files (llama.cpp): metadata -> `ModelSpec`, our own block dequantizers, and tensors renamed to
transformers' Llama/Qwen names and layouts (Q/K rotary order undone), ready for the HF name mapping.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from spade_jax.models.spec import ModelSpec

# GGUF `general.architecture` -> our ModelSpec.arch.
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}

# ggml block formats we decode ourselves: name -> (elements per block, bytes per block).
_BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
}


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields (shape [..., 2] bytes) to float32 [..., 1]."""
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 packed bytes -> 32 values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes of 5th bits (little-endian uint32, bit j belongs to element j) -> [n, 32] of 0/16."""
    bits = np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")
    return bits.astype(np.uint8) << 4


def dequantize_blocks(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Decode `raw` bytes (any shape, last axis whole blocks) of a ggml type into float32 values.

    Layouts follow ggml's block structs: Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale + 32 nibbles
    (value (q - 8) * d); Q4_1 = f16 scale, f16 min + 32 nibbles (q * d + m); Q5_x add 32 high bits.
    """
    if type_name not in _BLOCKS:
        raise ValueError(f"ggml type {type_name} has no built-in decoder; supported: {sorted(_BLOCKS)}")
    per_block, nbytes = _BLOCKS[type_name]
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.shape[-1] % nbytes:
        raise ValueError(f"{type_name} data of {raw.shape[-1]} bytes per row is not whole blocks")
    lead = raw.shape[:-1]
    blocks = raw.reshape(-1, nbytes)
    if type_name == "F32":
        out = blocks.view("<f4").astype(np.float32)
    elif type_name == "F16":
        out = blocks.view("<f2").astype(np.float32)
    elif type_name == "BF16":
        out = (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif type_name == "Q8_0":
        out = _f16(blocks[:, :2]) * blocks[:, 2:].view(np.int8).astype(np.float32)
    elif type_name == "Q4_0":
        q = _nibbles(blocks[:, 2:]).astype(np.float32) - 8.0
        out = _f16(blocks[:, :2]) * q
    elif type_name == "Q4_1":
        q = _nibbles(blocks[:, 4:]).astype(np.float32)
        out = _f16(blocks[:, :2]) * q + _f16(blocks[:, 2:4])
    elif type_name == "Q5_0":
        q = (_nibbles(blocks[:, 6:]) | _high_bits(blocks[:, 2:6])).astype(np.float32) - 16.0
        out = _f16(blocks[:, :2]) * q
    else:  # Q5_1
        q = (_nibbles(blocks[:, 8:]) | _high_bits(blocks[:, 4:8])).astype(np.float32)
        out = _f16(blocks[:, :2]) * q + _f16(blocks[:, 2:4])
    return out.reshape(*lead, -1)


def dequantize_tensor(tensor) -> np.ndarray:
    """A `gguf.ReaderTensor` as float32 in numpy (row-major, i.e. GGUF's dims reversed).

    Types without a built-in decoder (K-quants, IQ*) go through the gguf package's reference decoder.
    """
    type_name = tensor.tensor_type.name
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if type_name in _BLOCKS:
        return dequantize_blocks(tensor.data, type_name).reshape(shape)
    import gguf

    return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)


def unpermute_rotary(weight_oi: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert-time reorder of Q/K rows (interleaved rotary pairs -> HF halves).

    llama.cpp stores, per head, rows as (pair, 2) where HF has (2, pair); swapping back is the inverse.
    """
    out_dim = weight_oi.shape[0]
    head_dim = out_dim // n_heads
    rest = weight_oi.shape[1:]
    w = weight_oi.reshape(n_heads, head_dim // 2, 2, *rest)
    return np.ascontiguousarray(w.swapaxes(1, 2).reshape(weight_oi.shape))


@dataclasses.dataclass
class GGUFFile:
    """An opened GGUF file: its metadata as plain Python values and its tensor descriptors."""

    path: str
    metadata: dict[str, Any]
    tensors: dict[str, Any]  # name -> gguf.ReaderTensor (data memory-mapped, not yet decoded)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def _field_value(field) -> Any:
    import gguf

    if not field.types:
        return None
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        value = field.contents()
        return list(value) if not isinstance(value, list) else value
    return field.contents()


# Fields too large to convert eagerly (the tokenizer vocabulary); read them via `gguf_tokenizer_fields`.
_LAZY_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.ggml.scores")


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF file (memory-mapped); raises FileNotFoundError / ValueError with one-line messages."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as err:  # the reader raises bare ValueErrors / struct errors on bad files
        raise ValueError(f"{path} is not a readable GGUF file ({err})") from err
    metadata = {k: _field_value(f) for k, f in reader.fields.items() if k not in _LAZY_FIELDS}
    return GGUFFile(path=path, metadata=metadata, tensors={t.name: t for t in reader.tensors})


def _decimal(value: float) -> float:
    """GGUF stores float32: take the shortest decimal that round-trips it (1e-5, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def spec_from_gguf(gf: GGUFFile) -> ModelSpec:
    """The `ModelSpec` described by a GGUF file's `<arch>.*` metadata."""
    md, arch = gf.metadata, gf.architecture
    if arch not in _ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHS)}")

    def get(key, default=None):
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{gf.path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = int(md.get(f"{arch}.attention.key_length", hidden // heads))
    vocab = md.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = int(gf.tensors["token_embd.weight"].shape[-1])
    scaling = None
    scale_type = md.get(f"{arch}.rope.scaling.type")
    if scale_type in ("linear",):
        scaling = (("factor", float(get("rope.scaling.factor"))), ("rope_type", "linear"))
    elif scale_type not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scale_type!r} is not supported; use linear or none")
    eos = md.get("tokenizer.ggml.eos_token_id")
    bos = md.get("tokenizer.ggml.bos_token_id")
    is_moe = arch == "qwen3moe"
    return ModelSpec(
        arch=_ARCHS[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(md.get(f"{arch}.feed_forward_length", 0) or 0),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=_decimal(md.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        rms_eps=_decimal(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in gf.tensors,
        qkv_bias="blk.0.attn_q.bias" in gf.tensors,
        o_bias="blk.0.attn_output.bias" in gf.tensors,
        mlp_bias="blk.0.ffn_up.bias" in gf.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in gf.tensors,
        num_experts=int(md.get(f"{arch}.expert_count", 0) or 0) if is_moe else 0,
        experts_per_token=int(md.get(f"{arch}.expert_used_count", 0) or 0) if is_moe else 0,
        moe_intermediate_size=int(md.get(f"{arch}.expert_feed_forward_length", 0) or 0) if is_moe else 0,
        max_position=int(md.get(f"{arch}.context_length", 8192)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


# GGUF per-block tensor names -> transformers names under `model.layers.{i}.`.
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
_EXPERT_NAMES = {
    "ffn_gate_exps.weight": "gate_proj.weight",
    "ffn_up_exps.weight": "up_proj.weight",
    "ffn_down_exps.weight": "down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp adds that transformers recomputes (precomputed rope frequencies).
_SKIPPED = ("rope_freqs.weight",)


def gguf_hf_items(gf: GGUFFile, spec: ModelSpec | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (transformers name, float32 array in transformers' [out, in] layout), one tensor at a time.

    Q/K rows are un-permuted for the `llama` architecture only: llama.cpp reorders them there and
    nowhere else (Qwen uses NeoX rotary in llama.cpp, stored unpermuted).
    """
    spec = spec or spec_from_gguf(gf)
    unpermute = gf.architecture == "llama"
    for name, tensor in gf.tensors.items():
        if name in _SKIPPED:
            continue
        if name in _TOP_NAMES:
            yield _TOP_NAMES[name], dequantize_tensor(tensor)
            continue
        parts = name.split(".", 2)
        if parts[0] != "blk" or len(parts) != 3:
            raise ValueError(f"{gf.path}: unexpected GGUF tensor {name!r}")
        layer, local = int(parts[1]), parts[2]
        prefix = f"model.layers.{layer}."
        if local in _EXPERT_NAMES:
            stacked = dequantize_tensor(tensor)  # [experts, out, in]
            for expert in range(stacked.shape[0]):
                yield f"{prefix}mlp.experts.{expert}.{_EXPERT_NAMES[local]}", stacked[expert]
            continue
        if local not in _BLOCK_NAMES:
            raise ValueError(f"{gf.path}: GGUF tensor {name!r} has no transformers counterpart")
        value = dequantize_tensor(tensor)
        if unpermute and local in ("attn_q.weight", "attn_q.bias"):
            value = unpermute_rotary(value, spec.num_heads)
        elif unpermute and local in ("attn_k.weight", "attn_k.bias"):
            value = unpermute_rotary(value, spec.num_kv_heads)
        yield prefix + _BLOCK_NAMES[local], value


def chat_template(gf: GGUFFile) -> str | None:
    """The model's own Jinja chat template stored in the file, if any."""
    return gf.metadata.get("tokenizer.chat_template")
