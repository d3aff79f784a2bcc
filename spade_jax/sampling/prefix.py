"""Multi-turn prefix reuse: what a call leaves for the next (`Kept`), the plan that matches new
prompts to kept cache rows, and the compiled programs that extend or grow a kept cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.models.decoder import KVCache
from spade_jax.sampling.config import fit_bucket
from spade_jax.sampling.versions import ParamsVersion


@dataclasses.dataclass
class Kept:
    """What the last call left behind for the next one to build on."""

    cache: KVCache
    rows: list[list[int]]  # per cache row: the tokens whose K/V it holds, in order ([] if none)
    index: int  # host copy of cache.index
    params: ParamsVersion  # the parameters the K/V came from
    cache_dtype: str


def _grow(cache, *, slots: int, cache_sharding):
    """The cache copied into a larger, zero-padded one (new slots are empty and invalid)."""
    cache = cache.padded(slots)
    if cache_sharding is not None:
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
    return cache


def _extend(graphdef, params, cache, tokens, valid_bt, keep_b, positions, rope, packing=None):
    """Prefill on top of a kept cache: row r keeps its first `keep_b[r]` cached tokens (later ones are
    marked invalid, so a row can also be cut back), then its left-padded tail is written at
    `cache.index` with positions continuing from `keep_b[r]` (`positions`, `rope` its tables).

    `tokens` and `positions` are [B, W] like `valid_bt`, or the tails packed into one [1, N] sequence
    that `packing` maps to it (projections and MLPs then skip the padding and the finished rows).
    """
    model = nnx.merge(graphdef, params)
    # Slots fill in token order, so a row's n-th valid slot holds its n-th cached token.
    held = jnp.cumsum(cache.valid, axis=1, dtype=jnp.int32)
    cache = cache.replace(valid=cache.valid & (held <= keep_b[:, None]))
    hidden, cache = model.hidden_states(tokens, positions, valid_bt, cache, rope, packing)
    if packing is None:
        return model.logits(hidden[:, -1:])[:, 0], cache, positions[:, -1]
    ends = packing.gather_bw[:, -1]  # left padding: the last column holds each row's last token
    return model.logits(hidden[0, ends][:, None])[:, 0], cache, positions[0, ends]


def _select_rows(cache, rows_b, *, cache_sharding):
    """The cache rows `rows_b` (in that order) as a new cache: a kept cache compacted to the rows
    still in play, so the extension and the decode stop paying for finished conversations."""
    take = lambda x: jnp.take(x, rows_b, axis=1 if cache.stacked else 0)  # noqa: E731
    k = take(cache.k) if cache.stacked else tuple(take(x) for x in cache.k)
    v = take(cache.v) if cache.stacked else tuple(take(x) for x in cache.v)
    cache = cache.replace(k=k, v=v, valid=jnp.take(cache.valid, rows_b, axis=0))
    if cache_sharding is not None:
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
    return cache


def _copy_rows(cache, logits_bv, last_pos_b, rows_b, *, cache_sharding):
    """A prefill's cache rows, last logits and last positions gathered to the caller's rows: row r gets
    those of row `rows_b[r]` (identical prompts prefilled once, then one copy per prompt)."""
    take = lambda x: jnp.take(x, rows_b, axis=0)  # noqa: E731
    return _select_rows(cache, rows_b, cache_sharding=cache_sharding), take(logits_bv), take(last_pos_b)


def _compact(cache, keep_b, index, *, slots: int, cache_sharding):
    """The kept cache with each row's first `keep_b[r]` tokens moved to its first slots, in order, into a
    cache of `slots` slots whose next write is at `index` (>= every keep). A turn's tails are written for
    every row at one slot range, left-padded to the longest, and its replies get the budget's room, so a
    cache grows by (tail bucket + new-token room) per turn while each row grows by its own tail and reply:
    after a few turns most slots are empty, and attention, in the extension and in every decode step,
    reads them all. Attention depends on the slots' order only through causality, which moving every
    kept token before `index` keeps."""
    if slots > cache.slots:
        cache = cache.padded(slots)
    held = jnp.cumsum(cache.valid, axis=1, dtype=jnp.int32)
    valid = cache.valid & (held <= keep_b[:, None])
    order = jnp.argsort(~valid, axis=1, stable=True)[:, :slots]  # [B, slots]: kept slots first, in order
    lead = 1 if cache.stacked else 0  # a layers axis before the batch
    k_at = order[:, None, None, :][(None,) * lead]  # k: [..., B, KVH, D, S]
    v_at = order[:, None, :, None][(None,) * lead]  # v: [..., B, KVH, S, D]
    k = jax.tree.map(lambda x: jnp.take_along_axis(x, k_at, axis=-1), cache.k)
    v = jax.tree.map(lambda x: jnp.take_along_axis(x, v_at, axis=-2), cache.v)
    cache = KVCache(k=k, v=v, valid=jnp.arange(slots)[None, :] < keep_b[:, None], index=index)
    if cache_sharding is not None:
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
    return cache


# Process-wide, like the Sampler's prefill and decode: compiled once per model structure and shape.
EXTEND = jax.jit(_extend, static_argnums=0, donate_argnums=(2,))
# A gather per (kept rows, new rows) pair: a copy, cheap to compile.
SELECT_ROWS = jax.jit(_select_rows, static_argnames=("cache_sharding",))
COPY_ROWS = jax.jit(_copy_rows, static_argnames=("cache_sharding",))
# A gather per (rows, old slots, new slots), cheap to compile like GROW; nothing donated: the output
# is another shape, so XLA could not write it over the input.
COMPACT = jax.jit(_compact, static_argnames=("slots", "cache_sharding"))
# A plain copy (a cheap compile per size pair), so the model-sized extend program compiles per cache
# size only, not per (old size, new size).
GROW = jax.jit(_grow, static_argnames=("slots", "cache_sharding"))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def plan_reuse(kept: Kept, prompts, config, graphdef, params, width, batch, new_room, *, model, pad_token_id: int):
    """(row of each prompt, tokens kept per row, left-padded tails and their mask, cache slots, kept
    rows to carry over, the slot to compact the kept tokens up to or None), or None when a full prefill
    is the right call (see `Sampler.generate`).

    When the prompts fit in fewer rows than the kept cache has (`batch`, the bucket a fresh prefill
    would use, is smaller), the cache is compacted to the matched rows first: the last value lists
    the kept rows that make up the new cache, in order (None: all of them, unchanged), and the
    other values refer to the compacted rows."""
    if (model.spec.sliding_layers or kept.cache_dtype != config.kv_cache_dtype(model.dtype)
        or len(prompts) > len(kept.rows) or not kept.params.matches(graphdef, params)):
        return None
    rows = kept.rows
    free = set(range(len(rows)))
    rows_of, keeps = [], []
    for i, prompt in enumerate(prompts):
        best, best_keep = None, -1
        # The same row first: callers usually keep their order, and an exact continuation wins at once.
        for row in ([i] if i in free else []) + sorted(free):
            held = rows[row]
            shared = common_prefix(held, prompt) if held and held[0] == prompt[0] else 0
            shared = min(shared, len(prompt) - 1)  # feed at least one token: its logits start the decode
            if shared > best_keep:
                best, best_keep = row, shared
                if held and shared == len(held):  # a whole row continued: take it, stop searching
                    break
        free.discard(best)
        rows_of.append(best)
        keeps.append(best_keep)
    if sum(keeps) == 0:
        return None
    order = None
    if batch < len(rows):  # finished conversations hold rows: carry only the matched ones (plus filler)
        matched = set(rows_of)
        unused = [row for row in range(len(rows)) if row not in matched]
        order = rows_of + unused[: batch - len(rows_of)]
        rows = [rows[row] for row in order]
        rows_of = list(range(len(prompts)))
    tail = max(len(p) - k for p, k in zip(prompts, keeps))
    tail_width = fit_bucket(tail, config.prompt_buckets, "prompt length")
    if len(rows) * tail_width >= batch * width:
        return None
    cap = 2 * (width + new_room)

    def slots_for(index, slots):
        """Slots for this call's tails and replies written at `index`: `slots` if they fit, else a bucket,
        preferably with a turn's worth of headroom, so that the next turn need not grow it again."""
        if index + tail_width + new_room <= slots:
            return slots
        fits = [b + new_room for b in config.prompt_buckets if b >= index + tail_width]
        roomy = [s for s in fits if s >= index + tail_width + 2 * new_room and s <= cap]
        return (roomy or fits or [cap + 1])[0]

    slots, start = slots_for(kept.index, kept.cache.slots), None
    if config.compact_cache:  # each row's kept tokens moved to its first slots: the next write at the longest
        longest = max(keeps)
        if (compact := slots_for(longest, 0)) < slots:
            slots, start = compact, longest
    if slots > cap:
        return None
    keep = np.zeros(len(rows), np.int32)
    tokens = np.full((len(rows), tail_width), pad_token_id, np.int32)
    valid = np.zeros((len(rows), tail_width), bool)
    for prompt, row, k in zip(prompts, rows_of, keeps):
        keep[row] = k
        tokens[row, tail_width - (len(prompt) - k):] = prompt[k:]
        valid[row, tail_width - (len(prompt) - k):] = True
    return rows_of, keep, tokens, valid, slots, order, start
