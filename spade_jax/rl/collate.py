"""Turns variable-length samples of both roles into one padded `TrainBatch`.

Shapes are bucketed (length to a multiple, rows to a power of two or 1.5 times one) so the train step compiles
rarely. With `pack`, several samples share a row (first-fit decreasing), told apart by segment ids.
"""

from __future__ import annotations

import collections
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
    share_prefixes: bool = False,
) -> TrainBatch:
    """Right-pads every sample to a common bucketed length; extra rows are padding with no loss.

    A sample longer than `max_length` is cut from the right (its tail carries no loss then). With `pack`,
    samples are packed first-fit decreasing into rows as wide as the unpacked batch's (the longest sample's
    bucketed length), so packing only removes rows. Rows are `row_multiple` times a row bucket. Rows are
    at least `min_length` wide (bucketed), whatever the batch's longest sample: one width for every batch.
    With `rows`, the rows are a multiple of it (`RLConfig.update_rows`): one shape for every batch that fits.
    With `pack` and `share_prefixes`, samples with the same prompt (their tokens up to the first loss token:
    a GRPO group's plays of one instance) store it once per row (`_pack_rows`).
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
        return _packed(samples, width, row_multiple, pad_id, rows, share_prefixes)
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


# A prompt shorter than this is stored once per sample: sharing it would save less than it costs to place.
MIN_SHARED_PROMPT = 16


@dataclasses.dataclass
class _Unit:
    """What one row holds of a prompt group: its prompt segment (`shared` tokens, 0: a lone sample stored
    whole) and the samples that continue it there."""

    members: list[int]  # sample indices
    shared: int


def prompt_keys(samples: list[Sample], lengths: list[int], minimum: int = MIN_SHARED_PROMPT) -> list[tuple | None]:
    """Per sample, (role, staleness, prompt) when another sample has the same, else None. Its prompt: its
    tokens before its first loss token, less the last of them, if at least `minimum`."""
    first_loss = [next((t for t, m in enumerate(s.loss_mask[:n]) if m), n) for s, n in zip(samples, lengths)]
    keys = [(s.role, s.stale, tuple(s.tokens[: f - 1])) if f - 1 >= minimum else None
            for s, f in zip(samples, first_loss)]
    counts = collections.Counter(key for key in keys if key is not None)
    return [key if key is not None and counts[key] > 1 else None for key in keys]


def _pack_rows(samples: list[Sample], lengths: list[int], width: int, share_prefixes: bool) -> list[list[_Unit]]:
    """First-fit decreasing into rows of `width`. With `share_prefixes`, a sample whose prompt is shared
    (`prompt_keys`) joins a row that holds its prompt already when its own part fits there, and pays
    for the prompt only where it opens a row's copy of it; so each row stores a group's prompt once and
    every member after the first costs its own tokens only.

    A member's own part starts with the prompt's last token again, so the state that scores its first
    generated token is computed in its own segment, and the first column of a segment (which nothing
    scores) never holds a loss token. Exact: every token sees the same keys at the same positions as in
    a row of its own, and the prompt's gradient is the sum over its members'.
    """
    keys = prompt_keys(samples, lengths) if share_prefixes else [None] * len(samples)
    shared = [len(key[2]) if key is not None else 0 for key in keys]
    rows: list[list[_Unit]] = []
    used: list[int] = []
    opened: list[dict[tuple, _Unit]] = []  # per row: the prompt groups it holds
    for i in sorted(range(len(samples)), key=lambda i: -lengths[i]):
        key, own = keys[i], lengths[i] - shared[i]
        row = None
        if key is not None:
            row = next((r for r in range(len(rows)) if key in opened[r] and used[r] + own <= width), None)
        if row is not None:
            opened[row][key].members.append(i)
            used[row] += own
            continue
        row = next((r for r in range(len(rows)) if used[r] + lengths[i] <= width), None)
        if row is None:
            row = len(rows)
            rows.append([])
            used.append(0)
            opened.append({})
        unit = _Unit([i], shared[i])
        rows[row].append(unit)
        used[row] += lengths[i]
        if key is not None:
            opened[row][key] = unit
    for units in rows:  # a prompt that only one sample of its row continues is not a segment of its own
        for unit in units:
            if len(unit.members) == 1:
                unit.shared = 0
    return rows


def _packed(samples: list[Sample], width: int, row_multiple: int, pad_id: int, rows: int | None,
            share_prefixes: bool = False) -> TrainBatch:
    """`_pack_rows`' layout; per-token advantages, roles and staleness, and with `share_prefixes` the
    prompt segment each sequence continues (`prefix_ids_bt`)."""
    lengths = [min(len(s.tokens), width) for s in samples]
    packed = _pack_rows(samples, lengths, width, share_prefixes)
    # a multiple of micro-batches x batch shards, as the train step needs
    rows = _bucket_rows(len(packed), row_multiple, rows)
    tokens = np.full((rows, width), pad_id, np.int32)
    positions = np.zeros((rows, width), np.int32)
    valid = np.zeros((rows, width), bool)
    loss = np.zeros((rows, width), bool)
    behaviour = np.zeros((rows, width), np.float32)
    advantages = np.zeros((rows, width), np.float32)
    roles = np.zeros((rows, width), np.int32)
    stale = np.zeros((rows, width), bool)
    segments = np.zeros((rows, width), np.int32)
    prefixes = np.zeros((rows, width), np.int32)
    next_segment = [1] * rows
    for row, units in enumerate(packed):
        start = 0
        for unit in units:
            prompt = 0
            if unit.shared:  # the prompt segment: context only, no loss
                first = samples[unit.members[0]]
                cols = slice(start, start + unit.shared)
                tokens[row, cols] = first.tokens[: unit.shared]
                positions[row, cols] = np.arange(unit.shared)
                valid[row, cols] = True
                roles[row, cols] = first.role
                stale[row, cols] = first.stale
                prompt = next_segment[row]
                segments[row, cols] = prompt
                next_segment[row] += 1
                start += unit.shared
            for i in unit.members:
                sample = samples[i]
                begin = unit.shared  # a member's own part: from the prompt's last token on
                n = lengths[i] - begin
                cols = slice(start, start + n)
                tokens[row, cols] = sample.tokens[begin: lengths[i]]
                positions[row, cols] = np.arange(begin, lengths[i])
                valid[row, cols] = True
                loss[row, cols] = np.asarray(sample.loss_mask[begin: lengths[i]], bool)
                loss[row, start] = False  # a sequence's first token is scored by nothing of its own
                behaviour[row, cols] = sample.behaviour_logprobs[begin: lengths[i]]
                advantages[row, cols] = sample.advantage
                roles[row, cols] = sample.role
                stale[row, cols] = sample.stale
                segments[row, cols] = next_segment[row]
                prefixes[row, cols] = prompt
                next_segment[row] += 1
                start += n
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
        prefix_ids_bt=prefixes if share_prefixes else None,
    ).check()
