"""Batched generation: jitted prefill + a compiled decode loop over a donated KV cache, returning
the completions with the per-token logprobs the RL update consumes (`Sampler`, `GenerationResult`).

How a call runs: prompts are left-padded to a length bucket and the batch to a batch bucket (so new
shapes compile at most once per bucket); one jitted prefill writes the cache and projects only the
last position (the prompts go through it packed into one sequence, so projections and MLPs skip
the padding; only attention and the cache write see the padded layout); one jitted
`lax.while_loop` samples every new token (`choice.choose`; exits early once every row is done); stop
strings are applied on the host afterwards by truncating at their first occurrence.
Across calls the Sampler keeps the last cache and feeds only what a new prompt adds to a cached row
(multi-turn play re-sends the whole conversation each turn); see `prefix` and `Sampler.generate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax import distributed
from spade_jax.models.decoder import KVCache, Packing, packed_weights, rope_tables
from spade_jax.models.sharding import activation_mesh
from spade_jax.sampling.choice import SamplingMode, choose, sampling_knobs
from spade_jax.sampling.config import SamplingConfig, fit_bucket
from spade_jax.sampling.packed import PACKED_WEIGHTS, cpu_kernel_applies
from spade_jax.sampling.prefix import COMPACT, COPY_ROWS, EXTEND, GROW, SELECT_ROWS, Kept, plan_reuse
from spade_jax.sampling.versions import ParamsVersion

FINISH_REASONS = ("eos", "stop", "length")


@dataclasses.dataclass
class GenerationResult:
    """Per row: the completion only (prompt excluded), ending with the EOS/stop token if one was hit.

    `logprobs[i][t]` is log softmax(model logits)[token] at temperature 1 with no top-k/top-p: the
    policy's own log-probability, which the RL update's importance ratio compares against.
    `sampling_logprobs[i][t]` is the log-probability under the distribution actually sampled from
    (temperature-scaled, top-k/top-p renormalised; 0.0 when greedy).
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    sampling_logprobs: list[list[float]]
    finish_reasons: list[str]  # "eos" | "stop" | "length"
    texts: list[str]  # decoded completion (special tokens skipped; cut after a stop string)
    prompt_lengths: list[int]


# ---------------------------------------------------------------------------------------------------
# Compiled pieces. `graphdef` and the sampling config are static; params and the cache are traced.


def _prefill(graphdef, params, tokens, valid_bt, positions, rope, packing, *, slots: int,
             cache_dtype: str, cache_sharding):
    """Fill a new cache with left-padded prompts; the logits and position of each row's last token.

    `tokens` and `positions` are [B, W] like `valid_bt`, or one packed [1, N] sequence that `packing`
    maps to it. `rope` is `rope_tables` of `positions` from a separate call (see
    `Decoder.hidden_states`).
    """
    model = nnx.merge(graphdef, params)
    cache = model.new_cache(valid_bt.shape[0], slots, jnp.dtype(cache_dtype))
    if cache_sharding is not None:
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
    hidden, cache = model.hidden_states(tokens, positions, valid_bt, cache, rope, packing)
    if packing is None:
        last_be, last_pos = hidden[:, -1], positions[:, -1]
    else:  # left padding: the last column holds each row's last token
        ends = packing.gather_bw[:, -1]
        last_be, last_pos = hidden[0, ends], positions[0, ends]
    return model.logits(last_be[:, None])[:, 0], cache, last_pos


