"""The RL update's knobs: GRPO loss, advantage estimators per role, AdamW, micro-batching, dtypes.

Defaults are SPADE's reference recipe (SPADE.md, step 8); fields SPADE leaves open say where theirs come from.
"""

from __future__ import annotations

import dataclasses

AGGREGATIONS = ("token", "sequence", "dr_grpo")
COMPUTE_DTYPES = ("float32", "bfloat16")
KL_ESTIMATORS = ("k1", "k3")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    eps_low: float = 0.2  # clip ratio below at 1 - eps_low (SPADE)
    eps_high: float = 0.28  # clip ratio above at 1 + eps_high (SPADE, DAPO's clip-higher)
    # weight of the KL to the initial policy (SPADE: 0; its 8B recipe 0.005);
    # > 0 holds a frozen copy of the starting params
    kl_coef: float = 0.0
    # per-token KL estimator: k3 = exp(ref - logp) - (ref - logp) - 1 (low variance, SPADE's 8B recipe); k1 = logp - ref
    kl_estimator: str = "k3"
    # token: mean over all loss tokens; sequence: mean of per-sequence means;
    # dr_grpo: sum / (sequences * dr_grpo_tokens)
    aggregation: str = "token"
    dr_grpo_tokens: int | None = None  # Dr.GRPO's constant per-sequence token budget; None: the batch's padded length
    tis_cap: float | None = 2.0  # truncation of the importance weight pi_prox / pi_behaviour; None: no correction
    agent_advantage: str = "grpo_zscore"  # registry name of the agent's advantage estimator
    lr: float = 1e-6  # AdamW learning rate, constant (SPADE)
    weight_decay: float = 0.1  # AdamW decoupled weight decay (SPADE)
    b1: float = 0.9  # AdamW beta1 (SPADE)
    b2: float = 0.98  # AdamW beta2 (SPADE)
    adam_eps: float = 1e-8  # AdamW epsilon (Megatron's default; SPADE does not say)
    decay_norms: bool = False  # also decay 1-D params (norm scales, biases); Megatron exempts them
    grad_clip: float | None = 1.0  # global-norm clip (Megatron/slime default 1.0; SPADE does not say); None: off
    micro_batches: int = 1  # gradient accumulation: the batch is split into this many micro-batches (lax.scan)
    compute_dtype: str = "float32"  # activations and matmuls; bfloat16 keeps master params in float32
    # attention's query block in the update (each block reads the keys up to its last query, so smaller
    # blocks skip more; laptop 256: a laptop-shaped update 1.11x faster than at 512, docs/benchmarks.md);
    # null: model.attn_chunk, which the sampler keeps (its prefill over a cache skips nothing by blocks,
    # and 256 there made a laptop run's plays and anchor 8-28% slower)
    attn_chunk: int | None = None
    master_fp32: bool = True  # keep (and update) params in float32 even if the model stores bfloat16
    # time steps per chunk of the output projection (saves the [B, T, V] logits); None: all at once
    logprob_chunk: int | None = None
    # project onto the vocabulary only at loss columns (TrainBatch.score_index_bk, made on the host):
    # equal logprobs where the loss reads them, and the laptop's updates have ~40 loss tokens in
    # ~1000-token rows (SmolLM2, 24 packed rows: 167 s per update against 192 s, same loss,
    # benchmarks/update_packing.py); False: at every column (the [B, T, V] projection). On in `laptop`;
    # off by default: its columns are picked by [B, K, T] one-hot matmuls, which grow with T^2 at the
    # reference's 32k-token contexts
    score_loss_only: bool = False
    # pack several samples into each update row (first-fit decreasing, attention kept inside each
    # sample by segment ids), rows as wide as unpacked ones: equal loss and gradients with fewer rows
    # (44 laptop-like samples of 120-800 tokens: 32 rows instead of 48, update 151 s vs 226 s on
    # SmolLM2, benchmarks/update_packing.py); False: one sample per row (the reference's layout).
    # On in the `laptop` config; off by default until timed on an accelerator's attention kernels
    pack_sequences: bool = False
    # Update rows at least this many tokens wide (rounded up to 128); null: the batch's longest sample.
    # One width for every update leaves one compiled update per row count instead of one per (rows,
    # length) pair, and each new pair costs a compile of about a minute for SmolLM2 on a 2-core CPU; with
    # pack_sequences the wider rows hold more samples each, so the padding it adds is small.
    min_update_length: int | None = None
    # Update rows are a multiple of this many tokens wide. With min_update_length, a sample longer than
    # it (a designer's request and the program it wrote) makes the update wider: at 128 each
    # design's length is a new shape and a new compile (minutes on a 2-core CPU, once per width and
    # machine); at min_update_length's value the widths are 2x, 3x ... of it, a few shapes in all.
    update_length_multiple: int = 128
    # With min_update_length, samples longer than it (a designer's request and program) are updated in
    # rows of their own width, a second set of micro-batches in the same step (one optimizer step, the
    # same loss and gradients), so the other rows stay min_update_length wide: false puts every row at
    # the longest sample's width, and attention runs over whole rows (a laptop update of 24 plays and
    # 2 designs: 771 s at 48 x 3584 against 502 s apart, benchmarks/update_widths.py).
    long_samples_apart: bool = True
    # With pack_sequences, samples that begin with the same prompt (tokens before their first generated
    # token: a GRPO group's plays of one instance, `group_instances: shared`) store it once per row, and
    # their own tokens attend to it there: the same loss and gradients with fewer tokens through the
    # model. Beyond the reference (one row per sample); off where attention is splash (segment ids only)
    share_prefixes: bool = True
    # Every update padded to this many rows (a multiple of micro_batches x batch shards; more samples
    # than that: a multiple of it). The rows are placed so that padding fills whole micro-batches, which
    # the step skips at run time (lax.cond), so a small update costs about its own rows while every
    # update has one shape: one compile per run (and none once XLA's cache holds it) instead of one per
    # row count, about a minute each for SmolLM2 on a 2-core CPU. With score_loss_only the scored
    # columns per row are fixed too (a quarter of the row's width, more only if a row needs them).
    # null: rows bucketed to the batch (1, 2, 3, 4, 6, 8, ... times micro_batches x shards).
    update_rows: int | None = None
    seed: int = 0  # seeds the RNG carried in the train state
    # agent reward + this x the share of its replies holding a complete \boxed{...}
    # (SPADE: 0; shaping for small models that never answer in the action format)
    format_bonus: float = 0.0
    # weight of the mean negative log-likelihood of the anchor samples (the starting policy's replies to
    # questions outside the games, the config's `anchor` section): InstructGPT's pretraining mix (PPO-ptx)
    # on the model's own answers, to hold its answers outside the games, where a KL on the game tokens
    # alone did not (docs/results.md). SPADE: 0 (no anchor)
    anchor_coef: float = 0.0
    # this many non-finite updates in a row (each skipped, weights kept) stop the run with TrainingDiverged
    max_nonfinite_steps: int = 3

    def __post_init__(self):
        if not (0.0 <= self.eps_low < 1.0) or self.eps_high < 0.0:
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if not self.anchor_coef >= 0:
            raise ValueError(f"anchor_coef must be >= 0, got {self.anchor_coef}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator {self.kl_estimator!r} is not one of {KL_ESTIMATORS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} is not one of {AGGREGATIONS}")
        if self.dr_grpo_tokens is not None and self.dr_grpo_tokens <= 0:
            raise ValueError(f"dr_grpo_tokens must be positive or None, got {self.dr_grpo_tokens}")
        if self.tis_cap is not None and self.tis_cap < 1.0:
            raise ValueError(f"tis_cap must be >= 1 (or None to disable), got {self.tis_cap}")
        if self.lr < 0:
            raise ValueError(f"rl.lr must be >= 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"rl.weight_decay must be >= 0, got {self.weight_decay}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise ValueError(f"AdamW betas must be in [0, 1), got {self.b1}, {self.b2}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip}")
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
        if self.attn_chunk is not None and self.attn_chunk < 1:
            raise ValueError(f"attn_chunk must be >= 1 or null, got {self.attn_chunk}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype {self.compute_dtype!r} is not one of {COMPUTE_DTYPES}")
        if not 0.0 <= self.format_bonus <= 1.0:
            raise ValueError(f"format_bonus must be in [0, 1], got {self.format_bonus}")
        if self.logprob_chunk is not None and self.logprob_chunk <= 0:
            raise ValueError(f"logprob_chunk must be positive or None, got {self.logprob_chunk}")
        if self.update_rows is not None and (self.update_rows <= 0 or self.update_rows % self.micro_batches):
            raise ValueError(
                f"update_rows must be a positive multiple of micro_batches ({self.micro_batches}) or None, "
                f"got {self.update_rows}"
            )
        if self.min_update_length is not None and self.min_update_length <= 0:
            raise ValueError(f"min_update_length must be positive or None, got {self.min_update_length}")
        if not isinstance(self.update_length_multiple, int) or self.update_length_multiple < 1:
            raise ValueError(f"update_length_multiple must be an int >= 1, got {self.update_length_multiple!r}")
        from spade_jax.rl.advantages import get_advantage_estimator  # avoid a cycle

        get_advantage_estimator(self.agent_advantage)
        if not isinstance(self.max_nonfinite_steps, int) or self.max_nonfinite_steps < 1:
            raise ValueError(f"RLConfig.max_nonfinite_steps must be an int >= 1, got {self.max_nonfinite_steps!r}")

    def replace(self, **changes) -> "RLConfig":
        return dataclasses.replace(self, **changes)
