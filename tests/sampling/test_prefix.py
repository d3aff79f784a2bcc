"""Sampler prefix reuse across calls: multi-turn continuations fed as tails over the kept cache give
the same tokens and logprobs as full prefills (reuse off), and every fallback path still does."""

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))  # the device loop's tests
from test_device import _scripted_model  # a tiny Decoder whose replies are game actions

from spade_jax.envs.library import load_library_env
from spade_jax.models.presets import get_preset, init_decoder
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.rollout import Generation, RolloutConfig, play_episodes
from spade_jax.sampling import Sampler, SamplingConfig, sequence_logprobs

GREEDY = SamplingConfig(max_new_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    """The tiny preset over the byte tokenizer's 259 ids, weights scaled up so greedy picks no ties."""
    spec = dataclasses.replace(get_preset("tiny"), vocab_size=259)
    model = init_decoder(spec, seed=0)
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 12 if x.ndim > 1 else x, params))
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer(eos_token_ids=(2,))


def _user_turn(rng, row, turn):
    """Fresh tokens of a different length per row and turn, like an observation plus chat glue."""
    return [int(t) for t in rng.integers(3, 259, size=2 + 7 * row + 3 * turn)]


def _check_same(reused, full, atol=1e-5):
    assert reused.tokens == full.tokens
    assert reused.finish_reasons == full.finish_reasons
    assert reused.texts == full.texts
    for a, b in zip(reused.logprobs, full.logprobs):
        np.testing.assert_allclose(a, b, atol=atol)
    for a, b in zip(reused.sampling_logprobs, full.sampling_logprobs):
        np.testing.assert_allclose(a, b, atol=atol)


def _first_prompts():
    rng = np.random.default_rng(1)
    return [[int(t) for t in rng.integers(3, 259, size=n)] for n in (4, 19, 9, 33)], rng


def _converse(model, tokenizer, config, turns, *, eos_token_ids=None, drop_at=None):
    """Plays `turns` calls on a reusing and a non-reusing Sampler (same key per turn), each next prompt
    being prompt + completion + a user turn; at `drop_at` the first row leaves and the rest reverse
    order. Returns the per-turn reused token counts and every finish reason seen."""
    on = Sampler(model, tokenizer, eos_token_ids=eos_token_ids)
    off = Sampler(model, tokenizer, eos_token_ids=eos_token_ids)
    prompts, rng = _first_prompts()
    reused, reasons = [], []
    for turn in range(turns):
        got = on.generate(prompts, config, key=turn)
        want = off.generate(prompts, config.replace(reuse_prefix=False), key=turn)
        _check_same(got, want)
        assert off.last_reused_tokens == 0
        reused.append(on.last_reused_tokens)
        reasons += got.finish_reasons
        prompts = [p + t + _user_turn(rng, row, turn) for row, (p, t) in enumerate(zip(prompts, got.tokens))]
        if turn == drop_at:
            prompts = prompts[1:][::-1]
    return reused, reasons, on


def test_greedy_multi_turn_reuse_equals_full_prefill_with_early_ends_and_a_dropped_row(model, tokenizer):
    # Two ids the free-running model emits as end tokens: some rows end early by EOS, some by a stop id.
    free = Sampler(model).generate(_first_prompts()[0], GREEDY.replace(ignore_eos=True, reuse_prefix=False))
    eos, stop = free.tokens[0][3], free.tokens[2][5]
    config = GREEDY.replace(stop_token_ids=(stop,))
    reused, reasons, _ = _converse(model, tokenizer, config, 4, eos_token_ids=(eos,), drop_at=1)
    assert reused[0] == 0 and all(n > 0 for n in reused[1:])
    assert {"eos", "stop", "length"} <= set(reasons)


def test_sampled_multi_turn_reuse_draws_the_same_tokens(model, tokenizer):
    # Random draws follow the caller's row, not the cache row: same key, same samples after reordering.
    config = SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=40, top_p=0.9)
    reused, _, _ = _converse(model, tokenizer, config, 3, drop_at=0)
    assert all(n > 0 for n in reused[1:])


