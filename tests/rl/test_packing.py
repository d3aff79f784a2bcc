"""Packed update rows (several samples per row, segment ids): the same loss, metrics and gradients as one
sample per row, for every aggregation."""

import jax
import numpy as np
import pytest
from rl_testing import TINY, tiny_decoder

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
    # Large Adam epsilon: the first update is ~ lr * gradient, so params compare gradients.
    cfg = RLConfig(aggregation=aggregation, lr=1e-2, adam_eps=1.0, kl_coef=0.05, micro_batches=2)
    plain = collate(samples, length_multiple=8, row_multiple=2)
    packed = collate(samples, length_multiple=8, row_multiple=2, pack=True)
    results = []
    for batch, c in ((plain, cfg), (packed, cfg), (packed, cfg.replace(score_loss_only=True))):
        model = tiny_decoder(0)
        train_step = make_train_step(model, c, verbose=False)
        state = train_step.init(model)
        state, metrics = train_step(state, batch, train_step.reference_params(tiny_decoder(1)))
        results.append(({k: float(v) for k, v in metrics.items()}, jax.tree.leaves(state.params)))
    (want, want_params) = results[0]
    assert want["sequences"] == sum(any(s.loss_mask[1:]) for s in samples) > 3
    assert want["designer/tokens"] > 0 and want["kl"] > 0
    for got, got_params in results[1:]:
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
        for a, b in zip(want_params, got_params):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6)
