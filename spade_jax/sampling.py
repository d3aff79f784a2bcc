"""Batched text generation: jitted prefill + a compiled decode loop over a donated KV cache, with
temperature / top-k / top-p / greedy sampling and the per-token logprobs the RL update consumes.

How a call runs: prompts are left-padded to a length bucket and the batch to a batch bucket (so new
shapes compile at most once per bucket); one jitted prefill writes the cache and projects only the
last position (the prompts go through it packed into one sequence, so projections and MLPs skip
the padding; only attention and the cache write see the padded layout); one jitted
`lax.while_loop` samples every new token (exits early once every row is done); stop strings are
applied on the host afterwards by truncating at their first occurrence.
Across calls the Sampler keeps the last cache and feeds only what a new prompt adds to a cached row
(multi-turn play re-sends the whole conversation each turn); see `Sampler.generate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax import kernels
from spade_jax.models.decoder import KVCache, Packing, pack_decode_weights, packed_weights, rope_tables

FINISH_REASONS = ("eos", "stop", "length")
_SAMPLE_BLOCK = 128  # vocabulary block for two-level inverse-CDF sampling (no sort, no Gumbel noise)


def _powers_of_two(start: int, stop: int) -> tuple[int, ...]:
    out, size = [], start
    while size < stop:
        out.append(size)
        size *= 2
    return tuple(out) + (stop,)


def _half_octaves(start: int, stop: int) -> tuple[int, ...]:
    """start, 1.5 start, 2 start, 3 start, 4 start, ...: padding wastes at most a third, on average
    about a sixth, for two compiled shapes per doubling."""
    out = []
    for size in _powers_of_two(start, stop):
        out += [size, size * 3 // 2]
    return tuple(s for s in out if s < stop) + (stop,)


def _quarter_octaves(start: int, stop: int) -> tuple[int, ...]:
    """start * 2**(i/4) rounded up to a multiple of 8: padding wastes at most a fifth, four compiled
    shapes per doubling."""
    out, i = [], 0
    while (size := -(-int(math.ceil(start * 2 ** (i / 4))) // 8) * 8) < stop:
        if not out or size > out[-1]:
            out.append(size)
        i += 1
    return tuple(out) + (stop,)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 256  # tokens to generate at most per row (EOS included)
    temperature: float = 1.0  # softmax temperature; 0 means greedy (argmax)
    top_p: float = 1.0  # nucleus: keep the smallest top set with this much probability (1 = off)
    top_k: int = 0  # keep only the k most likely tokens (0 = off)
    # Cut the completion right after the first match (host side); a sampled token whose own text
    # holds a stop string also ends its row on device, so such rows do not run on to the budget.
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # device-side: these ids end a row like EOS (reason "stop")
    ignore_eos: bool = False  # keep going after EOS (benchmarks that need fixed lengths)
    prompt_buckets: tuple[int, ...] = _half_octaves(32, 1 << 17)  # padded prompt lengths
    # Prefill the prompts packed into one sequence (padding skipped by everything but attention),
    # its length padded to one of `packed_buckets`; off, or under a batch-sharded mesh, the prefill
    # runs on the padded [batch, prompt bucket] block. Results are the same either way.
    pack_prompts: bool = True
    packed_buckets: tuple[int, ...] = _quarter_octaves(32, 1 << 20)
    batch_buckets: tuple[int, ...] = _powers_of_two(1, 1 << 16)  # padded batch sizes
    new_token_bucket: int = 64  # cache room for new tokens is max_new_tokens rounded up to this
    # KV cache dtype. "auto": float32 on a CPU (XLA:CPU attends faster over f32), the model's compute
    # dtype on an accelerator (a GPU trace of a bf16 model over an f32 cache spent ~10% of each
    # decode step converting every layer's cache window to bf16).
    cache_dtype: str = "auto"
    # Decode matmuls on a CPU: "auto" uses the packed float32 kernel (`spade_jax.kernels`) for a
    # float32 model on one x86 CPU device with AVX2 or AVX-512 where it builds, "xla" always XLA's dot. The kernel
    # reads a packed copy of the weights (the model's size again; see `PACKED_WEIGHTS`).
    cpu_kernel: str = "auto"
    # Host-only: feed only the new tail of prompts that extend the previous call's rows (same results).
    # compare=False keeps it out of ==/hash, so caches keyed by a config never split over it.
    reuse_prefix: bool = dataclasses.field(default=True, compare=False)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {self.stop_token_ids}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings must be non-empty strings")
        for name in ("prompt_buckets", "batch_buckets", "packed_buckets"):
            buckets = getattr(self, name)
            if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(f"{name} must be increasing positive sizes, got {buckets}")
        if self.new_token_bucket < 1:
            raise ValueError(f"new_token_bucket must be >= 1, got {self.new_token_bucket}")
        if self.cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"cache_dtype must be auto, float32, bfloat16 or float16, got {self.cache_dtype}")
        if self.cpu_kernel not in ("auto", "xla"):
            raise ValueError(f"cpu_kernel must be auto or xla, got {self.cpu_kernel}")

    def kv_cache_dtype(self, compute_dtype) -> str:
        """The KV cache dtype's name for a model computing in `compute_dtype` (resolves "auto")."""
        if self.cache_dtype != "auto":
            return self.cache_dtype
        return "float32" if jax.default_backend() == "cpu" else jnp.dtype(compute_dtype).name

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplingConfig":
        return dataclasses.replace(self, **changes)


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


