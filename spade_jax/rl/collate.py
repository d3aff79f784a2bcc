"""Turns variable-length samples of both roles into one padded `TrainBatch`.

Shapes are bucketed (length to a multiple, rows to a power of two or 1.5 times one) so the train step compiles
rarely. With `pack`, several samples share a row (first-fit decreasing), told apart by segment ids.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spade_jax.rl.batch import AGENT, TrainBatch


@dataclasses.dataclass
class Sample:
    """One sequence for the update: what was generated (loss_mask) and how good it was (advantage)."""

    tokens: list[int]
    loss_mask: list[int]  # 1 on tokens the policy generated
    behaviour_logprobs: list[float]  # aligned with tokens
    advantage: float = 0.0
    role: int = AGENT  # rl.batch.AGENT or DESIGNER
    stale: bool = False  # sampled by an older policy (the delayed designer update)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _row_bucket(n: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5 times them) >= n: at most
    a third of the rows are padding (a power of two alone pads 44 samples to 64), and a run still meets
    few distinct shapes (each a compile of a minute or more for a 135M model on a 2-core CPU)."""
    power = 1 << max(0, (n - 1).bit_length())
    return power * 3 // 4 if power >= 4 and power * 3 // 4 >= n else power


def _bucket_rows(n: int, row_multiple: int, rows: int | None = None) -> int:
    """`row_multiple` times a row bucket (`_row_bucket`), at least `n` (and at least one multiple); with
    `rows` (a multiple of `row_multiple`), the smallest multiple of `rows` that holds `n`."""
    if rows is not None:
        if rows <= 0 or rows % row_multiple:
            raise ValueError(f"rows must be a positive multiple of {row_multiple}, got {rows}")
        return rows * -(-max(n, 1) // rows)
    return row_multiple * _row_bucket(-(-max(n, 1) // row_multiple))


def fill_micro_batches(batch: TrainBatch, micro_batches: int) -> TrainBatch:
    """The same rows reordered so that, dealt round-robin into `micro_batches` (row r to micro-batch
    r % micro_batches, as the train step splits), the rows holding tokens fill the first micro-batches
    and padding rows the last: micro-batches of padding only, which the step skips when
    `RLConfig.update_rows` is set. Loss and gradients do not depend on the row order."""
    has_tokens = np.asarray(batch.valid_bt).any(axis=1)
    rows = len(has_tokens)
    if rows % micro_batches:
        raise ValueError(f"{rows} rows do not split into {micro_batches} micro-batches")
    per_micro = rows // micro_batches
    filled = np.argsort(~has_tokens, kind="stable")  # rows with tokens first, in their order
    q = np.arange(rows)
    order = np.empty(rows, np.int64)
    order[(q % per_micro) * micro_batches + q // per_micro] = filled
    return batch.replace(**{
        field.name: np.asarray(value)[order]
        for field in dataclasses.fields(batch)
        if (value := getattr(batch, field.name)) is not None and np.ndim(value) >= 1
    })


def collate(
    samples: list[Sample],
    *,
    length_multiple: int = 128,
    max_length: int | None = None,
    row_multiple: int = 1,
    pad_id: int = 0,
    pack: bool = False,
    min_length: int | None = None,
    rows: int | None = None,
) -> TrainBatch:
    """Right-pads every sample to a common bucketed length; extra rows are padding with no loss.

    A sample longer than `max_length` is cut from the right (its tail carries no loss then). With `pack`,
    samples are packed first-fit decreasing into rows as wide as the unpacked batch's (the longest sample's
    bucketed length), so packing only removes rows. Rows are `row_multiple` times a row bucket. Rows are
    at least `min_length` wide (bucketed), whatever the batch's longest sample: one width for every batch.
    With `rows`, the rows are a multiple of it (`RLConfig.update_rows`): one shape for every batch that fits.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    longest = max(max(len(s.tokens) for s in samples), min_length or 0)
    if max_length is not None:
        longest = min(longest, max_length)
    width = _round_up(max(longest, 1), length_multiple)
    if max_length is not None:
        width = min(width, max(max_length, 1))
    if pack:
        # As wide as the unpacked rows, not `max_length`: the Learner's max_length is the model's
        # position limit (8192 for SmolLM2), and rows that wide made the laptop's packed update
        # compile to 6.3 GiB of temporaries against 1.5 GiB unpacked (2026-12-05).
        return _packed(samples, width, row_multiple, pad_id, rows)
    # Rows: a multiple of micro-batches x batch shards, as the train step needs.
    rows = _bucket_rows(len(samples), row_multiple, rows)
    tokens = np.full((rows, width), pad_id, np.int32)
    valid = np.zeros((rows, width), bool)
    loss = np.zeros((rows, width), bool)
    behaviour = np.zeros((rows, width), np.float32)
    advantages = np.zeros((rows,), np.float32)
    roles = np.zeros((rows,), np.int32)
    stale = np.zeros((rows,), bool)
    for row, sample in enumerate(samples):
        n = min(len(sample.tokens), width)
        tokens[row, :n] = sample.tokens[:n]
        valid[row, :n] = True
        loss[row, :n] = np.asarray(sample.loss_mask[:n], bool)
        behaviour[row, :n] = sample.behaviour_logprobs[:n]
        advantages[row] = sample.advantage
        roles[row] = sample.role
        stale[row] = sample.stale
    loss[:, 0] = False  # the first token is scored by nothing
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy()
    return TrainBatch(
        tokens_bt=tokens,
        positions_bt=positions,
        valid_bt=valid,
        loss_mask_bt=loss,
        behaviour_logprobs_bt=behaviour,
        advantages_b=advantages,
        role_b=roles,
        is_stale_b=stale,
    ).check()


def _packed(samples: list[Sample], width: int, row_multiple: int, pad_id: int, rows: int | None) -> TrainBatch:
    """First-fit decreasing into rows of `width`; per-token advantages, roles and staleness."""
    lengths = [min(len(s.tokens), width) for s in samples]
    fill: list[int] = []  # tokens used per row
    placed: list[tuple[int, int, int]] = []  # (sample, row, start column)
    for i in sorted(range(len(samples)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(fill) if used + lengths[i] <= width), None)
        if row is None:
            row = len(fill)
            fill.append(0)
        placed.append((i, row, fill[row]))
        fill[row] += lengths[i]
    # a multiple of micro-batches x batch shards, as the train step needs
    rows = _bucket_rows(len(fill), row_multiple, rows)
    tokens = np.full((rows, width), pad_id, np.int32)
    positions = np.zeros((rows, width), np.int32)
    valid = np.zeros((rows, width), bool)
    loss = np.zeros((rows, width), bool)
    behaviour = np.zeros((rows, width), np.float32)
    advantages = np.zeros((rows, width), np.float32)
    roles = np.zeros((rows, width), np.int32)
    stale = np.zeros((rows, width), bool)
    segments = np.zeros((rows, width), np.int32)
    next_segment = [1] * rows
    for i, row, start in sorted(placed, key=lambda p: (p[1], p[2])):
        sample, n = samples[i], lengths[i]
        cols = slice(start, start + n)
        tokens[row, cols] = sample.tokens[:n]
        positions[row, cols] = np.arange(n)
        valid[row, cols] = True
        loss[row, cols] = np.asarray(sample.loss_mask[:n], bool)
        loss[row, start] = False  # a sequence's first token is scored by nothing of its own
        behaviour[row, cols] = sample.behaviour_logprobs[:n]
        advantages[row, cols] = sample.advantage
        roles[row, cols] = sample.role
        stale[row, cols] = sample.stale
        segments[row, cols] = next_segment[row]
        next_segment[row] += 1
    return TrainBatch(
        tokens_bt=tokens,
        positions_bt=positions,
        valid_bt=valid,
        loss_mask_bt=loss,
        behaviour_logprobs_bt=behaviour,
        advantages_bt=advantages,
        role_bt=roles,
        is_stale_bt=stale,
        segment_ids_bt=segments,
    ).check()
