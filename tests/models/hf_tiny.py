"""Tiny random HF checkpoints (saved by transformers, PyTorch fp32) for the model tests.

Weights are redrawn with a larger scale than HF's init (and norms away from 1) so that a wrong
transpose, bias or norm shows up clearly in the logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
FAMILIES = {
    "llama": dict(rms_norm_eps=1e-5),
    "qwen2": dict(),
    "qwen3": dict(head_dim=16),  # explicit head_dim != hidden / heads
    "qwen3_moe": dict(
        head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True
    ),
}


def hf_model(model_type: str, seed: int = 0, **overrides):
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **{**BASE, **FAMILIES[model_type], **overrides})
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_(0.15 * noise)
    return model


def save_hf(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


def hf_logits(model, tokens: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    import torch

    mask = None if valid is None else torch.tensor(valid.astype(np.int64))
    kwargs = {}
    if valid is not None:
        positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
        kwargs["position_ids"] = torch.tensor(positions)
    with torch.no_grad():
        return model(torch.tensor(tokens), attention_mask=mask, **kwargs).logits.float().numpy()


def left_padded_batch(vocab: int, seed: int = 0, batch: int = 3, length: int = 11):
    """Tokens, positions and valid mask for a left-padded batch (row i has i*2 pads)."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, vocab, (batch, length)).astype(np.int32)
    valid = np.ones((batch, length), bool)
    for i in range(batch):
        valid[i, : 2 * i] = False
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, valid
