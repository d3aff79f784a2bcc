"""The anchor: the starting policy's own replies to questions outside the games, kept for the whole run
and trained on by likelihood beside the policy gradient (`rl.anchor_coef`, InstructGPT's PPO-ptx).

On the embedded 135M model, GRPO on the games moved the agent's answers everywhere else: after a few
updates it answered held-out questions with the games' action placeholder or one constant, and neither a
lower rate nor a KL on the game tokens held them (docs/results.md, sessions 17-19). The anchor holds
the starting policy's answers to other questions: its replies (greedy by default) are written by the
starting policy once, in the agent's own conversation and answer format, a resumed run keeps them (they
travel in the trainer state), and no label of any task is used.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from spade_jax.envs.api import extract_boxed
from spade_jax.evaluation.environments import make_eval_env
from spade_jax.evaluation.play import EvalEpisode
from spade_jax.evaluation.rg_items import parse_rg_task, rg_dataset
from spade_jax.evaluation.suites import SUITES
from spade_jax.knobs import ConfigError, choice, positive
from spade_jax.rl.batch import ANCHOR
from spade_jax.rl.collate import Sample

# One-turn reasoning-gym generators, none of them in an evaluation suite (the config refuses those): sums,
# number theory, counting, words, dates, kinship. Their answers are numbers, words and dates, not the
# True/False/Yes/No of the `small` suite.
DEFAULT_TASKS = (
    "rg:basic_arithmetic", "rg:chain_sum", "rg:gcd", "rg:lcm", "rg:products", "rg:simple_equations",
    "rg:count_bits", "rg:letter_counting", "rg:leg_counting", "rg:spell_backward", "rg:family_relationships",
    "rg:aiw", "rg:calendar_arithmetic", "rg:time_intervals", "rg:base_conversion",
)
# Item seeds: away from the evaluation suites' (900000..) and the screens' (900777..).
ANCHOR_SEED_BASE = 700_000
KEEP = ("answers", "all")
# A box of dots, an ellipsis or nothing answers nothing (the placeholder the games' lines and, before
# 2026-12-07, the questions' answer line showed: `\boxed{...}`).
_PLACEHOLDER = re.compile(r"[\s.\u2026]*")


@dataclasses.dataclass(frozen=True)
class AnchorConfig:
    """Where the anchor samples come from; they are used when `rl.anchor_coef > 0`."""

    tasks: tuple[str, ...] = DEFAULT_TASKS  # one-turn reasoning-gym tasks ("rg:<name>"), none in an eval suite
    prompts: int = 192  # questions answered by the starting policy, dealt over the tasks in turn
    per_update: int = 16  # anchor samples in each update, taken in turn from the kept ones
    # 0: the starting policy's greedy replies, the answers a greedy evaluation reads, which the anchor
    # then holds (its samples at the agent's temperature 1.0 were a third junk or the placeholder `...` on
    # the 135M model, and did not hold held-out success: docs/results.md); null: the agent's own sampling
    # temperature (the term is then a sample estimate of KL(pi_start || pi) plus a constant)
    temperature: float | None = 0.0
    # answers: keep only replies holding a closed \boxed{} with an answer in it, not the answer line's
    # placeholder `...` (the 135M model's greedy reply to 69 of 96 of these questions when their answer line
    # showed `\boxed{...}`, and the reply its held-out answers collapsed onto: anchored, it would pull toward
    # the collapse); all: every reply
    keep: str = "answers"

    def __post_init__(self):
        positive(self.prompts, "anchor.prompts")
        positive(self.per_update, "anchor.per_update")
        if self.temperature is not None:
            positive(self.temperature, "anchor.temperature", allow_zero=True)
        choice(self.keep, KEEP, "anchor.keep")
        if not self.tasks:
            raise ConfigError("anchor.tasks is empty; name one-turn reasoning-gym tasks such as rg:gcd")
        for task in self.tasks:
            if not task.startswith("rg:"):
                raise ConfigError(f"anchor.tasks: {task!r} is not a one-turn reasoning-gym task ('rg:<name>')")
            suites = sorted(name for name, suite in SUITES.items()
                            if rg_dataset(task) in {rg_dataset(t.env_id) for t in suite.tasks if t.kind == "rg"})
            if suites:
                raise ConfigError(f"anchor.tasks: {task} is scored by the eval suite(s) {', '.join(suites)}; "
                                  "an anchor must not train on what is evaluated")
        if self.tasks != DEFAULT_TASKS:  # reasoning-gym's import takes a second: only for tasks of one's own
            for task in self.tasks:
                try:
                    parse_rg_task(task.split(":", 1)[1])
                except ValueError as err:
                    raise ConfigError(f"anchor.tasks: {err}") from None


def anchor_plan(cfg: AnchorConfig) -> list[tuple[str, int]]:
    """(task, item seed) of each anchor question: the tasks in turn, each at its next seed."""
    return [(cfg.tasks[i % len(cfg.tasks)], ANCHOR_SEED_BASE + i // len(cfg.tasks)) for i in range(cfg.prompts)]


def is_answer(reply: str) -> bool:
    """A closed \\boxed{} holding something other than the placeholder (dots, an ellipsis, nothing)."""
    content = extract_boxed(reply, first=True)
    return content is not None and not _PLACEHOLDER.fullmatch(content)


def make_anchor_samples(cfg: AnchorConfig, play, key: jax.Array) -> tuple[list[Sample], int]:
    """(the starting policy's replies to `cfg`'s questions as anchor samples, replies written). A reply
    with no token of its own is left out, and with `keep: answers` one that answers nothing (`is_answer`).
    `play(envs, seeds, key)` plays one-turn episodes the way the run plays its games and returns their
    trajectories."""
    plan = anchor_plan(cfg)
    envs = [EvalEpisode(make_eval_env(task), 1) for task, _ in plan]
    trajectories = play(envs, [seed for _, seed in plan], key)
    samples = [
        _anchor_sample(t.tokens, t.loss_mask)
        for t in trajectories
        if t.trainable and (cfg.keep == "all" or (t.actions and is_answer(t.actions[0])))
    ]
    return samples, len(trajectories)


def samples_to_state(samples: list[Sample]) -> list[dict]:
    """The anchor samples as plain data for the trainer state (tokens and loss mask)."""
    return [{"tokens": list(map(int, s.tokens)), "loss_mask": list(map(int, s.loss_mask))} for s in samples]


def samples_from_state(state: list[dict]) -> list[Sample]:
    return [_anchor_sample(s["tokens"], s["loss_mask"]) for s in state]


def _anchor_sample(tokens, loss_mask) -> Sample:
    """An anchor row: no advantage, and no behaviour logprobs (the likelihood term reads none)."""
    return Sample(list(tokens), list(loss_mask), [0.0] * len(tokens), 0.0, ANCHOR)


def anchor_batch(samples: list[Sample], per_update: int, update: int) -> list[Sample]:
    """The `per_update` anchor samples of update number `update`: the kept samples in turn, wrapping."""
    if not samples:
        return []
    start = update * per_update
    return [samples[i % len(samples)] for i in np.arange(start, start + min(per_update, len(samples)))]