def test_packed_tails_equal_padded_tails_and_feed_fewer_rows(model, tokenizer):
    """The tails fed over a kept cache go through the model packed (`pack_tails`): the same tokens and
    logprobs as the padded [rows, tail bucket] block, greedy and sampled, for fewer token rows."""
    for config in (GREEDY, SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=40)):
        config = config.replace(pack_tails=True)
        packed, padded = Sampler(model, tokenizer), Sampler(model, tokenizer)
        prompts, rng = _first_prompts()
        fed = {"packed": 0, "padded": 0}
        for turn in range(3):
            got = packed.generate(prompts, config, key=turn)
            want = padded.generate(prompts, config.replace(pack_tails=False), key=turn)
            _check_same(got, want)
            if turn:  # tails of 2-26 tokens in a bucket of 32 or more, four rows, then three
                assert packed.last_reused_tokens == padded.last_reused_tokens > 0
                assert packed.last_fed_tokens <= padded.last_fed_tokens
                fed["packed"] += packed.last_fed_tokens
                fed["padded"] += padded.last_fed_tokens
            prompts = [p + t + _user_turn(rng, row, turn) for row, (p, t) in enumerate(zip(prompts, got.tokens))]
            if turn == 0:
                prompts = prompts[1:]
        assert fed["packed"] < fed["padded"]


def test_a_cache_of_mostly_empty_slots_is_compacted_and_gives_the_same_results(model, tokenizer):
    """Each turn writes every row's tail at one slot range, left-padded to the longest, so the kept cache
    grows by the tail bucket and the reply room per turn; `compact_cache` moves the kept
    tokens to each row's first slots when that needs fewer slots. Same tokens and logprobs as a full
    prefill, in a smaller cache than without it (the default)."""
    compacting, growing, full = (Sampler(model, tokenizer) for _ in range(3))
    prompts, rng = _first_prompts()
    for turn in range(5):
        got = compacting.generate(prompts, GREEDY.replace(compact_cache=True), key=turn)
        _check_same(got, full.generate(prompts, GREEDY.replace(reuse_prefix=False), key=turn))
        _check_same(growing.generate(prompts, GREEDY, key=turn), got)
        if turn:
            assert compacting.last_reused_tokens > 0
        # one row's tail long, the others' short: the block's padding is most of what a turn adds
        prompts = [p + t + _user_turn(rng, 3 * (row == turn % 4), 0) for row, (p, t) in
                   enumerate(zip(prompts, got.tokens))]
    assert compacting._kept.cache.slots < growing._kept.cache.slots
    assert compacting._kept.index < growing._kept.index


def test_compact_moves_each_rows_kept_tokens_to_its_first_slots_in_both_cache_layouts():
    from spade_jax.models.decoder import KVCache
    from spade_jax.sampling.prefix import COMPACT

    rng = np.random.default_rng(0)
    flat = KVCache.create(get_preset("tiny"), 3, 16)
    k = tuple(rng.normal(size=x.shape).astype(np.float32) for x in flat.k)
    v = tuple(rng.normal(size=x.shape).astype(np.float32) for x in flat.v)
    valid = rng.random((3, 16)) < 0.5
    keep = np.minimum(valid.sum(1), 5).astype(np.int32)
    flat = flat.replace(k=k, v=v, valid=valid, index=np.int32(16))
    stacked = KVCache(k=np.stack(k), v=np.stack(v), valid=valid, index=np.int32(16))
    for cache in (flat, stacked):
        got = COMPACT(cache, keep, np.int32(5), slots=12, cache_sharding=None)
        assert got.slots == 12 and int(got.index) == 5
        np.testing.assert_array_equal(got.valid, np.arange(12)[None] < keep[:, None])
        for layer, (gk, gv) in enumerate(zip(*got.per_layer())):
            for row in range(3):
                kept = np.flatnonzero(valid[row])[: keep[row]]  # its first `keep` held slots, in order
                np.testing.assert_array_equal(gk[row][..., : len(kept)], k[layer][row][..., kept])
                np.testing.assert_array_equal(gv[row][:, : len(kept)], v[layer][row][:, kept])


def test_reused_logprobs_equal_a_full_forward_pass(model, tokenizer):
    reused, _, sampler = _converse(model, tokenizer, GREEDY, 2)
    assert reused[1] > 0
    # Each kept row (prompt + completion[:-1]) cut back by two tokens, then continued differently.
    prompts = [row[:-2] + [7, 8, 9] for row in sampler._kept.rows]
    result = sampler.generate(prompts, GREEDY.replace(ignore_eos=True))
    assert sampler.last_reused_tokens == sum(len(p) - 3 for p in prompts)
    for prompt, tokens, logprobs in zip(prompts, result.tokens, result.logprobs):
        np.testing.assert_allclose(logprobs, sequence_logprobs(model, prompt, tokens), atol=2e-5)