def _decode(graphdef, params, cache, logits_bv, last_pos_b, live_b, row_ids, key, max_new, knobs,
            stop_ids, packed_head=None, *, mode: SamplingMode, new_room: int, packed: bool = False):
    """Sample up to `max_new` tokens. Budget, knobs and stop ids are traced: they never recompile.

    `packed`: `params` come from `PACKED_WEIGHTS` (and `packed_head` with them), and the steps'
    matmuls run `kernels.packed_matmul`.

    `stop_ids` [n, 2] holds (token id, 1 for EOS / 2 for a stop token); id -1 never matches.
    `row_ids` [B] is each row's index in the caller's batch: its random draws depend on that, not on
    the cache row it happens to occupy (a reused cache keeps each conversation in its old row).
    """
    model = nnx.merge(graphdef, params)
    batch = logits_bv.shape[0]
    out_tokens = jnp.zeros((batch, new_room), jnp.int32)
    out_logp = jnp.zeros((batch, new_room), jnp.float32)
    out_slogp = jnp.zeros((batch, new_room), jnp.float32)

    def emit(step, logits, done, reason, outs):
        token, logp, slogp = choose(logits, key, step, row_ids, mode, knobs)
        keep = ~done
        tokens, lp, slp = outs
        tokens = tokens.at[:, step].set(jnp.where(keep, token, 0))
        lp = lp.at[:, step].set(jnp.where(keep, logp, 0.0))
        slp = slp.at[:, step].set(jnp.where(keep, slogp, 0.0))
        hit = stop_ids[None, :, 0] == token[:, None]  # [B, n]
        code = jnp.max(jnp.where(hit, stop_ids[None, :, 1], 0), axis=-1)  # 0: none
        ended = keep & (code > 0)
        reason = jnp.where(ended, code, reason)
        return token, done | ended, reason, (tokens, lp, slp)

    done0 = ~live_b
    token, done, reason, outs = emit(
        0, logits_bv, done0, jnp.zeros((batch,), jnp.int32), (out_tokens, out_logp, out_slogp)
    )
    count = jnp.where(done0, 0, 1).astype(jnp.int32)

    def cond(carry):
        step, _, _, done, *_ = carry
        return (step < max_new) & ~jnp.all(done)

    # The RoPE tables of the next position ride in the carry, computed once per step: made inside the
    # step, XLA:CPU would fuse their cos/sin into every layer's q and k again (see hidden_states).
    def next_rope(pos):
        return rope_tables(model.spec, pos[:, None] + 1)

    def body(carry):
        step, token, cache, done, reason, pos, rope, count, outs = carry
        pos = pos + 1
        hidden, cache = model.hidden_states(token[:, None], pos[:, None], (~done)[:, None], cache, rope)
        logits = model.logits(hidden)[:, 0]
        count = count + jnp.where(done, 0, 1)
        token, done, reason, outs = emit(step, logits, done, reason, outs)
        return step + 1, token, cache, done, reason, pos, next_rope(pos), count, outs

    carry = (jnp.int32(1), token, cache, done, reason, last_pos_b, next_rope(last_pos_b), count, outs)
    with packed_weights(packed_head) if packed else contextlib.nullcontext():  # the body is traced here
        _, _, cache, done, reason, _, _, count, outs = jax.lax.while_loop(cond, body, carry)
    tokens, lp, slp = outs
    return tokens, lp, slp, count, reason, cache


