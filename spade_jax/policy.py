"""The one model in its two seats: `Policy` samples text for every role, `Learner` updates it.

Both share the NNX model: after each update the learner writes the new params into it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from spade_jax.rl.collate import Sample, collate, fill_micro_batches
from spade_jax.rl.train import TrainingDiverged, batch_shards, make_train_step
from spade_jax.sampling import Sampler, SamplingConfig

log = logging.getLogger("spade_jax.policy")


class Policy:
    """Chat prompts in, sampled completions (tokens, logprobs, text) out."""

    def __init__(self, model, tokenizer, *, mesh=None):
        self.model, self.tokenizer = model, tokenizer
        self.sampler = Sampler(model, tokenizer, mesh=mesh)

    def chat_tokens(self, messages) -> list[int]:
        return self.tokenizer.encode_chat(messages, add_generation_prompt=True)

    def generate(self, prompts: list[list[int]], config: SamplingConfig, key):
        """Prompts too long for the context keep their last tokens (and a warning says so)."""
        room = self.model.spec.max_position - config.max_new_tokens
        if room < 1:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's "
                f"context of {self.model.spec.max_position}"
            )
        fitted = []
        for prompt in prompts:
            if len(prompt) > room:
                log.warning("prompt of %d tokens cut to its last %d to fit the context", len(prompt), room)
                prompt = prompt[-room:]
            fitted.append(prompt)
        return self.sampler.generate(fitted, config, key)


def without_tail(sample: Sample) -> Sample:
    """`sample` without the tokens after its last loss token (an observation that came after the last reply
    of a play that ran out of turns or context): nothing reads them, as no loss token sees a later one."""
    last = max((t for t, m in enumerate(sample.loss_mask) if m), default=len(sample.tokens) - 1) + 1
    if last >= len(sample.tokens):
        return sample
    return dataclasses.replace(sample, tokens=sample.tokens[:last], loss_mask=sample.loss_mask[:last],
                               behaviour_logprobs=sample.behaviour_logprobs[:last])


class Learner:
    """Holds the train state; `update(samples)` runs one jitted GRPO step on both roles' samples.

    A non-finite step is skipped inside the jitted step (weights and optimizer state kept); after
    `rl.max_nonfinite_steps` of them in a row `update` raises TrainingDiverged, before any checkpoint
    of the bad step could be saved.

    With `rl.kl_coef > 0` it also holds `ref_params`, a frozen copy of the weights the model has when
    the Learner is made: build it from the freshly loaded model and only then restore a checkpoint
    into `state` (experiments/run.py does), so a resumed run keeps the starting policy as reference.
    """

    def __init__(self, model, rl_config, *, mesh=None, sandbox=None, verbose: bool = True, publish=None):
        self.model, self.cfg, self.mesh, self.sandbox = model, rl_config, mesh, sandbox
        # Called after new weights are written into `model`: sends them to a sampler on other devices
        # (placement.Placement.publish); None when the sampler reads `model` itself.
        self.publish = publish
        self.train_step = make_train_step(model, rl_config, mesh, verbose=verbose)
        self.state = self.train_step.init(model)
        self.ref_params = self.train_step.reference_params(model)  # KL anchor; None when rl.kl_coef == 0
        self.shards = shards = batch_shards(mesh, self.train_step.rules)
        self.row_multiple = rl_config.micro_batches * shards
        self._update_rows = rl_config.update_rows
        if self._update_rows is not None and self._update_rows % self.row_multiple:
            raise ValueError(
                f"rl.update_rows ({self._update_rows}) must be a multiple of micro_batches x batch shards "
                f"({rl_config.micro_batches} x {shards})"
            )
        self.max_length = model.spec.max_position
        # splash attention reads segment ids, not the dense mask that shows a shared prompt to its samples
        self._share_prefixes = (rl_config.pack_sequences and rl_config.share_prefixes
                                and getattr(model, "attention_impl", None) != "splash")
        # Host-side counters (not checkpointed: a resumed run counts from 0 again).
        self.skipped_steps = 0  # non-finite steps skipped since this Learner was made
        self.nonfinite_run = 0  # non-finite steps in a row, up to the latest
        self.unwritten = False  # the state holds an update `model` (and the sampler) has not received yet

    def update(self, samples: list[Sample], *, write_back: bool = True) -> dict:
        """One update; with nothing trainable (every advantage 0) the step is skipped, loss 0.

        `write_back=False` leaves the new weights in `state` only (`model`, which the sampler may be reading
        meanwhile, keeps the old ones) until `write_back()`: the asynchronous loop's overlap.
        """
        if not samples:
            return {"loss": 0.0, "update/skipped": 1, "train/skipped": 0, "train/skipped_steps": self.skipped_steps}
        short, long = self._split_by_length([without_tail(s) for s in samples])
        batch = self._collate(short or long)
        if short and long:
            wide = self._collate(long, apart=True)
            self.state, metrics = self.train_step(self.state, (batch, wide), self.ref_params)
        else:
            wide = None
            self.state, metrics = self.train_step(self.state, batch, self.ref_params)
        out = {k: float(v) for k, v in metrics.items()}
        skipped = out["train/skipped"] > 0
        out["train/skipped"] = int(skipped)
        out["update/skipped"] = int(skipped)
        out["update/rows"], out["update/length"] = batch.tokens_bt.shape
        out["update/long_rows"], out["update/long_length"] = (0, 0) if wide is None else wide.tokens_bt.shape
        parts = [batch] if wide is None else [batch, wide]
        filled = [(int(np.asarray(part.valid_bt).any(axis=1).sum()), part.tokens_bt.shape[1]) for part in parts]
        out["update/filled_rows"] = sum(rows for rows, _ in filled)  # rows holding tokens
        out["update/row_tokens"] = sum(rows * width for rows, width in filled)  # their columns, padding included
        # tokens through the model: a prompt shared by samples in a row (rl.share_prefixes) counts once
        out["update/model_tokens"] = sum(int(np.asarray(part.valid_bt).sum()) for part in parts)
        if not skipped:
            self.nonfinite_run = 0
            self.unwritten = True
            if write_back:
                out.update(self.write_back())
            out["train/skipped_steps"] = self.skipped_steps
            return out
        self.skipped_steps += 1
        self.nonfinite_run += 1
        out["train/skipped_steps"] = self.skipped_steps
        limit = self.cfg.max_nonfinite_steps
        log.warning(
            "non-finite update skipped (loss %s, grad_norm %s); %d of %d in a row before the run stops",
            out.get("loss"), out.get("grad_norm"), self.nonfinite_run, limit,
        )
        if self.nonfinite_run >= limit:
            raise TrainingDiverged(
                f"training diverged: {self.nonfinite_run} non-finite updates in a row (last loss "
                f"{out.get('loss')}, grad_norm {out.get('grad_norm')}), none applied; the last good "
                "checkpoint is kept (lower rl.lr, or raise rl.max_nonfinite_steps)"
            )
        return out

    def _split_by_length(self, samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
        """(samples that fit `rl.min_update_length`, longer ones); all in the first without
        `rl.long_samples_apart` or a `min_update_length`."""
        limit = self.cfg.min_update_length
        if limit is None or not self.cfg.long_samples_apart:
            return samples, []
        return [s for s in samples if len(s.tokens) <= limit], [s for s in samples if len(s.tokens) > limit]

    def _collate(self, samples: list[Sample], *, apart: bool = False):
        """The update rows of `samples`. `apart`: the long samples' batch, rows a multiple of the batch
        shards (of `rl.micro_batches` x the shards when `rl.update_rows` is set: one shape per width),
        dealt one row per shard to each micro-batch, so its padding rows cost no compute."""
        pad_id = getattr(self.model.spec, "pad_token_id", None) or 0
        common = dict(
            max_length=self.max_length, pad_id=pad_id, pack=self.cfg.pack_sequences,
            length_multiple=self.cfg.update_length_multiple, share_prefixes=self._share_prefixes,
        )
        if not apart:
            batch = collate(
                samples, row_multiple=self.row_multiple, min_length=self.cfg.min_update_length,
                rows=self._update_rows, **common,
            )
            return batch if self._update_rows is None else fill_micro_batches(batch, self.cfg.micro_batches)
        rows = None if self._update_rows is None else self.row_multiple
        batch = collate(samples, row_multiple=self.shards, rows=rows, **common)
        return fill_micro_batches(batch, batch.batch_size // self.shards)

    def write_back(self) -> dict:
        """Copies the state's weights into `model` and publishes them to the sampler, if an update is
        unwritten; returns `{"time/publish": s}` when a publish ran."""
        if not self.unwritten:
            return {}
        self.unwritten = False
        self.train_step.write_params(self.model, self.state)
        if self.publish is None:
            return {}
        started = time.perf_counter()
        self.publish()
        return {"time/publish": time.perf_counter() - started}