def _bucket(size: int, buckets: Sequence[int], what: str) -> int:
    for b in buckets:
        if b >= size:
            return b
    raise ValueError(f"{what} {size} exceeds the largest bucket {buckets[-1]}; add a larger bucket")


# ---------------------------------------------------------------------------------------------------
# Token choice inside the compiled loop.


def _first_max_index(x_bv):
    """argmax over the last axis via two plain reductions (XLA:CPU's variadic argmax is slower)."""
    iota = jnp.arange(x_bv.shape[-1], dtype=jnp.int32)
    top = jnp.max(x_bv, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x_bv == top, iota, x_bv.shape[-1]), axis=-1)


def _bisect_floor(probs_bv, enough, iters: int = 32):
    """Largest t in (0, max p] with enough(p >= t) true, by bisection over t (an XLA:CPU sort of the
    vocabulary costs ~200 ms at batch 16; 32 masked reductions cost a few ms).
    """
    lo = jnp.zeros(probs_bv.shape[:-1], probs_bv.dtype)
    hi = jnp.max(probs_bv, axis=-1) * (1 + 1e-6) + 1e-30

    def halve(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        ok = enough(probs_bv >= mid[:, None])
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, iters, halve, (lo, hi))
    return lo


def _top_k_floor(probs_bv, top_k):
    """Probability of the k-th most likely token (ties at it are kept, as transformers' warper does)."""
    return _bisect_floor(probs_bv, lambda keep: jnp.sum(keep, axis=-1) >= top_k)


def _top_p_floor(probs_bv, top_p):
    """Smallest kept probability of the nucleus: the largest t with mass(p >= t) >= top_p, which is
    transformers' sorted-cumulative rule up to ties and float32 resolution.
    """
    return _bisect_floor(
        probs_bv, lambda keep: jnp.sum(jnp.where(keep, probs_bv, 0.0), axis=-1) >= top_p * (1 - 1e-6)
    )