def test_a_row_cut_by_a_stop_string_is_rolled_back_to_the_shared_prefix(model, tokenizer):
    on, off = Sampler(model, tokenizer), Sampler(model, tokenizer)
    prompts = [[10 + i for i in range(40)], [200] * 35]  # past the smallest bucket: tails are cheaper
    free = off.generate(prompts, GREEDY.replace(ignore_eos=True, reuse_prefix=False))
    stop = tokenizer.decode(free.tokens[0][3:5])
    config = GREEDY.replace(ignore_eos=True, stop_strings=(stop,))
    first = on.generate(prompts, config)
    assert first.finish_reasons[0] == "stop" and len(first.tokens[0]) < len(free.tokens[0])
    # The cache holds the whole sampled row; the next prompt carries only the cut completion.
    nxt = [p + t + [50, 51, 52] for p, t in zip(prompts, first.tokens)]
    _check_same(on.generate(nxt, config), off.generate(nxt, config.replace(reuse_prefix=False)))
    assert on.last_reused_tokens == len(nxt[0]) - 3 + len(nxt[1]) - 3 - 1  # row 1 lost its last token


def test_fallbacks_prefill_fully_and_match(model, tokenizer):
    on, off = Sampler(model, tokenizer), Sampler(model, tokenizer)
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(3, 259, size=n)] for n in (8, 30)]

    def step(new_prompts, expect_reuse):
        got = on.generate(new_prompts, GREEDY)
        _check_same(got, off.generate(new_prompts, GREEDY.replace(reuse_prefix=False)))
        assert (on.last_reused_tokens > 0) == expect_reuse
        return got

    got = step(prompts, False)
    extended = [p + t + [9, 9] for p, t in zip(prompts, got.tokens)]
    step(extended, True)
    # Prompts that share nothing with the cached rows.
    step([[int(t) for t in rng.integers(3, 259, size=n)] for n in (12, 5)], False)
    got = step(prompts, False)
    # More prompts than the kept cache has rows (batch bucket 2 -> 4).
    step([p + t + [9] for p, t in zip(prompts, got.tokens)] + [[5, 6], [7]], False)
    got = step(prompts, False)
    # New parameters: the kept K/V are stale.
    params = nnx.state(model, nnx.Param)
    try:
        nnx.update(model, jax.tree.map(lambda x: x * 1.01, params))
        step([p + t + [9] for p, t in zip(prompts, got.tokens)], False)
    finally:
        nnx.update(model, params)
    # Reuse switched off for one call: nothing is kept afterwards either.
    on.generate(prompts, GREEDY.replace(reuse_prefix=False))
    assert on._kept is None and on.last_reused_tokens == 0
    on.generate(prompts, GREEDY)
    on.forget()
    assert on._kept is None


def test_the_kept_cache_grows_in_bucketed_sizes_and_bounds_compiles(model, tokenizer):
    config = SamplingConfig(max_new_tokens=8, temperature=0.0, ignore_eos=True, prompt_buckets=(16, 32, 64, 128, 256),
                            new_token_bucket=8)
    on, off = Sampler(model, tokenizer), Sampler(model, tokenizer)

    def play(start):
        prompts, sizes = [[start + i for i in range(10)], [start] * 3], []
        for turn in range(5):
            got = on.generate(prompts, config)
            _check_same(got, off.generate(prompts, config.replace(reuse_prefix=False)))
            sizes.append(on._kept.cache.slots)
            prompts = [p + t + [turn + 3] * (4 + 3 * turn) for p, t in zip(prompts, got.tokens)]
        return sizes

    sizes = play(20)
    assert sizes[-1] > sizes[0]  # it grew
    assert all(s - 8 in config.prompt_buckets for s in sizes)  # only sizes a fresh prefill uses
    compiles = on.compile_count
    assert play(40) == sizes
    assert on.compile_count == compiles  # a second conversation of the same shapes compiles nothing


