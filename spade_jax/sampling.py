"""Batched text generation: jitted prefill + a compiled decode loop over a donated KV cache, with
temperature / top-k / top-p / greedy sampling and the per-token logprobs the RL update consumes.

How a call runs: prompts are left-padded to a length bucket and the batch to a batch bucket (so new
shapes compile at most once per bucket); one jitted prefill writes the cache and projects only the
last position; one jitted `lax.while_loop` samples every new token (exits early once every row is
done); stop strings are applied on the host afterwards by truncating at their first occurrence.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.models.decoder import KVCache

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


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int = 256  # tokens to generate at most per row (EOS included)
  temperature: float = 1.0  # softmax temperature; 0 means greedy (argmax)
  top_p: float = 1.0  # nucleus: keep the smallest top set with this much probability (1 = off)
  top_k: int = 0  # keep only the k most likely tokens (0 = off)
  stop_strings: tuple[str, ...] = ()  # host-side: cut the completion right after the first match
  stop_token_ids: tuple[int, ...] = ()  # device-side: these ids end a row like EOS (reason "stop")
  ignore_eos: bool = False  # keep going after EOS (benchmarks that need fixed lengths)
  prompt_buckets: tuple[int, ...] = _half_octaves(32, 1 << 17)  # padded prompt lengths
  batch_buckets: tuple[int, ...] = _powers_of_two(1, 1 << 16)  # padded batch sizes
  new_token_bucket: int = 64  # cache room for new tokens is max_new_tokens rounded up to this
  cache_dtype: str = "float32"  # KV cache dtype (f32 is faster than bf16 on XLA:CPU)

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0 or not math.isfinite(self.temperature):
      raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
    if any(not s for s in self.stop_strings):
      raise ValueError("stop_strings must be non-empty strings")
    for name in ("prompt_buckets", "batch_buckets"):
      buckets = getattr(self, name)
      if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
        raise ValueError(f"{name} must be increasing positive sizes, got {buckets}")
    if self.new_token_bucket < 1:
      raise ValueError(f"new_token_bucket must be >= 1, got {self.new_token_bucket}")
    if self.cache_dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"cache_dtype must be float32, bfloat16 or float16, got {self.cache_dtype}")

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


def _prefill(graphdef, params, tokens_bt, valid_bt, *, slots: int, cache_dtype: str, cache_sharding):
  model = nnx.merge(graphdef, params)
  batch = tokens_bt.shape[0]
  cache = KVCache.create(model.spec, batch, slots, jnp.dtype(cache_dtype))
  if cache_sharding is not None:
    cache = jax.lax.with_sharding_constraint(cache, cache_sharding)
  positions_bt = jnp.maximum(jnp.cumsum(valid_bt, axis=1) - 1, 0)
  hidden, cache = model.hidden_states(tokens_bt, positions_bt, valid_bt, cache)
  logits_bv = model.logits(hidden[:, -1:])[:, 0]
  return logits_bv, cache, positions_bt[:, -1]


def _decode(graphdef, params, cache, logits_bv, last_pos_b, live_b, key, max_new, knobs, stop_ids,
            *, mode: _Mode, new_room: int):
  """Sample up to `max_new` tokens. Budget, knobs and stop ids are traced: they never recompile.

  `stop_ids` [n, 2] holds (token id, 1 for EOS / 2 for a stop token); id -1 never matches.
  """
  model = nnx.merge(graphdef, params)
  batch = logits_bv.shape[0]
  row_ids = jnp.arange(batch, dtype=jnp.int32)
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

  def body(carry):
    step, token, cache, done, reason, pos, count, outs = carry
    pos = pos + 1
    hidden, cache = model.hidden_states(token[:, None], pos[:, None], (~done)[:, None], cache)
    logits = model.logits(hidden)[:, 0]
    count = count + jnp.where(done, 0, 1)
    token, done, reason, outs = emit(step, logits, done, reason, outs)
    return step + 1, token, cache, done, reason, pos, count, outs

  carry = (jnp.int32(1), token, cache, done, reason, last_pos_b, count, outs)
  _, _, cache, done, reason, _, count, outs = jax.lax.while_loop(cond, body, carry)
  tokens, lp, slp = outs
  return tokens, lp, slp, count, reason, cache


# Process-wide: every Sampler over models of the same structure shares the compiled programs.
_PREFILL = jax.jit(_prefill, static_argnums=0, static_argnames=("slots", "cache_dtype", "cache_sharding"))
_DECODE = jax.jit(_decode, static_argnums=0, static_argnames=("mode", "new_room"), donate_argnums=(2,))


class Sampler:
  """Generates from an NNX `Decoder` (its current parameters are read on every call, so training
  updates are seen without rebuilding). Prefill compiles once per (batch bucket, prompt bucket, cache
  size); decode once per (batch bucket, cache size, greedy / top-k on / top-p on). Temperature,
  top-k, top-p values, token budget and stop ids are traced, so changing them never recompiles.
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
    return KVCache(
        k=NamedSharding(self.mesh, P(None, batch, kv, None, None)),
        v=NamedSharding(self.mesh, P(None, batch, kv, None, None)),
        valid=NamedSharding(self.mesh, P(batch, None)),
        index=NamedSharding(self.mesh, P()),
    )

  # -- public -------------------------------------------------------------------------------------

  @property
  def compile_count(self) -> int:
    """Programs compiled so far in this process by all Samplers (prefill + decode); bounded by the
    buckets and model structures, not by the number of calls."""
    return self._prefill._cache_size() + self._decode._cache_size()

  def generate(
      self, prompts: Sequence[Sequence[int]], config: SamplingConfig, key: jax.Array | int = 0
  ) -> GenerationResult:
    """Complete each prompt (a list of token ids); see `GenerationResult` for what comes back."""
    if not prompts:
      raise ValueError("generate needs at least one prompt")
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

    tokens = np.full((batch, width), self.pad_token_id, np.int32)
    valid = np.zeros((batch, width), bool)
    for row, prompt in enumerate(prompts):  # left padding: every row writes the same cache slot
      tokens[row, width - len(prompt):] = prompt
      valid[row, width - len(prompt):] = True
    live = np.arange(batch) < len(prompts)

    stop_ids = [] if config.ignore_eos else [(i, 1) for i in self.eos_token_ids]
    stop_ids += [(i, 2) for i in config.stop_token_ids if i not in dict(stop_ids)]
    # Padded to a multiple of 8 so that a few more stop ids do not change the compiled shape.
    stop_ids += [(-1, 1)] * (-len(stop_ids) % 8 or (8 if not stop_ids else 0))
    mode = _Mode.of(config)

    graphdef, params = nnx.split(self.model)
    logits, cache, last_pos = self._prefill(
        graphdef, params, self._put_batch(tokens), self._put_batch(valid),
        slots=width + new_room, cache_dtype=config.cache_dtype, cache_sharding=self._cache_sharding(),
    )
    out = self._decode(
        graphdef, params, cache, logits, last_pos, self._put_batch(live), key,
        jnp.int32(config.max_new_tokens), _knobs(config), jnp.asarray(stop_ids, jnp.int32),
        mode=mode, new_room=new_room,
    )
    out_tokens, out_logp, out_slogp, count, reason, _ = jax.device_get(out)
    return self._finish(prompts, config, out_tokens, out_logp, out_slogp, count, reason)

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
