"""Packed update rows (several samples per row, segment ids): the same loss, metrics and gradients as one
sample per row, for every aggregation."""

import jax
import numpy as np
import pytest
from flax import nnx
from rl_testing import TINY, tiny_decoder

from spade_jax.models.decoder import Attention
from spade_jax.rl import RLConfig, make_train_step
from spade_jax.rl.batch import AGENT, DESIGNER
from spade_jax.rl.collate import Sample, collate


def _samples(seed=0, n=7):
    """Varied lengths (one at the full width), roles, staleness, advantages; replies at turn ends."""
    rng = np.random.default_rng(seed)
    out = []
    for i, length in enumerate([24, 5, 9, 13, 3, 17, 8][:n]):
        tokens = rng.integers(1, TINY.vocab_size, length).tolist()
        loss = (rng.uniform(size=length) < 0.5).astype(int).tolist()
        loss[0] = 1  # a loss flag on a sequence's first token is ignored (nothing scores it)
        behaviour = np.log(rng.uniform(0.01, 0.2, length)).tolist()
        role = DESIGNER if i % 3 == 2 else AGENT
        out.append(Sample(tokens, loss, behaviour, advantage=float(rng.normal()), role=role, stale=role == DESIGNER))
    return out


def test_collate_packs_first_fit_decreasing_with_restarting_positions():
    samples = _samples()
    plain = collate(samples, length_multiple=8, row_multiple=2)
    packed = collate(samples, length_multiple=8, row_multiple=2, pack=True)
    assert plain.tokens_bt.shape == (8, 24)
    assert packed.tokens_bt.shape == (4, 24)  # 79 tokens: rows [24], [17, 5, 2 free...], ...
    seg, valid = packed.segment_ids_bt, packed.valid_bt
    assert ((seg > 0) == valid).all() and valid.sum() == sum(len(s.tokens) for s in samples)
    for row in range(4):
        for s in range(1, seg[row].max() + 1):
            cols = np.flatnonzero(seg[row] == s)
            assert (np.diff(cols) == 1).all()  # contiguous
            np.testing.assert_array_equal(packed.positions_bt[row, cols], np.arange(len(cols)))
            assert not packed.loss_mask_bt[row, cols[0]]
    assert packed.loss_mask_bt.sum() == plain.loss_mask_bt.sum()


@pytest.mark.parametrize("aggregation", ["token", "sequence", "dr_grpo"])
def test_packed_update_equals_one_sample_per_row(aggregation):
    samples = _samples()
    cfg = RLConfig(aggregation=aggregation, lr=1e-2, adam_eps=1.0, kl_coef=0.05, micro_batches=2)
    plain = collate(samples, length_multiple=8, row_multiple=2)
    packed = collate(samples, length_multiple=8, row_multiple=2, pack=True)
    want = _assert_same_updates(cfg, plain, packed)
    assert want["sequences"] == sum(any(s.loss_mask[1:]) for s in samples) > 3


def _assert_same_updates(cfg, plain, other, chunk=None) -> dict:
    """One update of the same model on `plain` and on `other` (also scoring the loss columns only): equal
    metrics and weights. Large Adam epsilon: the first update is ~ lr * gradient, so weights compare
    gradients. Returns the plain update's metrics."""
    results = []
    for batch, c in ((plain, cfg), (other, cfg), (other, cfg.replace(score_loss_only=True))):
        model = tiny_decoder(0, attn_chunk=chunk)
        train_step = make_train_step(model, c, verbose=False)
        state = train_step.init(model)
        state, metrics = train_step(state, batch, train_step.reference_params(tiny_decoder(1)))
        results.append(({k: float(v) for k, v in metrics.items()}, jax.tree.leaves(state.params)))
    (want, want_params) = results[0]
    assert want["designer/tokens"] > 0 and want["kl"] > 0
    for got, got_params in results[1:]:
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
        for a, b in zip(want_params, got_params):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)
    return want


def _grouped_samples(seed=0):
    """GRPO-like groups: samples that open with one prompt (16-19 tokens before their first reply token)
    and go on with replies and observations of their own; a group too long for one row of 48; a designer
    group of stale samples; the agent's prompt again as a designer sample (another group); lone samples."""
    rng = np.random.default_rng(seed)

    def prompt(n):
        return rng.integers(1, TINY.vocab_size, n).tolist()

    def sample(head, own, role=AGENT, stale=False):
        tokens = head + rng.integers(1, TINY.vocab_size, own).tolist()
        loss = [0] * len(head) + (rng.uniform(size=own) < 0.5).astype(int).tolist()
        loss[len(head)] = 1  # the first reply token right after the prompt
        behaviour = np.log(rng.uniform(0.01, 0.2, len(tokens))).tolist()
        return Sample(tokens, loss, behaviour, advantage=float(rng.normal()), role=role, stale=stale)

    a, b, c = prompt(18), prompt(20), prompt(17)
    return [
        sample(a, 9), sample(a, 3), sample(a, 14),  # one unit: 17 + 10 + 4 + 15 columns
        sample(b, 6, DESIGNER, True), sample(b, 11, DESIGNER, True),
        sample(c, 10), sample(c, 10), sample(c, 10), sample(c, 10),  # 27 + 11 + 11 > 48: two units of two
        sample(a, 5, DESIGNER),  # the agent's prompt as a designer's: not in the agent's unit
        sample(prompt(2), 20), sample(prompt(3), 45),
    ]


