"""Shared helpers for the RL tests: a tiny decoder with host-random weights (eager init is slow on CPU)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.models.decoder import Decoder
from spade_jax.models.spec import ModelSpec

TINY = ModelSpec(arch="llama", vocab_size=48, hidden_size=16, intermediate_size=32, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=4)


def tiny_decoder(seed: int, spec: ModelSpec = TINY, std: float = 0.2, **kwargs) -> Decoder:
    """A Decoder whose params come from numpy (norm scales near 1), built without per-tensor compiles."""
    abstract = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0), **kwargs))
    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(seed)
    pure = nnx.to_pure_dict(state)

    def fill(tree):
        out = {}
        for k, v in tree.items():
            if isinstance(v, dict):
                out[k] = fill(v)
            elif v.ndim == 1:
                out[k] = jnp.asarray(1.0 + 0.1 * rng.standard_normal(v.shape), v.dtype)
            else:
                out[k] = jnp.asarray(std * rng.standard_normal(v.shape), v.dtype)
        return out

    nnx.replace_by_pure_dict(state, fill(pure))
    return nnx.merge(graphdef, state)


def make_train_batch(seed: int, batch: int = 8, length: int = 12, spec: ModelSpec = TINY, ref=False):
    """A mixed agent/designer batch: left-padded prompts, completion masks, some stale designer rows."""
    from spade_jax.rl import TrainBatch

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, spec.vocab_size, (batch, length)).astype(np.int32)
    pad = rng.integers(0, 3, batch)  # left padding per row
    prompt = 4
    valid = np.arange(length)[None] >= pad[:, None]
    positions = np.maximum(np.arange(length)[None] - pad[:, None], 0).astype(np.int32)
    loss_mask = valid & (np.arange(length)[None] >= (pad + prompt)[:, None])
    loss_mask[-1] = False  # a padding row of the batch
    role = (np.arange(batch) % 4 == 3).astype(np.int32)  # every 4th row is a designer sample
    behaviour = np.log(rng.uniform(0.01, 0.2, (batch, length))).astype(np.float32)
    return TrainBatch(
        tokens_bt=tokens,
        positions_bt=positions,
        valid_bt=valid,
        loss_mask_bt=loss_mask,
        behaviour_logprobs_bt=behaviour,
        advantages_b=rng.normal(0, 1, batch).astype(np.float32),
        ref_logprobs_bt=(behaviour + rng.normal(0, 0.1, behaviour.shape)).astype(np.float32) if ref else None,
        role_b=role,
        is_stale_b=role.astype(bool),
    )


def with_empty_rows(batch, rows):
    """`batch` with rows of padding (no token, no loss) appended up to `rows`."""
    def pad(x):
        x = np.asarray(x)
        return np.concatenate([x, np.zeros((rows - len(x),) + x.shape[1:], x.dtype)])

    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return batch.replace(**{name: pad(value) for name, value in fields.items() if value is not None})


def split_by_width(batch, first_rows: int, width: int):
    """(`batch`'s first `first_rows` rows, the rest padded on the right to `width` columns): one update's
    rows as two batches of different widths, as the Learner makes them for long samples."""
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}

    def rows(value, part):
        value = np.asarray(value)
        return value[:first_rows] if part == 0 else value[first_rows:]

    def widen(name, value):
        if value.ndim < 2:
            return value
        extra = width - value.shape[1]
        if name == "positions_bt":  # the padding columns' positions follow on (they attend to nothing)
            return np.concatenate([value, value[:, -1:] + 1 + np.arange(extra, dtype=value.dtype)], axis=1)
        return np.pad(value, ((0, 0), (0, extra)))

    first = batch.replace(**{n: rows(v, 0) for n, v in fields.items() if v is not None})
    second = batch.replace(**{n: widen(n, rows(v, 1)) for n, v in fields.items() if v is not None})
    return first, second