def test_a_host_field_does_not_split_configs():
    assert SamplingConfig(reuse_prefix=False) == SamplingConfig()
    assert hash(SamplingConfig(reuse_prefix=False)) == hash(SamplingConfig())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_play_episodes_trajectories_are_identical_with_and_without_reuse(temperature):
    model, tokenizer = _scripted_model(seed=3)
    config = SamplingConfig(max_new_tokens=16, temperature=temperature)
    rollout = RolloutConfig(max_turns=5)
    seeds = list(range(6))

    def play(reuse):
        sampler = Sampler(model, tokenizer)
        calls = []

        def generate(prompts):
            result = sampler.generate(prompts, config.replace(reuse_prefix=reuse), key=len(calls))
            calls.append((len(prompts), sampler.last_reused_tokens))
            return [Generation(t, lp, r) for t, lp, r in zip(result.tokens, result.logprobs, result.finish_reasons)]

        envs = [load_library_env("odd_one_out") for _ in seeds]
        return play_episodes(envs, seeds, generate, tokenizer, rollout), calls

    reused, calls = play(True)
    full, _ = play(False)
    assert any(n for _, n in calls[1:])  # later turns were fed as tails
    assert len({n for n, _ in calls}) > 1  # episodes ended at different turns
    for a, b in zip(reused, full):
        assert a.tokens == b.tokens and a.actions == b.actions and a.rewards == b.rewards
        assert a.loss_mask == b.loss_mask
        np.testing.assert_allclose(a.behaviour_logprobs, b.behaviour_logprobs, atol=1e-5)


def test_a_cache_with_finished_rows_is_compacted_to_the_rows_still_in_play(model, tokenizer):
    on, off = Sampler(model, tokenizer), Sampler(model, tokenizer)
    prompts, rng = _first_prompts()
    first = on.generate(prompts, GREEDY, key=0)
    on.pop_counts()
    # Only the third conversation goes on (three finished): one row, not the kept four, is extended.
    follow = [prompts[2] + first.tokens[2] + _user_turn(rng, 2, 0)]
    got = on.generate(follow, GREEDY, key=1)
    _check_same(got, off.generate(follow, GREEDY.replace(reuse_prefix=False), key=1))
    assert on.last_reused_tokens == len(prompts[2]) + len(first.tokens[2]) - 1  # the last sampled token is fed
    counts = on.pop_counts()
    assert counts["prefill_rows"] == on.last_fed_tokens == 1 * 32  # one row x the smallest tail bucket
    assert counts["decode_rows"] == 1 * max(len(t) for t in got.tokens)
    # and the compacted cache serves the next turn too
    again = [follow[0] + got.tokens[0] + _user_turn(rng, 2, 1)]
    _check_same(on.generate(again, GREEDY, key=2), off.generate(again, GREEDY.replace(reuse_prefix=False), key=2))
    assert on.last_reused_tokens > 0


@pytest.mark.parametrize("pack", [False, True])
def test_identical_prompts_are_prefilled_once_and_sample_as_if_each_were_fed(model, tokenizer, pack):
    """A GRPO group opens with one prompt per play: it is prefilled once and copied. Each row still draws as
    it would among distinct prompts (same key, same row), and a second turn reuses the copies."""
    rng = np.random.default_rng(3)
    a, b, c = ([int(t) for t in rng.integers(3, 259, size=n)] for n in (21, 14, 30))
    prompts = [a, b, a, a, b, c]
    config = SamplingConfig(max_new_tokens=8, temperature=1.0, ignore_eos=True, prompt_buckets=(32, 64, 128),
                            pack_prompts=pack)
    sampler = Sampler(model, tokenizer)
    got = sampler.generate(prompts, config, key=5)
    fed = sampler.last_fed_tokens
    assert len({tuple(t) for t in (got.tokens[0], got.tokens[2], got.tokens[3])}) > 1  # the copies draw apart
    for row, prompt in enumerate(prompts):
        # the reference: the same row among prompts that are all distinct, so nothing is copied
        others = [[int(t) for t in rng.integers(3, 259, size=17)] for _ in prompts]
        others[row] = prompt
        alone = Sampler(model, tokenizer).generate(others, config, key=5)
        assert got.tokens[row] == alone.tokens[row]
        np.testing.assert_allclose(got.logprobs[row], alone.logprobs[row], atol=2e-5)
        np.testing.assert_allclose(got.logprobs[row], sequence_logprobs(model, prompt, got.tokens[row]), atol=2e-5)
    distinct = Sampler(model, tokenizer)
    distinct.generate([a, b, c], config, key=5)
    assert fed == distinct.last_fed_tokens  # three prompts' rows fed, not six
    every = Sampler(model, tokenizer)
    _check_same(every.generate(prompts, config.replace(prefill_distinct=False), key=5), got)
    assert every.last_fed_tokens > fed
    # the next turn extends each copy as its own conversation
    follow = [p + t + [40 + row] for row, (p, t) in enumerate(zip(prompts, got.tokens))]
    _check_same(sampler.generate(follow, config, key=6),
                Sampler(model, tokenizer).generate(follow, config.replace(reuse_prefix=False), key=6))
    assert sampler.last_reused_tokens > 0
