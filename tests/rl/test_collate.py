"""Collation of both roles' samples into one right-padded, bucketed TrainBatch."""

import numpy as np
import pytest

from spade_jax.rl.batch import AGENT, DESIGNER
from spade_jax.rl.collate import Sample, collate, fill_micro_batches


def test_rows_and_length_are_bucketed_and_padding_carries_no_loss():
    samples = [
        Sample([5, 6, 7], [0, 1, 1], [0.0, -1.0, -2.0], advantage=0.5, role=AGENT),
        Sample([1, 2, 3, 4, 9], [0, 0, 0, 1, 1], [0, 0, 0, -0.1, -0.2], advantage=-1.0, role=DESIGNER, stale=True),
        Sample([8], [1], [-3.0], advantage=2.0),
    ]
    batch = collate(samples, length_multiple=4, row_multiple=2)
    assert batch.tokens_bt.shape == (4, 8)  # 3 rows -> 4, length 5 -> 8
    np.testing.assert_array_equal(batch.tokens_bt[1, :5], [1, 2, 3, 4, 9])
    np.testing.assert_array_equal(batch.valid_bt.sum(1), [3, 5, 1, 0])
    np.testing.assert_array_equal(batch.loss_mask_bt[0], [0, 1, 1, 0, 0, 0, 0, 0])
    assert not batch.loss_mask_bt[:, 0].any()  # column 0 is scored by nothing
    assert not batch.loss_mask_bt[3].any()
    np.testing.assert_allclose(batch.behaviour_logprobs_bt[1, 3:5], [-0.1, -0.2])
    np.testing.assert_allclose(batch.advantages_b, [0.5, -1.0, 2.0, 0.0])
    np.testing.assert_array_equal(batch.role_b, [AGENT, DESIGNER, AGENT, AGENT])
    np.testing.assert_array_equal(batch.is_stale_b, [False, True, False, False])
    np.testing.assert_array_equal(batch.positions_bt[0], np.arange(8))


def test_long_samples_are_cut_to_max_length():
    batch = collate([Sample(list(range(10)), [1] * 10, [-1.0] * 10)], length_multiple=4, max_length=6)
    assert batch.tokens_bt.shape == (1, 6)
    assert batch.loss_mask_bt[0].sum() == 5


def test_rows_bucket_to_powers_of_two_and_one_and_a_half_times_them():
    got = [collate([Sample([1, 2], [0, 1], [0.0, -1.0])] * n, row_multiple=8).tokens_bt.shape[0]
           for n in (1, 8, 9, 17, 25, 33, 44, 49, 65)]
    assert got == [8, 8, 16, 24, 32, 48, 48, 64, 96]


def test_packed_rows_are_as_wide_as_unpacked_ones_not_max_length():
    samples = [Sample(list(range(1, n + 1)), [1] * n, [-1.0] * n) for n in (300, 200, 100, 90)]
    plain = collate(samples, max_length=8192)
    packed = collate(samples, max_length=8192, pack=True)
    assert plain.tokens_bt.shape == (4, 384)
    assert packed.tokens_bt.shape == (3, 384)  # [300], [200, 100], [90]: 3 rows of 384, not 8192


def test_min_length_gives_every_batch_one_width_without_cutting_longer_samples():
    short = [Sample(list(range(1, n + 1)), [1] * n, [-1.0] * n) for n in (300, 200, 100, 90)]
    packed = collate(short, max_length=8192, pack=True, min_length=1000)
    assert packed.tokens_bt.shape == (1, 1024)  # all four in one 1024-wide row
    np.testing.assert_array_equal(packed.valid_bt.sum(1), [690])
    assert collate(short[:1], max_length=8192, min_length=1000).tokens_bt.shape == (1, 1024)
    long = [Sample(list(range(1, 1501)), [1] * 1500, [-1.0] * 1500)]
    assert collate(long, max_length=8192, pack=True, min_length=1000).tokens_bt.shape == (1, 1536)
    assert collate(long, max_length=1200, min_length=1000).tokens_bt.shape == (1, 1200)  # max_length still cuts


def test_fixed_rows_give_every_batch_that_fits_one_row_count():
    def rows(n, pack=False):
        samples = [Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])] * n
        return collate(samples, row_multiple=8, rows=48, pack=pack).tokens_bt.shape[0]

    assert [rows(n) for n in (1, 9, 48, 49, 97)] == [48, 48, 48, 96, 144]
    assert rows(5, pack=True) == 48
    with pytest.raises(ValueError, match="multiple of 8"):
        collate([Sample([1, 2], [0, 1], [0.0, -1.0])], row_multiple=8, rows=20)


def test_fill_micro_batches_puts_rows_with_tokens_in_the_first_micro_batches():
    samples = [Sample([i + 1, i + 2], [0, 1], [0.0, -float(i)], advantage=float(i)) for i in range(5)]
    batch = collate(samples, length_multiple=2, rows=12)
    filled = fill_micro_batches(batch, 4)  # the train step deals row r to micro-batch r % 4: 3 rows each
    micro = [np.flatnonzero(np.arange(12) % 4 == m) for m in range(4)]
    assert [filled.valid_bt[rows].any(1).sum() for rows in micro] == [3, 2, 0, 0]
    # the same rows, each whole: a row's fields move together, in the samples' order
    assert sorted(filled.advantages_b[filled.valid_bt.any(1)].tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0]
    np.testing.assert_array_equal(filled.tokens_bt[micro[0]][:, 0], [1, 2, 3])
    np.testing.assert_allclose(filled.behaviour_logprobs_bt[micro[1]][:2, 1], [-3.0, -4.0])
    with pytest.raises(ValueError, match="micro-batches"):
        fill_micro_batches(batch, 5)
