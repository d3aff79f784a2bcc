"""The compiled device loop for JAX-backend environments (`DeviceRollout`, `play_episodes_device`): a batch
of whole episodes in one program (decode, reply -> action id, env step, observation tokens, cache append)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spade_jax.envs.backends.jax.tokens import ObservationTokens
from spade_jax.models.decoder import packed_weights, rope_tables
from spade_jax.rollout.actions import ActionMap
from spade_jax.rollout.chat import ChatGlue, with_hint
from spade_jax.rollout.config import RolloutConfig
from spade_jax.rollout.trajectory import Trajectory, clip_to_context
from spade_jax.sampling import PACKED_WEIGHTS, SamplingConfig, SamplingMode, choose, cpu_kernel_applies, sampling_knobs

# Cache layout (why it looks the way it does): the decoder's KV cache has one write index shared by the
# batch, while replies end at different lengths. Every turn therefore owns a run of slots: one slot per
# decode step (a row that already stopped writes an invalid slot there), then the observation chunk,
# in which each row's tokens are right-aligned behind invalid padding (so the chunk's last slot holds
# every continuing row's last token, whose logits start the next reply). The chunk is appended in
# blocks of `chunk_block` slots, only as many as the longest observation of the turn needs (the first
# prompt likewise; the last turn's chunk is recorded but not fed, since nothing follows it). Invalid
# slots are masked out of attention and positions count real tokens only, so each row sees exactly
# the dense token sequence the host loop builds. The cache is sized for the worst case; each decode
# and append runs against the smallest of four compiled windows of slots that holds what is written,
# since attention costs in proportion to the slots it sees.
#
# Tokenization: the first prompt and the text between turns come from the chat template exactly as
# `ChatStream` builds them; observations are tokenized fragment by fragment (template literals,
# table strings, one token per digit). With a byte-level tokenizer that equals tokenizing the whole
# text, so both loops give the same ids; with BPE (SmolLM2, Qwen) a merge across a fragment boundary
# can make the ids differ from the host loop's while decoding to the same text.


def _place(pieces, width: int, right: bool):
    """Concatenate per-row pieces [(tokens [B, k], lengths [B])] into [B, width], left- or right-
    aligned, padding 0; returns (tokens, valid, total lengths)."""
    batch = pieces[0][0].shape[0]
    lengths = jnp.stack([n for _, n in pieces], axis=1)  # [B, P]
    total = jnp.sum(lengths, axis=1)
    offsets = jnp.cumsum(lengths, axis=1) - lengths
    shift = (width - total) if right else jnp.zeros_like(total)
    out = jnp.zeros((batch, width + 1), jnp.int32)
    rows = jnp.arange(batch)[:, None]
    for p, (tokens, n) in enumerate(pieces):
        k = tokens.shape[1]
        pos = jnp.arange(k)[None, :]
        dest = jnp.where(pos < n[:, None], shift[:, None] + offsets[:, p : p + 1] + pos, width)
        out = out.at[rows, dest].set(tokens.astype(jnp.int32))
    out = out[:, :width]
    slot = jnp.arange(width)[None, :]
    valid = (slot >= shift[:, None]) & (slot < shift[:, None] + total[:, None])
    return out, valid, total


def _const_piece(ids: Sequence[int], batch: int, on):
    tokens = jnp.broadcast_to(jnp.asarray(list(ids) or [0], jnp.int32), (batch, max(len(ids), 1)))
    return tokens, jnp.where(on, len(ids), 0).astype(jnp.int32)


class DeviceRollout:
    """Plays batches of episodes of one transpiled environment with one model inside one compiled loop.

    Built once per (environment, model structure, tokenizer, configs); `play` can be called many times
    (parameters are read from the model on every call, so training updates are seen). A new batch
    size or hint width compiles a new program.

    Options: observation_tokens (default: the environment's longest possible observation; a longer
    one raises), hint_prefix (hint -> text appended to the first observation; default with_hint),
    max_slots (cap on cache slots; episodes still playing when it runs out end truncated and
    cut_by_context), chunk_block (observation append block), cache_windows (compiled attention
    windows; 1 for the fastest compile), compiler_options (passed to jax.jit).
    """

    def __init__(self, env, model, tokenizer, sampling: SamplingConfig, rollout: RolloutConfig, *,
                 observation_tokens: int | None = None, hint_prefix: Callable[[str | None], str] | None = None,
                 max_slots: int | None = None, chunk_block: int = 64, cache_windows: int = 4,
                 compiler_options: dict | None = None):
        if sampling.stop_strings:
            raise ValueError("the device loop cannot apply stop_strings (host-side); use stop_token_ids")
        if rollout.reply_prefix:
            raise ValueError("the device loop reads whole replies; rollout.reply_prefix needs the host loop")
        if (rollout.observation_suffix or rollout.end_on_cut_reply or rollout.mask_malformed_tool_calls
                or rollout.tool_turns):
            raise ValueError("rollout.observation_suffix, end_on_cut_reply, mask_malformed_tool_calls and "
                             "tool_turns need the host loop")
        self.env, self.model, self.tokenizer = env, model, tokenizer
        self.sampling, self.rollout = sampling, rollout
        self.compiler_options = compiler_options
        if chunk_block < 1 or cache_windows < 1:
            raise ValueError(f"chunk_block and cache_windows must be >= 1, got {chunk_block}, {cache_windows}")
        # Each window compiles the model twice more (decode, append): fewer windows, faster compiles.
        self.cache_windows = cache_windows
        spec = model.spec
        eos = tuple(int(i) for i in tokenizer.eos_token_ids)
        stops = () if sampling.ignore_eos else eos
        self.stop_ids = stops + tuple(int(i) for i in sampling.stop_token_ids if i not in stops)
        self.glue = ChatGlue.build(tokenizer, rollout.system_prompt, eos)
        if observation_tokens is None:
            observation_tokens = max(ObservationTokens(env, tokenizer, kind).bound for kind in (0, 1))
        self.obs_width = int(observation_tokens)
        # One token more than kept, so that an observation past the width is detected, never cut silently.
        self.renderers = [ObservationTokens(env, tokenizer, kind, self.obs_width + 1) for kind in (0, 1)]
        if hint_prefix is None:
            hint_prefix = lambda hint: with_hint("", hint)  # noqa: E731 (with_hint appends the hint)
        self.hint_text = hint_prefix
        self.actions = ActionMap(env, tokenizer, spec.vocab_size, first=rollout.action == "first_boxed")
        g = self.glue
        self.reply_width = sampling.max_new_tokens
        self.chunk_width = max(len(v) for v in g.after_reply) + self.obs_width + len(g.before_reply)
        self.chunk_block = min(chunk_block, self.chunk_width)
        self.chunk_slots = -(-self.chunk_width // self.chunk_block) * self.chunk_block
        self.first_base = len(g.first_prefix) + self.obs_width + len(g.first_suffix)
        turns = rollout.max_turns
        # The first prompt is fed in whole blocks too; no observation is fed after the last reply.
        self.first_slots = lambda hint_width: -(-(self.first_base + hint_width) // self.chunk_block) * self.chunk_block
        self.full_slots = lambda hint_width: (self.first_slots(hint_width) + turns * self.reply_width
                                              + (turns - 1) * self.chunk_slots)
        self.max_slots = max_slots
        self._programs: dict = {}
        self.use_rollout(rollout)

    def use_rollout(self, rollout: RolloutConfig) -> None:
        """Switch the context budget or loss_on_truncated without recompiling (turns and system prompt
        are compiled in)."""
        if (rollout.max_turns, rollout.system_prompt) != (self.rollout.max_turns, self.rollout.system_prompt):
            raise ValueError("max_turns and system_prompt are compiled in; build a new DeviceRollout")
        # A row keeps playing while it holds fewer than max_context_tokens; one more turn adds at most this.
        reach = min(self.full_slots(0), rollout.max_context_tokens + self.reply_width + self.chunk_slots)
        if reach > self.model.spec.max_position:
            raise ValueError(
                f"an episode can reach {reach} tokens, past the model's context of {self.model.spec.max_position}; "
                "lower max_context_tokens, max_turns or max_new_tokens")
        self.rollout = rollout

    # -- the compiled loop ----------------------------------------------------------------------------

    def _program(self, batch: int, hint_width: int):
        key = (batch, hint_width)
        if key not in self._programs:
            slots = self.full_slots(hint_width)
            if self.max_slots is not None:
                slots = min(slots, self.max_slots)
            if slots < self.first_slots(hint_width) + self.reply_width:
                raise ValueError(f"max_slots={self.max_slots} leaves no room for one turn; raise it")
            run = jax.jit(self._run, static_argnums=0, static_argnames=("slots", "packed"),
                          compiler_options=self.compiler_options)
            self._programs[key] = (run, slots)
        return self._programs[key]

    def _run(self, graphdef, params, packed_head, *args, slots: int, packed: bool):
        """`packed`: `params` and `packed_head` come from `PackedWeights`; every matmul of the
        episode (appends and decode steps) runs `kernels.packed_matmul`."""
        with packed_weights(packed_head) if packed else contextlib.nullcontext():
            return self._episodes(graphdef, params, *args, slots=slots)

    def _episodes(self, graphdef, params, tables, reset_keys, hint_tokens, hint_lengths, live0, key, knobs,
                  max_context, *, slots: int):
        model = nnx.merge(graphdef, params)
        env, glue, actions = self.env, self.glue, self.actions
        batch = reset_keys.shape[0]
        turns, reply_w, chunk_w = self.rollout.max_turns, self.reply_width, self.chunk_width
        block = self.chunk_block
        blocks = -(-chunk_w // block)
        mode = SamplingMode.of(self.sampling)
        env_params = env.default_params
        def render(records, kind):
            tokens, length = jax.vmap(self.renderers[kind])(records)
            return tokens[:, : self.obs_width], jnp.minimum(length, self.obs_width), length > self.obs_width
        row_ids = jnp.arange(batch, dtype=jnp.int32)
        stop_ids = jnp.asarray(list(self.stop_ids) or [-1], jnp.int32)
        eos_ids = jnp.asarray(list(glue.eos_ids) or [-1], jnp.int32)

        # Reset and the first prompt.
        records, states = jax.vmap(env.reset_env, in_axes=(0, None))(reset_keys, env_params)
        obs_tokens, obs_len, overflow = render(records, 0)
        on = live0
        first_pieces = [_const_piece(glue.first_prefix, batch, on), (obs_tokens, jnp.where(on, obs_len, 0)),
                        (hint_tokens, jnp.where(on, hint_lengths, 0)), _const_piece(glue.first_suffix, batch, on)]
        first_w = self.first_slots(hint_tokens.shape[1])
        first_tokens, _, first_len = _place(first_pieces, first_w, right=False)
        tokens0, valid0, _ = _place(first_pieces, first_w, right=True)
        cache = model.new_cache(batch, slots, jnp.dtype(self.sampling.kv_cache_dtype(model.dtype)))
        n = self.cache_windows
        windows = sorted({min(slots, -(-slots * k // (n * block)) * block) for k in range(1, n + 1)})

        def in_window(width, cache, tokens, positions, valid):
            """Append `tokens` through a view of the first `width` cache slots; logits of the last one."""
            hidden, view = model.hidden_states(tokens, positions, valid, cache.window(width))
            return cache.merge(view), model.logits(hidden[:, -1:])[:, 0]

        def feed(cache, logits, tokens, positions, valid, needed):
            """Append the last `needed` blocks of right-aligned `tokens` (the blocks before them hold only
            padding, so they are neither run nor given cache slots); logits of the last token."""
            total = tokens.shape[1] // block

            def append(j, carry):
                cache, _ = carry
                cut = lambda x: jax.lax.dynamic_slice_in_dim(x, j * block, block, axis=1)  # noqa: E731 (local one-liner)
                # Attention costs queries x cache slots; run each block against the smallest window of
                # slots (a few compiled sizes) that holds everything written so far.
                rung = jnp.sum(jnp.asarray(windows) < cache.index + block)
                branches = [functools.partial(in_window, w) for w in windows]
                return jax.lax.switch(rung, branches, cache, cut(tokens), cut(positions), cut(valid))

            return jax.lax.fori_loop(total - needed, total, append, (cache, logits))

        def blocks_for(lengths):
            return (jnp.max(lengths) + block - 1) // block

        positions = jnp.maximum(jnp.cumsum(valid0, axis=1) - 1, 0)
        cache, logits = feed(cache, jnp.zeros((batch, model.spec.vocab_size), jnp.float32), tokens0, positions,
                             valid0, jnp.maximum(blocks_for(first_len), 1))

        out = {
            "reply": jnp.zeros((turns, batch, reply_w), jnp.int32),
            "logp": jnp.zeros((turns, batch, reply_w), jnp.float32),
            "reply_len": jnp.zeros((turns, batch), jnp.int32),
            "chunk": jnp.zeros((turns, batch, chunk_w), jnp.int32),
            "chunk_len": jnp.zeros((turns, batch), jnp.int32),
            "active": jnp.zeros((turns, batch), bool),
            "action": jnp.zeros((turns, batch), jnp.int32),
            "asked_host": jnp.zeros((turns, batch), bool),
            "reward": jnp.zeros((turns, batch), jnp.float32),
            "terminated": jnp.zeros((turns, batch), bool),
            "truncated": jnp.zeros((turns, batch), bool),
            "records": jax.tree.map(lambda x: jnp.zeros((turns,) + x.shape, x.dtype), records),
        }
        n_real = first_len
        done = ~live0

        def decode(cache, logits, n_real, active, turn_key):
            def cond(c):
                return (c[0] < reply_w) & ~jnp.all(c[-1])

            # The RoPE tables of each step's position ride in the carry (see Sampler's decode loop).
            def body(c):
                step, logits, cache, n_real, rope, toks, lps, count, stopped = c
                token, logp, _ = choose(logits, turn_key, step, row_ids, mode, knobs)
                emit = ~stopped
                toks = toks.at[:, step].set(jnp.where(emit, token, 0))
                lps = lps.at[:, step].set(jnp.where(emit, logp, 0.0))
                count = count + emit
                ended = emit & jnp.any(stop_ids[None, :] == token[:, None], axis=1)
                # Feed the token now so the cache holds the whole reply (its end included) before the chunk.
                hidden, cache = model.hidden_states(token[:, None], n_real[:, None], emit[:, None], cache, rope)
                logits = model.logits(hidden)[:, 0]
                n_real = n_real + emit
                return (step + 1, logits, cache, n_real, rope_tables(model.spec, n_real[:, None]), toks, lps,
                        count, stopped | ended)

            carry = (jnp.int32(0), logits, cache, n_real, rope_tables(model.spec, n_real[:, None]),
                     jnp.zeros((batch, reply_w), jnp.int32), jnp.zeros((batch, reply_w), jnp.float32),
                     jnp.zeros((batch,), jnp.int32), ~active)
            _, logits, cache, n_real, _, toks, lps, count, _ = jax.lax.while_loop(cond, body, carry)
            # As ChatStream: the glue after a reply depends on whether its last token is an EOS (which one).
            last = jnp.take_along_axis(toks, jnp.maximum(count - 1, 0)[:, None], 1)[:, 0]
            is_eos = (eos_ids[None, :] == last[:, None]) & (count > 0)[:, None]
            variant = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1, 0)
            return cache, logits, n_real, toks, lps, count, variant

        def turn_cond(c):
            turn, _, _, n_real, done, *_ = c
            chunk_room = jnp.where(turn + 1 < turns, blocks * block, 0)
            return (turn < turns) & jnp.any(~done & (n_real < max_context)) & (
                c[1].index + reply_w + chunk_room <= slots)

        def turn_body(c):
            turn, cache, logits, n_real, done, states, overflow, out = c
            active = ~done & (n_real < max_context)
            turn_key = jax.random.fold_in(key, turn)
            def decode_in(width, cache, *args):
                view, *rest = decode(cache.window(width), *args)
                return (cache.merge(view), *rest)

            rung = jnp.sum(jnp.asarray(windows) < cache.index + reply_w)
            cache, dec_logits, n_real, toks, lps, count, variant = jax.lax.switch(
                rung, [functools.partial(decode_in, w) for w in windows], cache, logits, n_real, active, turn_key)
            action, asked = actions(tables, toks, count, active)
            step_keys = jax.random.split(turn_key, batch)
            records, new_states, reward, terminated, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
                step_keys, states, action, env_params)
            truncated = new_states.truncated
            states = jax.tree.map(lambda new, old: jnp.where(
                active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old), new_states, states)
            reward = jnp.where(jnp.isfinite(reward), reward, 0.0)
            finished = terminated | truncated
            going = active & ~finished
            obs_tokens, obs_len, over = render(records, 1)
            overflow = overflow | (going & over)
            after = jnp.asarray(_pad_rows(glue.after_reply))
            after_len = jnp.asarray([len(v) for v in glue.after_reply], jnp.int32)
            pieces = [(after[variant], jnp.where(going, after_len[variant], 0)),
                      (obs_tokens, jnp.where(going, obs_len, 0)), _const_piece(glue.before_reply, batch, going)]
            chunk_left, _, chunk_len = _place(pieces, chunk_w, right=False)
            padded_w = blocks * block
            chunk_right, chunk_valid, _ = _place(pieces, padded_w, right=True)
            positions = n_real[:, None] + jnp.maximum(jnp.cumsum(chunk_valid, axis=1) - 1, 0)
            # Only the blocks some row needs are run (the chunk width is a worst case over all observations);
            # after the last reply nothing is generated, so its chunk goes to the trajectory only.
            needed = jnp.where(turn + 1 < turns, blocks_for(chunk_len), 0)
            cache, chunk_logits = feed(cache, dec_logits, chunk_right, positions, chunk_valid, needed)
            logits = jnp.where(going[:, None], chunk_logits, dec_logits)
            n_real = n_real + chunk_len
            done = done | (active & finished)

            def put(buf, value):
                return jax.lax.dynamic_update_index_in_dim(buf, value, turn, 0)

            out = dict(out)
            for name, value in (("reply", toks), ("logp", lps), ("reply_len", count), ("chunk", chunk_left),
                                ("chunk_len", chunk_len), ("active", active), ("action", action),
                                ("asked_host", asked), ("reward", reward), ("terminated", terminated & active),
                                ("truncated", truncated & active)):
                out[name] = put(out[name], value)
            out["records"] = jax.tree.map(put, out["records"], records)
            return turn + 1, cache, logits, n_real, done, states, overflow, out

        carry = (jnp.int32(0), cache, logits, n_real, done, states, overflow, out)
        turn, _, _, n_real, done, _, overflow, out = jax.lax.while_loop(turn_cond, turn_body, carry)
        out["overflow"] = overflow
        out["first"], out["first_len"], out["first_record"] = first_tokens, first_len, records
        out["n_real"], out["done"], out["turns"] = n_real, done, turn
        return out

    # -- host side ------------------------------------------------------------------------------------

    def play(self, seeds: Sequence[int], key: jax.Array | int = 0, *, hints: Sequence[str | None] | None = None,
             groups: Sequence[Any] | None = None) -> list[Trajectory]:
        """One episode per seed, all in one compiled call; trajectories as the host loop `play_episodes` makes."""
        n = len(seeds)
        if n == 0:
            raise ValueError("play needs at least one seed")
        hints = list(hints) if hints is not None else [None] * n
        groups = list(groups) if groups is not None else list(range(n))
        if len(hints) != n or len(groups) != n:
            raise ValueError(f"hints and groups need one entry per seed ({n})")
        if isinstance(key, int):
            key = jax.random.key(key)
        hint_ids = [self.tokenizer.encode(self.hint_text(h), add_special_tokens=False) if h else [] for h in hints]
        hint_width = _bucket(max(len(h) for h in hint_ids))
        hint_tokens = np.zeros((n, max(hint_width, 1)), np.int32)
        for row, ids in enumerate(hint_ids):
            hint_tokens[row, : len(ids)] = ids
        reset_keys = np.stack([np.asarray(jax.random.PRNGKey(int(s) % (2**32))) for s in seeds])
        run, slots = self._program(n, hint_tokens.shape[1])
        graphdef, params = nnx.split(self.model)
        head, packed = None, cpu_kernel_applies(self.sampling, self.model)
        if packed:
            params, head = PACKED_WEIGHTS.get(graphdef, params)
        out = run(graphdef, params, head, self.actions.device_tables(), jnp.asarray(reset_keys),
                  jnp.asarray(hint_tokens), jnp.asarray([len(h) for h in hint_ids], jnp.int32), jnp.ones((n,), bool),
                  key, sampling_knobs(self.sampling), jnp.int32(self.rollout.max_context_tokens),
                  slots=slots, packed=packed)
        out = jax.device_get(out)
        if out["overflow"].any():
            raise ValueError(f"an observation rendered to more than observation_tokens={self.obs_width} tokens; "
                             "raise observation_tokens (or leave it unset for the environment's bound)")
        return self._trajectories(out, hints, groups)

    def _record(self, records, *index):
        return {name: np.asarray(value[index]) for name, value in records.items()}

    def _trajectories(self, out, hints, groups) -> list[Trajectory]:
        config, env, decode = self.rollout, self.env, self.tokenizer.decode
        trajectories = []
        for row in range(len(groups)):
            first = [int(t) for t in out["first"][row, : int(out["first_len"][row])]]
            first_text = env.render_text(self._record(out["first_record"], row))
            traj = Trajectory(first, [0] * len(first), [0.0] * len(first), [], [first_text], [],
                              group=groups[row], meta={"hinted": hints[row] is not None})
            finished = False
            for turn in range(config.max_turns):
                if not out["active"][turn, row]:
                    break
                count = int(out["reply_len"][turn, row])
                reply = [int(t) for t in out["reply"][turn, row, :count]]
                traj.tokens.extend(reply)
                traj.loss_mask.extend([1] * count)
                traj.behaviour_logprobs.extend(float(x) for x in out["logp"][turn, row, :count])
                traj.actions.append(decode(reply, skip_special_tokens=True))
                reward = float(out["reward"][turn, row])
                traj.rewards.append(reward if math.isfinite(reward) else 0.0)
                traj.observations.append(env.render_text(self._record(out["records"], turn, row)))
                terminated, truncated = bool(out["terminated"][turn, row]), bool(out["truncated"][turn, row])
                if terminated or truncated:
                    traj.terminated, traj.truncated = terminated, truncated and not terminated
                    finished = True
                    break
                chunk = [int(t) for t in out["chunk"][turn, row, : int(out["chunk_len"][turn, row])]]
                traj.tokens.extend(chunk)
                traj.loss_mask.extend([0] * len(chunk))
                traj.behaviour_logprobs.extend([0.0] * len(chunk))
            if not finished:  # out of turns, out of context, or out of cache slots
                traj.truncated = True
                traj.cut_by_context = len(traj.tokens) >= config.max_context_tokens or (
                    int(out["turns"]) < config.max_turns and len(traj.tokens) < config.max_context_tokens)
            clip_to_context(traj, config)
            trajectories.append(traj)
        return trajectories


def _pad_rows(rows: Sequence[Sequence[int]]) -> np.ndarray:
    width = max([len(r) for r in rows] + [1])
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _bucket(size: int, smallest: int = 16) -> int:
    """Hint widths round up to powers of two, so new hints rarely compile a new program."""
    if size == 0:
        return 0
    width = smallest
    while width < size:
        width *= 2
    return width


_ROLLOUTS: dict = {}
_MAX_RUNNERS = 16  # compiled device loops kept by play_episodes_device (oldest dropped first)


def play_episodes_device(
    env, seeds: Sequence[int], model, tokenizer, sampling: SamplingConfig, rollout: RolloutConfig,
    key: jax.Array | int = 0, *, hints: Sequence[str | None] | None = None,
    groups: Sequence[Any] | None = None, **options,
) -> list[Trajectory]:
    """Plays one episode per seed of a device environment (`Runnable.device_env`) inside one compiled
    loop; same trajectories as the host loop `play_episodes` over `env.text_env()` instances. `options` go to
    `DeviceRollout` (observation_tokens, hint_prefix, max_slots, chunk_block, cache_windows,
    compiler_options)."""
    graphdef, _ = nnx.split(model)
    cache_key = (id(env), id(tokenizer), graphdef, sampling, rollout.max_turns, rollout.system_prompt,
                 repr(sorted(options.items())))
    if cache_key not in _ROLLOUTS:
        # Runners hold their env and tokenizer, so the ids in the key stay theirs; keep only a few.
        while len(_ROLLOUTS) >= _MAX_RUNNERS:
            _ROLLOUTS.pop(next(iter(_ROLLOUTS)))
        _ROLLOUTS[cache_key] = DeviceRollout(env, model, tokenizer, sampling, rollout, **options)
    runner = _ROLLOUTS[cache_key]
    runner.model = model
    runner.use_rollout(rollout)
    return runner.play(seeds, key, hints=hints, groups=groups)
