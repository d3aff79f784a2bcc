"""The one model in its two seats: `Policy` samples text for every role, `Learner` updates it.

Both share the NNX model: after each update the learner writes the new params into it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from spade_jax.rl.collate import Sample, collate
from spade_jax.rl.train import make_train_step
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


class Learner:
    """Holds the train state; `update(samples)` runs one jitted GRPO step on both roles' samples."""

    def __init__(self, model, rl_config, *, mesh=None, sandbox=None, verbose: bool = True):
        self.model, self.cfg, self.mesh, self.sandbox = model, rl_config, mesh, sandbox
        self.train_step = make_train_step(model, rl_config, mesh, verbose=verbose)
        self.state = self.train_step.init(model)
        shards = 1
        if mesh is not None:
            shards = int(np.prod([mesh.shape[a] for a in ("data", "fsdp") if a in mesh.axis_names]))
        self.row_multiple = rl_config.micro_batches * shards
        self.max_length = model.spec.max_position

    def update(self, samples: list[Sample]) -> dict:
        """One update; with nothing trainable (every advantage 0) the step is skipped, loss 0."""
        if not samples:
            return {"loss": 0.0, "update/skipped": 1}
        batch = collate(
            samples, row_multiple=self.row_multiple, max_length=self.max_length,
            pad_id=getattr(self.model.spec, "pad_token_id", None) or 0,
        )
        self.state, metrics = self.train_step(self.state, batch)
        self.train_step.write_params(self.model, self.state)
        out = {k: float(v) for k, v in metrics.items()}
        out["update/skipped"] = 0
        out["update/rows"], out["update/length"] = batch.tokens_bt.shape
        if not math.isfinite(out.get("loss", 0.0)):
            raise FloatingPointError(f"the update produced a non-finite loss ({out['loss']}); lower rl.lr")
        return out