# Process-wide: every Sampler over models of the same structure shares the compiled programs.
def _under_own_mesh(method):
    """Runs a Sampler method under its mesh, so that the model's activation sharding constraints apply
    while it traces (models.sharding)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with activation_mesh(self.mesh):
            return method(self, *args, **kwargs)

    return run


_PREFILL = jax.jit(_prefill, static_argnums=0, static_argnames=("slots", "cache_dtype", "cache_sharding"))
_DECODE = jax.jit(_decode, static_argnums=0, static_argnames=("mode", "new_room", "packed"), donate_argnums=(2,))

# What `Sampler.counts` totals: generate calls; prompt tokens given and taken from the kept cache;
# token rows the prefill (or cache extension) and the decode steps ran through the model, padding
# included (batch x steps: the work done); tokens returned.
COUNT_KEYS = ("calls", "prompt_tokens", "reused_tokens", "prefill_rows", "decode_rows", "generated_tokens")
_ROPE = jax.jit(rope_tables, static_argnums=0)


class Sampler:
    """Generates from an NNX `Decoder` (its current parameters are read on every call, so training
    updates are seen without rebuilding). Prefill compiles once per (batch bucket, prompt bucket, cache
    size, packed-length bucket: see `SamplingConfig.pack_prompts`); decode once per (batch bucket,
    cache size, greedy / top-k on / top-p on). Temperature, top-k, top-p values, token budget and
    stop ids are traced, so changing them never recompiles.

    Prefix reuse (`SamplingConfig.reuse_prefix`, on by default): the Sampler keeps the cache of its
    last call, and per cache row the tokens it holds (prompt + completion minus its last token). When
    new prompts continue those rows (multi-turn play re-sends prompt + reply + next user turn), only
    each prompt's new tail is fed (`prefix.EXTEND`, compiled once per batch bucket, tail bucket, cache
    size and, with `SamplingConfig.pack_tails`, packed length), and the results are those of a full
    prefill. One cache is kept per Sampler: callers that interleave (designer, hint writer, agent)
    simply replace it; `forget()` frees it.
    """

    def __init__(self, model, tokenizer=None, *, mesh=None, eos_token_ids: Sequence[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.mesh = mesh
        if eos_token_ids is None:
            eos_token_ids = getattr(tokenizer, "eos_token_ids", None) or model.spec.eos_token_ids
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or (0,))[0])
        self._prefill, self._decode = _PREFILL, _DECODE
        self._stop_ids_cache: dict[tuple[str, ...], tuple[int, ...]] = {}
        self._kept: Kept | None = None
        self.last_reused_tokens = 0  # prompt tokens the last call took from the kept cache (0: full prefill)
        self.last_fed_tokens = 0  # token rows the last call's prefill ran through the matmuls (padding included)
        # Running totals since the last `pop_counts()`: what the model computed, padding included.
        self.counts = dict.fromkeys(COUNT_KEYS, 0)

    def _packed(self, pack: bool, config: SamplingConfig, tokens, valid, positions, *, coarse: bool = False):
        """(tokens, positions, packing) of a left-padded [B, W] block for a prefill or a cache extension:
        packed into one sequence (a `Packing`) if `pack` and it saves rows, else as given (packing None).
        Under a batch-sharded mesh the block stays padded: a packed sequence has no rows to shard.

        `coarse`: the packed length is the block's size over 2, 4 or 8, not a bucket of `packed_buckets`. A
        multi-turn play extends its cache once per turn at ever other shapes, each a compile of the model;
        with a free packed length nearly every call was a new shape, and a 3-iteration `laptop` run's plays
        took longer than unpacked despite 17% fewer token rows."""
        if pack and self._batch_axes() is None:
            count = int(valid.sum())
            if coarse:
                halves = [valid.size >> k for k in (3, 2, 1) if valid.size % (1 << k) == 0]
                length = next((n for n in halves if n >= count), valid.size)
            else:
                length = fit_bucket(count, config.packed_buckets, "packed prompt length")
            if length < valid.size:
                tokens, positions, packing = _pack(tokens, valid, positions, length, self.pad_token_id)
                return tokens, positions, Packing(*map(self._put_batch, packing))
        return tokens, positions, None

    # -- sharding -----------------------------------------------------------------------------------

    def _batch_axes(self):
        if self.mesh is None:
            return None
        axes = tuple(a for a in ("data", "fsdp") if a in self.mesh.axis_names and self.mesh.shape[a] > 1)
        return axes or None

    def _batch_multiple(self) -> int:
        axes = self._batch_axes()
        return int(np.prod([self.mesh.shape[a] for a in axes])) if axes else 1

    def _put_batch(self, array):
        if self.mesh is None:
            return jnp.asarray(array)
        from jax.sharding import NamedSharding, PartitionSpec

        spec = PartitionSpec(self._batch_axes(), *([None] * (array.ndim - 1)))
        return jax.device_put(array, NamedSharding(self.mesh, spec))

    def _cache_sharding(self):
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec as P

        batch = self._batch_axes()
        kv = "tensor" if "tensor" in self.mesh.axis_names else None
        if kv and self.model.spec.num_kv_heads % self.mesh.shape[kv]:
            kv = None
        if self.model.scan_layers:  # the layout `Decoder.new_cache` makes
            layers = NamedSharding(self.mesh, P(None, batch, kv, None, None))
        else:
            layers = (NamedSharding(self.mesh, P(batch, kv, None, None)),) * self.model.spec.num_layers
        return KVCache(
            k=layers,
            v=layers,
            valid=NamedSharding(self.mesh, P(batch, None)),
            index=NamedSharding(self.mesh, P()),
        )

    # -- public -------------------------------------------------------------------------------------

    @property
    def compile_count(self) -> int:
        """Programs compiled so far in this process by all Samplers (prefill, extend, decode); bounded by
        the buckets and model structures, not by the number of calls."""
        programs = (self._prefill, self._decode, EXTEND, GROW, SELECT_ROWS, COPY_ROWS, COMPACT)
        return sum(f._cache_size() for f in programs)

    def forget(self) -> None:
        """Drop the cache kept from the last call and the model's packed decode weights (their memory is
        freed; the next call prefills fully and packs again)."""
        self._kept = None
        PACKED_WEIGHTS.forget(*nnx.split(self.model))

    def uses_cpu_kernel(self, config: SamplingConfig) -> bool:
        """Whether `generate` with `config` decodes with `kernels.packed_matmul` (see `cpu_kernel`)."""
        return (self.mesh is None or self.mesh.size == 1) and cpu_kernel_applies(config, self.model)

    @_under_own_mesh
    def generate(
        self, prompts: Sequence[Sequence[int]], config: SamplingConfig, key: jax.Array | int = 0
    ) -> GenerationResult:
        """Complete each prompt (a list of token ids); see `GenerationResult` for what comes back.

        With `config.reuse_prefix`, each prompt is matched to a distinct row of the kept cache by their
        longest common token prefix; that row keeps those tokens' K/V (anything it held past them is
        masked out) and only the rest of the prompt is fed, at positions continuing the row's own.
        A full prefill is used instead when nothing was kept, the parameters changed since (checked by
        array identity, so a training update invalidates the cache), the model has sliding-window
        layers (their window counts slots, and a reused row has holes), there are more prompts than
        cache rows, nothing is shared, or feeding the tails is no cheaper than a full prefill (kept
        rows x tail bucket >= batch x prompt bucket). A cache without room for the tails plus the new
        tokens is grown by copying (a separate small program) to (a prompt bucket) + new-token room,
        always a size a fresh prefill could allocate too, so extend/decode compiles stay bounded by the
        buckets; the bucket is the smallest past index + tail + new-token room (a turn of headroom) or,
        if that is over the cap below, past index + tail. If the cache would be more than twice the size
        of a fresh one (too many holes to attend over), the call falls back to a full prefill, which
        also compacts the cache.

        A full prefill feeds each distinct prompt once (`prefill_distinct`): identical prompts (a GRPO group
        opening on one instance) share one prefilled row, copied to each before the decode, whose random
        draws stay per prompt.
        """
        if not prompts:
            raise ValueError("generate needs at least one prompt")
        prompts = [[int(t) for t in p] for p in prompts]
        lengths = [len(p) for p in prompts]
        if min(lengths) < 1:
            raise ValueError("every prompt needs at least one token")
        if isinstance(key, int):
            key = jax.random.key(key)
        spec = self.model.spec
        longest = max(lengths)
        if longest + config.max_new_tokens > spec.max_position:
            raise ValueError(
                f"prompt of {longest} tokens + {config.max_new_tokens} new tokens exceeds the model's "
                f"context of {spec.max_position}; shorten the prompt or lower max_new_tokens"
            )
        width = fit_bucket(longest, config.prompt_buckets, "prompt length")
        multiple = self._batch_multiple()

        def batch_bucket(rows: int) -> int:  # a batch bucket that the mesh's batch axes divide
            return -(-fit_bucket(rows, config.batch_buckets, "batch size") // multiple) * multiple

        batch = batch_bucket(len(prompts))
        new_room = -(-config.max_new_tokens // config.new_token_bucket) * config.new_token_bucket

        stop_ids = [] if config.ignore_eos else [(i, 1) for i in self.eos_token_ids]
        seen = {i for i, _ in stop_ids}
        for i in (*config.stop_token_ids, *self._ids_holding(config.stop_strings)):
            if i not in seen:
                seen.add(i)
                stop_ids.append((i, 2))
        # Padded to a multiple of 8 so that a few more stop ids do not change the compiled shape.
        stop_ids += [(-1, 1)] * (-len(stop_ids) % 8 or (8 if not stop_ids else 0))
        mode = SamplingMode.of(config)

        graphdef, params = nnx.split(self.model)
        kept, self._kept = self._kept, None  # donated below either way; a failed call keeps nothing
        plan = None
        if config.reuse_prefix and kept is not None:
            plan = plan_reuse(kept, prompts, config, graphdef, params, width, batch, new_room,
                              model=self.model, pad_token_id=self.pad_token_id)
        self.last_reused_tokens = 0
        if plan is None:
            kept = None  # free the old cache before allocating the new one
            rows_of = list(range(len(prompts)))
            # Identical prompts (a GRPO group's plays of one instance open with the same observation) are
            # prefilled once, then their cache rows, logits and positions copied to each (COPY_ROWS).
            first_of: dict[tuple[int, ...], int] = {}
            source = np.array([first_of.setdefault(tuple(p), len(first_of)) for p in prompts], np.int32)
            distinct = [list(p) for p in first_of]
            prefill_batch = batch
            if config.prefill_distinct and len(distinct) < len(prompts):
                prefill_batch = batch_bucket(len(distinct))
            tokens = np.full((prefill_batch, width), self.pad_token_id, np.int32)
            valid = np.zeros((prefill_batch, width), bool)
            for row, prompt in enumerate(distinct if prefill_batch < batch else prompts):
                tokens[row, width - len(prompt):] = prompt  # left padding: every row writes the same cache slot
                valid[row, width - len(prompt):] = True
            positions = _left_padded_positions(valid)
            tokens, positions, packing = self._packed(config.pack_prompts, config, tokens, valid, positions)
            self.last_fed_tokens = tokens.size
            positions = self._put_batch(positions)
            logits, cache, last_pos = self._prefill(
                graphdef, params, self._put_batch(tokens), self._put_batch(valid), positions,
                _ROPE(self.model.spec, positions), packing, slots=width + new_room,
                cache_dtype=config.kv_cache_dtype(self.model.dtype), cache_sharding=self._cache_sharding(),
            )
            if prefill_batch < batch:
                copies = np.zeros(batch, np.int32)  # rows without a prompt copy row 0; they never decode
                copies[: len(prompts)] = source
                cache, logits, last_pos = COPY_ROWS(cache, logits, last_pos, self._put_batch(copies),
                                                    cache_sharding=self._cache_sharding())
        else:
            rows_of, keep, tokens, valid, slots, order, start = plan
            batch = len(tokens)
            cache, kept = kept.cache, None
            if order is not None:
                cache = SELECT_ROWS(cache, self._put_batch(np.asarray(order, np.int32)),
                                    cache_sharding=self._cache_sharding())
            if start is not None:
                cache = COMPACT(cache, self._put_batch(keep), jnp.int32(start), slots=slots,
                                cache_sharding=self._cache_sharding())
            elif slots > cache.slots:
                cache = GROW(cache, slots=slots, cache_sharding=self._cache_sharding())
            positions = keep[:, None] + _left_padded_positions(valid)
            tokens, positions, packing = self._packed(config.pack_tails, config, tokens, valid, positions, coarse=True)
            positions = self._put_batch(positions)
            logits, cache, last_pos = EXTEND(
                graphdef, params, cache, self._put_batch(tokens), self._put_batch(valid), self._put_batch(keep),
                positions, _ROPE(self.model.spec, positions), packing,
            )
            self.last_reused_tokens = int(keep.sum())
            self.last_fed_tokens = tokens.size
        live = np.zeros(batch, bool)
        live[rows_of] = True
        row_ids = np.arange(batch, dtype=np.int32) + len(prompts)  # rows without a prompt: any unused id
        row_ids[rows_of] = np.arange(len(prompts))
        decode_params, head, packed = params, None, self.uses_cpu_kernel(config)
        if packed:
            decode_params, head = PACKED_WEIGHTS.get(graphdef, params)
        out = self._decode(
            graphdef, decode_params, cache, logits, last_pos, self._put_batch(live), self._put_batch(row_ids),
            key, jnp.int32(config.max_new_tokens), sampling_knobs(config), jnp.asarray(stop_ids, jnp.int32), head,
            mode=mode, new_room=new_room, packed=packed,
        )
        *arrays, cache = out
        # Every process gets every row (an all-gather over processes when rows are spread over hosts).
        out_tokens, out_logp, out_slogp, count, reason, index = distributed.fetch((*arrays, cache.index))
        self.counts["calls"] += 1
        self.counts["prompt_tokens"] += sum(lengths)
        self.counts["reused_tokens"] += self.last_reused_tokens
        self.counts["prefill_rows"] += self.last_fed_tokens
        self.counts["decode_rows"] += batch * int(count.max(initial=0))  # every row steps until the last stops
        self.counts["generated_tokens"] += int(count[rows_of].sum())
        if config.reuse_prefix:
            held = [[] for _ in range(batch)]
            for prompt, row in zip(prompts, rows_of):
                # The last sampled token was never fed through the model: its K/V are not in the cache.
                held[row] = prompt + [int(t) for t in out_tokens[row, : max(int(count[row]) - 1, 0)]]
            self._kept = Kept(cache, held, int(index), ParamsVersion.of(graphdef, params),
                              config.kv_cache_dtype(self.model.dtype))
        order = np.asarray(rows_of)
        return self._finish(prompts, config, out_tokens[order], out_logp[order], out_slogp[order],
                            count[order], reason[order])

    def pop_counts(self) -> dict[str, int]:
        """The token totals since the last call (`COUNT_KEYS`), and a fresh start."""
        counts, self.counts = self.counts, dict.fromkeys(COUNT_KEYS, 0)
        return counts

    def _ids_holding(self, stop_strings: tuple[str, ...]) -> tuple[int, ...]:
        """Token ids whose own text holds a stop string: sampling one ends the row on device (the host
        cut would end the completion at that token anyway), so a row stops instead of running on to
        max_new_tokens. Stop strings that span tokens are still found by the host cut alone."""
        if not stop_strings or self.tokenizer is None:
            return ()
        if stop_strings not in self._stop_ids_cache:
            decode = self.tokenizer.decode
            self._stop_ids_cache[stop_strings] = tuple(
                i for i in range(self.model.spec.vocab_size)
                if any(s in decode([i], skip_special_tokens=False) for s in stop_strings)
            )
        return self._stop_ids_cache[stop_strings]

    def _finish(self, prompts, config, out_tokens, out_logp, out_slogp, count, reason):
        result = GenerationResult([], [], [], [], [], [len(p) for p in prompts])
        for row in range(len(prompts)):
            n = int(count[row])
            toks = [int(t) for t in out_tokens[row, :n]]
            why = {0: "length", 1: "eos", 2: "stop"}[int(reason[row])]
            if config.stop_strings and self.tokenizer is not None:
                cut = _stop_string_cut(self.tokenizer, toks, config.stop_strings)
                if cut is not None:
                    toks, why = toks[:cut], "stop"
                    n = cut
            text = ""
            if self.tokenizer is not None:
                body = toks[:-1] if why == "eos" else toks
                text = self.tokenizer.decode(body)
                if why == "stop" and config.stop_strings:
                    text = _cut_text(text, config.stop_strings)
            result.tokens.append(toks)
            result.logprobs.append([float(x) for x in out_logp[row, :n]])
            result.sampling_logprobs.append([float(x) for x in out_slogp[row, :n]])
            result.finish_reasons.append(why)
            result.texts.append(text)
        return result


def _pack(tokens_bw: np.ndarray, valid_bw: np.ndarray, positions_bw: np.ndarray, length: int, pad_id: int):
    """The valid tokens of a padded [B, W] block as one [1, length] sequence (trailing pad tokens), their
    positions, and the `Packing` index arrays that map it back to the block (padding: index 0)."""
    at = np.flatnonzero(valid_bw)  # row-major: each row's tokens together, in order
    tokens = np.full((1, length), pad_id, np.int32)
    positions = np.zeros((1, length), np.int32)
    gather = np.zeros(valid_bw.size, np.int32)
    scatter = np.zeros(length, np.int32)
    tokens[0, :at.size] = tokens_bw.ravel()[at]
    positions[0, :at.size] = positions_bw.ravel()[at]
    gather[at] = np.arange(at.size)
    scatter[:at.size] = at
    return tokens, positions, (gather.reshape(valid_bw.shape), scatter)


def _left_padded_positions(valid_bt: np.ndarray) -> np.ndarray:
    """Position of each token of left-padded rows: 0, 1, ... over the valid ones (padding: 0)."""
    return np.maximum(np.cumsum(valid_bt, axis=1, dtype=np.int32) - 1, 0)


def _cut_text(text: str, stops: Sequence[str]) -> str:
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text


def _stop_string_cut(tokenizer, tokens: list[int], stops: Sequence[str]) -> int | None:
    """Smallest prefix length whose decoded text contains a stop string (None if the whole doesn't).

    "Contains a stop string" only grows with the prefix, so a binary search needs O(log n) decodes.
    """
    def hit(n):
        text = tokenizer.decode(tokens[:n], skip_special_tokens=False)
        return any(s in text for s in stops)

    if not tokens or not hit(len(tokens)):
        return None
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if hit(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@functools.partial(jax.jit, static_argnums=0)
def _full_logprobs(graphdef, params, tokens_bt):
    model = nnx.merge(graphdef, params)
    positions = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1]), tokens_bt.shape)
    logits, _ = model(tokens_bt, positions)
    return jax.nn.log_softmax(logits, axis=-1)


def sequence_logprobs(model, prompt: Sequence[int], completion: Sequence[int]) -> np.ndarray:
    """Temperature-1 logprobs of `completion` after `prompt` from one full forward pass (no cache);
    the reference the sampler's `logprobs` must match.
    """
    ids = list(prompt) + list(completion)
    graphdef, params = nnx.split(model)
    logp = np.asarray(_full_logprobs(graphdef, params, jnp.asarray([ids], jnp.int32)))[0]
    start = len(prompt)
    return np.array([logp[start - 1 + t, tok] for t, tok in enumerate(completion)], np.float32)