def _inverse_cdf(weights_bv, uniform_b):
    """Index drawn with probability proportional to `weights_bv`, via block sums then one block's
    prefix sums: O(V) work without a sort or V random numbers (both are slow on XLA:CPU).
    """
    b, v = weights_bv.shape
    blocks = -(-v // _SAMPLE_BLOCK)
    w = jnp.pad(weights_bv, ((0, 0), (0, blocks * _SAMPLE_BLOCK - v))).reshape(b, blocks, _SAMPLE_BLOCK)
    block_cum = jnp.cumsum(w.sum(-1), axis=-1)  # [B, blocks]
    target = uniform_b * block_cum[:, -1]
    block = jnp.minimum(jnp.sum(block_cum <= target[:, None], axis=-1), blocks - 1)
    before = jnp.where(
        block > 0, jnp.take_along_axis(block_cum, jnp.maximum(block - 1, 0)[:, None], 1)[:, 0], 0.0
    )
    inner = jnp.take_along_axis(w, block[:, None, None], 1)[:, 0]  # [B, block]
    inner_cum = jnp.cumsum(inner, axis=-1) + before[:, None]
    # Zero-weight entries never win: step past positions whose cumulative sum does not exceed target.
    within = jnp.minimum(jnp.sum(inner_cum <= target[:, None], axis=-1), _SAMPLE_BLOCK - 1)
    index = block * _SAMPLE_BLOCK + within
    # Float rounding at the very end can land on padding; fall back to the last real token with weight.
    return jnp.minimum(index, v - 1)


@dataclasses.dataclass(frozen=True)
class _Mode:
    """The compile-time part of a sampling config; the numbers themselves are traced arguments."""

    greedy: bool
    top_k: bool  # filter by top_k
    top_p: bool  # filter by top_p

    @classmethod
    def of(cls, config: SamplingConfig) -> "_Mode":
        return cls(config.greedy, config.top_k > 0 and not config.greedy,
                   config.top_p < 1.0 and not config.greedy)


def _knobs(config: SamplingConfig):
    """Traced sampling numbers: changing them never recompiles."""
    return (jnp.float32(max(config.temperature, 1e-6)), jnp.int32(config.top_k),
            jnp.float32(config.top_p))


def _choose(logits_bv, key, step, row_ids, mode: _Mode, knobs):
    """Next token per row, its temperature-1 logprob, and its logprob under the sampled distribution."""
    temperature, top_k, top_p = knobs
    logp = jax.nn.log_softmax(logits_bv, axis=-1)
    if mode.greedy:
        token = _first_max_index(logits_bv)
        return token, jnp.take_along_axis(logp, token[:, None], 1)[:, 0], jnp.zeros_like(logp[:, 0])
    scaled = logits_bv / temperature
    weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
    if mode.top_k or mode.top_p:
        probs = weights / jnp.sum(weights, axis=-1, keepdims=True)
        if mode.top_k:  # transformers' order: temperature, then top-k, then top-p on the renormalised rest
            probs = jnp.where(probs >= _top_k_floor(probs, top_k)[:, None], probs, 0.0)
            probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        if mode.top_p:
            probs = jnp.where(probs >= _top_p_floor(probs, top_p)[:, None], probs, 0.0)
        weights = jnp.where(probs > 0, weights, 0.0)
    # One uniform per row from (key, row, step): a row's draw does not depend on its batch neighbours.
    step_key = jax.random.fold_in(key, step)
    uniform = jax.vmap(lambda r: jax.random.uniform(jax.random.fold_in(step_key, r)))(row_ids)
    token = _inverse_cdf(weights, uniform)
    chosen = jnp.take_along_axis(weights, token[:, None], 1)[:, 0]
    sampling_logp = jnp.log(chosen) - jnp.log(jnp.sum(weights, axis=-1))
    return token, jnp.take_along_axis(logp, token[:, None], 1)[:, 0], sampling_logp


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
            stop_ids, packed_head=None, *, mode: _Mode, new_room: int, packed: bool = False):
    """Sample up to `max_new` tokens. Budget, knobs and stop ids are traced: they never recompile.

    `packed`: `params` come from `_packed_params` (and `packed_head` with them), and the steps'
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
        token, logp, slogp = _choose(logits, key, step, row_ids, mode, knobs)
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
    token, done, reason, outs = emit(0, logits_bv, done0, jnp.zeros((batch,), jnp.int32), (out_tokens, out_logp, out_slogp))
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


def _packed_params(graphdef, params):
    """The decode-step weights in `kernels.pack` order (other leaves returned as they are) and the
    packed output projection: see `pack_decode_weights`."""
    model = nnx.merge(graphdef, params)
    head = pack_decode_weights(model)
    return nnx.split(model)[1], head


def _grow(cache, *, slots: int, cache_sharding):
    """The cache copied into a larger, zero-padded one (new slots are empty and invalid)."""
    cache = cache.padded(slots)
    if cache_sharding is not None:
        cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
    return cache


def _extend(graphdef, params, cache, tokens_bt, valid_bt, keep_b, positions_bt, rope):
    """Prefill on top of a kept cache: row r keeps its first `keep_b[r]` cached tokens (later ones are
    marked invalid, so a row can also be cut back), then its left-padded tail is written at
    `cache.index` with positions continuing from `keep_b[r]` (`positions_bt`, `rope` its tables).
    """
    model = nnx.merge(graphdef, params)
    # Slots fill in token order, so a row's n-th valid slot holds its n-th cached token.
    held = jnp.cumsum(cache.valid, axis=1, dtype=jnp.int32)
    cache = cache.replace(valid=cache.valid & (held <= keep_b[:, None]))
    hidden, cache = model.hidden_states(tokens_bt, positions_bt, valid_bt, cache, rope)
    logits_bv = model.logits(hidden[:, -1:])[:, 0]
    return logits_bv, cache, positions_bt[:, -1]


# Process-wide: every Sampler over models of the same structure shares the compiled programs.
_PREFILL = jax.jit(_prefill, static_argnums=0, static_argnames=("slots", "cache_dtype", "cache_sharding"))
_DECODE = jax.jit(_decode, static_argnums=0, static_argnames=("mode", "new_room", "packed"), donate_argnums=(2,))
_PACK = jax.jit(_packed_params, static_argnums=0)
_EXTEND = jax.jit(_extend, static_argnums=0, donate_argnums=(2,))
_ROPE = jax.jit(rope_tables, static_argnums=0)
# A plain copy (a cheap compile per size pair), so the model-sized extend program compiles per cache
# size only, not per (old size, new size).
_GROW = jax.jit(_grow, static_argnames=("slots", "cache_sharding"))


@dataclasses.dataclass
class _ParamsVersion:
    """Which model structure and exact parameter arrays something was computed from (weak refs:
    holding it keeps no old parameters alive; a training update makes new arrays, so no match)."""

    graphdef: object
    refs: list

    @classmethod
    def of(cls, graphdef, params) -> "_ParamsVersion":
        return cls(graphdef, [weakref.ref(x) for x in jax.tree.leaves(params)])

    def matches(self, graphdef, params) -> bool:
        leaves = jax.tree.leaves(params)
        return (graphdef == self.graphdef and len(leaves) == len(self.refs)
                and all(ref() is leaf for ref, leaf in zip(self.refs, leaves)))


@dataclasses.dataclass
class _Kept:
    """What the last call left behind for the next one to build on."""

    cache: KVCache
    rows: list[list[int]]  # per cache row: the tokens whose K/V it holds, in order ([] if none)
    index: int  # host copy of cache.index
    params: _ParamsVersion  # the parameters the K/V came from
    cache_dtype: str


def cpu_kernel_applies(config: SamplingConfig, model) -> bool:
    """Whether decoding `model` under `config` uses `kernels.packed_matmul` (`SamplingConfig.cpu_kernel`):
    "auto", a CPU backend, float32 compute, per-layer (not scanned) weights all on one device, and an
    AVX2 or AVX-512 build of the kernel (`kernels.preferred`)."""
    if config.cpu_kernel != "auto" or jax.default_backend() != "cpu":
        return False
    if model.scan_layers or jnp.dtype(model.dtype) != jnp.float32:
        return False
    if len(model.embed[...].sharding.device_set) != 1:
        return False
    return kernels.preferred()


class PackedWeights:
    """Process-wide: the packed decode weights (`_packed_params`) of the most recently used parameter
    versions, shared by every Sampler and DeviceRollout (one model's policy, hint writer and
    device loops hold one packed copy, not one each). A version is packed on first use and dropped
    when its parameter arrays are freed (a training update makes new ones), when `forget` asks, or
    when more than `keep` versions are held (least recently used first)."""

    keep = 2

    def __init__(self):
        self._held: list[tuple[_ParamsVersion, object, jax.Array | None]] = []

    def get(self, graphdef, params):
        """(packed params, packed output projection or None) for these exact parameters."""
        self._held = [entry for entry in self._held if all(ref() is not None for ref in entry[0].refs)]
        for i, (version, state, head) in enumerate(self._held):
            if version.matches(graphdef, params):
                self._held.append(self._held.pop(i))
                return state, head
        while len(self._held) >= self.keep:
            self._held.pop(0)  # free it before packing the new version
        state, head = _PACK(graphdef, params)
        version = _ParamsVersion.of(graphdef, params)
        leaves = jax.tree.leaves(params)
        if leaves:  # drop the packed copy as soon as these parameters are freed
            version.refs[0] = weakref.ref(leaves[0], lambda _, v=version: self._drop_version(v))
        self._held.append((version, state, head))
        return state, head

    def _drop_version(self, version) -> None:
        self._held = [entry for entry in self._held if entry[0] is not version]

    def forget(self, graphdef, params) -> None:
        self._held = [entry for entry in self._held if not entry[0].matches(graphdef, params)]

    def holds(self, graphdef, params) -> bool:
        return any(entry[0].matches(graphdef, params) for entry in self._held)


PACKED_WEIGHTS = PackedWeights()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
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


class Sampler:
    """Generates from an NNX `Decoder` (its current parameters are read on every call, so training
    updates are seen without rebuilding). Prefill compiles once per (batch bucket, prompt bucket, cache
    size, packed-length bucket: see `SamplingConfig.pack_prompts`); decode once per (batch bucket,
    cache size, greedy / top-k on / top-p on). Temperature, top-k, top-p values, token budget and
    stop ids are traced, so changing them never recompiles.

    Prefix reuse (`SamplingConfig.reuse_prefix`, on by default): the Sampler keeps the cache of its
    last call, and per cache row the tokens it holds (prompt + completion minus its last token). When
    new prompts continue those rows (multi-turn play re-sends prompt + reply + next user turn), only
    each prompt's new tail is fed (`_extend`, compiled once per batch bucket, tail bucket and cache
    size), and the results are those of a full prefill. One cache is kept per Sampler: callers that
    interleave (designer, hint writer, agent) simply replace it; `forget()` frees it.
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
        self._kept: _Kept | None = None
        self.last_reused_tokens = 0  # prompt tokens the last call took from the kept cache (0: full prefill)
        self.last_fed_tokens = 0  # token rows the last call's prefill ran through the matmuls (padding included)

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
        from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

        spec = PartitionSpec(self._batch_axes(), *([None] * (array.ndim - 1)))
        return jax.device_put(array, NamedSharding(self.mesh, spec))

    def _cache_sharding(self):
        if self.mesh is None:
            return None
        from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: PLC0415

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
        return sum(f._cache_size() for f in (self._prefill, self._decode, _EXTEND, _GROW))

    def forget(self) -> None:
        """Drop the cache kept from the last call and the model's packed decode weights (their memory is
        freed; the next call prefills fully and packs again)."""
        self._kept = None
        PACKED_WEIGHTS.forget(*nnx.split(self.model))

    def uses_cpu_kernel(self, config: SamplingConfig) -> bool:
        """Whether `generate` with `config` decodes with `kernels.packed_matmul` (see `cpu_kernel`)."""
        return (self.mesh is None or self.mesh.size == 1) and cpu_kernel_applies(config, self.model)

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
        width = _bucket(longest, config.prompt_buckets, "prompt length")
        multiple = self._batch_multiple()
        batch = _bucket(len(prompts), config.batch_buckets, "batch size")
        batch = -(-batch // multiple) * multiple
        new_room = -(-config.max_new_tokens // config.new_token_bucket) * config.new_token_bucket

        stop_ids = [] if config.ignore_eos else [(i, 1) for i in self.eos_token_ids]
        seen = {i for i, _ in stop_ids}
        for i in (*config.stop_token_ids, *self._ids_holding(config.stop_strings)):
            if i not in seen:
                seen.add(i)
                stop_ids.append((i, 2))
        # Padded to a multiple of 8 so that a few more stop ids do not change the compiled shape.
        stop_ids += [(-1, 1)] * (-len(stop_ids) % 8 or (8 if not stop_ids else 0))
        mode = _Mode.of(config)

        graphdef, params = nnx.split(self.model)
        kept, self._kept = self._kept, None  # donated below either way; a failed call keeps nothing
        plan = None
        if config.reuse_prefix and kept is not None:
            plan = self._plan_reuse(kept, prompts, config, graphdef, params, width, batch, new_room)
        self.last_reused_tokens = 0
        if plan is None:
            kept = None  # free the old cache before allocating the new one
            rows_of = list(range(len(prompts)))
            tokens = np.full((batch, width), self.pad_token_id, np.int32)
            valid = np.zeros((batch, width), bool)
            for row, prompt in enumerate(prompts):  # left padding: every row writes the same cache slot
                tokens[row, width - len(prompt):] = prompt
                valid[row, width - len(prompt):] = True
            positions, packing = _left_padded_positions(valid), None
            if config.pack_prompts and self._batch_axes() is None:
                packed = _bucket(sum(lengths), config.packed_buckets, "packed prompt length")
                if packed < batch * width:
                    tokens, positions, packing = _pack(prompts, batch, width, packed, self.pad_token_id)
                    packing = Packing(*map(self._put_batch, packing))
            self.last_fed_tokens = tokens.size
            positions = self._put_batch(positions)
            logits, cache, last_pos = self._prefill(
                graphdef, params, self._put_batch(tokens), self._put_batch(valid), positions,
                _ROPE(self.model.spec, positions), packing, slots=width + new_room,
                cache_dtype=config.kv_cache_dtype(self.model.dtype), cache_sharding=self._cache_sharding(),
            )
        else:
            rows_of, keep, tokens, valid, slots = plan
            batch = len(kept.rows)
            cache, kept = kept.cache, None
            if slots > cache.slots:
                cache = _GROW(cache, slots=slots, cache_sharding=self._cache_sharding())
            positions = self._put_batch(keep[:, None] + _left_padded_positions(valid))
            logits, cache, last_pos = _EXTEND(
                graphdef, params, cache, self._put_batch(tokens), self._put_batch(valid), self._put_batch(keep),
                positions, _ROPE(self.model.spec, positions),
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
            key, jnp.int32(config.max_new_tokens), _knobs(config), jnp.asarray(stop_ids, jnp.int32), head,
            mode=mode, new_room=new_room, packed=packed,
        )
        *arrays, cache = out
        out_tokens, out_logp, out_slogp, count, reason, index = jax.device_get((*arrays, cache.index))
        if config.reuse_prefix:
            held = [[] for _ in range(batch)]
            for prompt, row in zip(prompts, rows_of):
                # The last sampled token was never fed through the model: its K/V are not in the cache.
                held[row] = prompt + [int(t) for t in out_tokens[row, : max(int(count[row]) - 1, 0)]]
            self._kept = _Kept(cache, held, int(index), _ParamsVersion.of(graphdef, params),
                               config.kv_cache_dtype(self.model.dtype))
        order = np.asarray(rows_of)
        return self._finish(prompts, config, out_tokens[order], out_logp[order], out_slogp[order],
                            count[order], reason[order])

    def _plan_reuse(self, kept: _Kept, prompts, config, graphdef, params, width, batch, new_room):
        """(row of each prompt, tokens kept per row, left-padded tails and their mask, cache slots), or
        None when a full prefill is the right call (see `generate`)."""
        if (self.model.spec.sliding_layers or kept.cache_dtype != config.kv_cache_dtype(self.model.dtype)
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
                shared = _common_prefix(held, prompt) if held and held[0] == prompt[0] else 0
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
        tail = max(len(p) - k for p, k in zip(prompts, keeps))
        tail_width = _bucket(tail, config.prompt_buckets, "prompt length")
        if len(rows) * tail_width >= batch * width:
            return None
        slots, cap = kept.cache.slots, 2 * (width + new_room)
        if kept.index + tail_width + new_room > slots:
            # Preferably with a turn's worth of headroom, so that the next turn need not grow it again.
            fits = [b + new_room for b in config.prompt_buckets if b >= kept.index + tail_width]
            roomy = [s for s in fits if s >= kept.index + tail_width + 2 * new_room and s <= cap]
            slots = (roomy or fits or [cap + 1])[0]
        if slots > cap:
            return None
        keep = np.zeros(len(rows), np.int32)
        tokens = np.full((len(rows), tail_width), self.pad_token_id, np.int32)
        valid = np.zeros((len(rows), tail_width), bool)
        for prompt, row, k in zip(prompts, rows_of, keeps):
            keep[row] = k
            tokens[row, tail_width - (len(prompt) - k):] = prompt[k:]
            valid[row, tail_width - (len(prompt) - k):] = True
        return rows_of, keep, tokens, valid, slots

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


def _pack(prompts, batch: int, width: int, length: int, pad_id: int):
    """Prompts as one [1, length] sequence (trailing pad tokens), their positions, and the `Packing`
    index arrays that map it to the left-padded [batch, width] layout (rows past the prompts: empty)."""
    tokens = np.full((1, length), pad_id, np.int32)
    positions = np.zeros((1, length), np.int32)
    gather = np.zeros((batch, width), np.int32)
    scatter = np.zeros(length, np.int32)
    start = 0
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        tokens[0, start:start + n] = prompt
        positions[0, start:start + n] = np.arange(n)
        gather[row, width - n:] = np.arange(start, start + n)
        scatter[start:start + n] = row * width + np.arange(width - n, width)
        start += n
    return tokens, positions, (gather, scatter)


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