def test_shared_prompts_are_stored_once_and_continued_at_their_positions():
    samples = _grouped_samples()
    plain = collate(samples, length_multiple=8, row_multiple=2)
    shared = collate(samples, length_multiple=8, row_multiple=2, pack=True, share_prefixes=True)
    assert shared.tokens_bt.shape[1] == 48
    seg, prefix, valid = shared.segment_ids_bt, shared.prefix_ids_bt, shared.valid_bt
    # the agent group (3 x 17 saved 2 x), the designer group (2 x 19, 1 x), the split group (16 once in
    # each of its two units)
    saved = 2 * 17 + 19 + 2 * 16
    assert valid.sum() == sum(len(s.tokens) for s in samples) - saved
    assert shared.loss_mask_bt.sum() == plain.loss_mask_bt.sum()
    continued = 0
    for row in range(shared.batch_size):
        for s in np.unique(seg[row][seg[row] > 0]):
            cols = np.flatnonzero(seg[row] == s)
            assert (np.diff(cols) == 1).all() and not shared.loss_mask_bt[row, cols[0]]
            parent = set(prefix[row, cols])
            assert len(parent) == 1
            (parent,) = parent
            if parent == 0:
                np.testing.assert_array_equal(shared.positions_bt[row, cols], np.arange(len(cols)))
                continue
            continued += 1
            head = np.flatnonzero(seg[row] == parent)
            assert head[-1] < cols[0] and not shared.loss_mask_bt[row, head].any()
            assert (prefix[row, head] == 0).all()
            # the member goes on where its prompt stops, repeating the prompt's last token
            np.testing.assert_array_equal(shared.positions_bt[row, cols], np.arange(len(cols)) + len(head))
            whole = np.concatenate([shared.tokens_bt[row, head], shared.tokens_bt[row, cols]]).tolist()
            assert any(whole == s.tokens for s in samples)
    assert continued == 3 + 2 + 2 + 2


@pytest.mark.parametrize("aggregation,chunk", [("token", None), ("sequence", 16), ("dr_grpo", None)])
def test_shared_prompt_update_equals_one_sample_per_row(aggregation, chunk):
    samples = _grouped_samples(1)
    cfg = RLConfig(aggregation=aggregation, lr=1e-2, adam_eps=1.0, kl_coef=0.05, micro_batches=2)
    plain = collate(samples, length_multiple=8, row_multiple=2)
    shared = collate(samples, length_multiple=8, row_multiple=2, pack=True, share_prefixes=True)
    assert (shared.prefix_ids_bt > 0).any()
    _assert_same_updates(cfg, plain, shared, chunk)


def test_splash_attention_refuses_shared_prompts():
    samples = _grouped_samples()
    batch = collate(samples, length_multiple=8, row_multiple=2, pack=True, share_prefixes=True)
    model = tiny_decoder(0, attention="splash")
    with pytest.raises(ValueError, match="share_prefixes"):
        model.hidden_states(batch.tokens_bt, batch.positions_bt, batch.valid_bt,
                            segment_ids_bt=batch.segment_ids_bt, prefix_ids_bt=batch.prefix_ids_bt)


def test_the_update_runs_attention_in_rl_attn_chunk_blocks_and_leaves_the_model_its_own():
    """rl.attn_chunk: the update's query blocks (here 8 of a 48-wide row, each reading the keys up to its
    last query) give the update of unblocked attention, and the model the sampler runs keeps its setting."""
    batch = collate(_grouped_samples(2), length_multiple=8, row_multiple=2, pack=True, share_prefixes=True)
    cfg = RLConfig(lr=1e-2, adam_eps=1.0, micro_batches=2)
    results = []
    for c in (cfg, cfg.replace(attn_chunk=8)):
        model = tiny_decoder(0, attn_chunk=None)
        train_step = make_train_step(model, c, verbose=False)
        state, metrics = train_step(train_step.init(model), batch)
        results.append((metrics, jax.tree.leaves(state.params)))
        assert {m.attn_chunk for _, m in nnx.iter_graph(model) if isinstance(m, Attention)} == {None}
    (want, want_params), (got, got_params) = results
    for k in want:
        np.testing.assert_allclose(float(got[k]), float(want[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    for a, b in zip(want_params, got_params):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)
    with pytest.raises(ValueError, match="attn_chunk"):
        RLConfig(attn_chunk=0)
