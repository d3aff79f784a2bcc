"""Curriculum: which environments the designer is rewarded for, what it is shown, and what is replayed.
Holds the curriculum config and skill schedule; scores, memory, PLR buffer and corpus live in submodules."""

from __future__ import annotations

import dataclasses

from spade_jax.curriculum.corpus import CorpusConfig, Document, GroundingCorpus, embedded_corpus, load_corpus
from spade_jax.curriculum.memory import EnvMemory, EnvRecord
from spade_jax.curriculum.plr import PLRState
from spade_jax.curriculum.scores import (
    DESIGNER_SCORES,
    ScoreInputs,
    designer_advantages,
    designer_scale,
    designer_scores,
    hint_regret,
    learnability,
    learning_potential,
    paired_regret,
    plateau,
    plateau_input,
    solve_rate_band,
    spade_blend,
)

# SPADE's six skills; each regeneration covers `skills_per_regen` of them, round-robin.
SKILLS: tuple[str, ...] = (
    "mathematical reasoning",
    "logical deduction",
    "spatial reasoning",
    "pattern recognition",
    "optimization",
    "causal inference",
)


def skills_for_regeneration(regen_index: int, per_regen: int = 3, skills: tuple[str, ...] = SKILLS) -> list[str]:
    """The skills regeneration number `regen_index` covers: consecutive blocks of the list, wrapping."""
    if not 0 < per_regen <= len(skills):
        raise ValueError(f"per_regen must be in [1, {len(skills)}], got {per_regen}")
    start = regen_index * per_regen
    return [skills[(start + j) % len(skills)] for j in range(per_regen)]


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    # designer score: spade_blend | hint_regret | solve_rate | learning_potential | learnability | paired
    score: str = "spade_blend"
    band_low: float = 0.4  # win rate where the plateau starts (score 1 inside [low, high])
    band_high: float = 0.6  # win rate where the plateau ends
    band_ramp: float = 0.25  # width of the linear fall to 0 on each side of the plateau
    regret_scale: float = 0.15  # regret that counts as full marks: clip(regret / scale, 0, 1)
    regret_weight: float = 0.4  # weight of the normalised regret in the blend
    band_weight: float = 0.6  # weight of the plateau in the blend
    lp_fast_rate: float = 0.5  # learning potential: step of the fast win-rate EMA
    lp_slow_rate: float = 0.1  # learning potential: step of the slow win-rate EMA
    hung_penalty: float = -0.5  # designer score of an environment whose step() hung (pure-regret variant)
    # SPADE: invalid designs are never trained; True: they score 0, are trained and join their skill's mean
    train_invalid_designs: bool = False
    # the plateau's w: mean_reward (SPADE: mean raw episode reward over the window, failed plays -1)
    # or win_rate (share of plays won)
    plateau_input: str = "mean_reward"
    max_designer_scale: float = 50.0  # cap on min(agent / designer samples * regen_interval, cap)
    skills_per_regen: int = 3  # skills covered by one regeneration, round-robin over SKILLS
    memory_size: int = 200  # environment memory capacity; the oldest record is evicted
    positives: int = 2  # high-regret past environments shown to the designer
    negatives: int = 1  # too-easy or too-hard past environments shown to the designer
    positive_low: float = 0.15  # positives need an agent win rate of at least this
    positive_high: float = 0.85  # ... and at most this
    negative_easy: float = 0.9  # a negative is too easy above this win rate
    negative_hard: float = 0.1  # ... or too hard below this one
    # positives are drawn at random from this many top-regret candidates (None: SPADE's max(3n, 10))
    positive_pool: int | None = None
    plr: bool = False  # replay high-regret environments to the agent from a PLR buffer (beyond SPADE)
    plr_capacity: int = 256  # PLR buffer slots
    plr_temperature: float = 0.3  # beta in rank^(-1/beta): lower is greedier
    plr_staleness: float = 0.3  # rho: weight of the staleness distribution in the replay mix
    plr_replay_prob: float = 0.5  # chance a pool slot is a replayed environment once the buffer is filled
    plr_min_fill: float = 0.1  # fraction of the buffer that must be filled before any replay
    plr_score: str = "hint_regret"  # registry score that ranks environments in the PLR buffer

    def __post_init__(self):
        if self.score not in DESIGNER_SCORES:
            raise ValueError(f"curriculum.score={self.score!r} is unknown; choose one of {sorted(DESIGNER_SCORES)}")
        if self.plr_score not in DESIGNER_SCORES:
            raise ValueError(
                f"curriculum.plr_score={self.plr_score!r} is unknown; choose one of {sorted(DESIGNER_SCORES)}"
            )
        if not 0.0 <= self.band_low <= self.band_high <= 1.0:
            raise ValueError("curriculum.band_low and band_high must satisfy 0 <= low <= high <= 1")
        if self.band_ramp < 0 or self.regret_scale <= 0:
            raise ValueError("curriculum.band_ramp must be >= 0 and curriculum.regret_scale > 0")
        if not (0 < self.lp_slow_rate <= 1 and 0 < self.lp_fast_rate <= 1):
            raise ValueError("curriculum.lp_fast_rate and lp_slow_rate must be in (0, 1]")
        if self.memory_size < 1 or self.positives < 0 or self.negatives < 0:
            raise ValueError("curriculum.memory_size must be >= 1 and positives/negatives >= 0")
        if self.max_designer_scale <= 0:
            raise ValueError("curriculum.max_designer_scale must be > 0")
        if self.plateau_input not in ("mean_reward", "win_rate"):
            raise ValueError(f"curriculum.plateau_input={self.plateau_input!r}: choose mean_reward or win_rate")
        if not 0 < self.skills_per_regen <= len(SKILLS):
            raise ValueError(f"curriculum.skills_per_regen must be in [1, {len(SKILLS)}]")
        if not all(0.0 <= p <= 1.0 for p in (self.plr_staleness, self.plr_replay_prob, self.plr_min_fill)):
            raise ValueError("curriculum.plr_staleness, plr_replay_prob and plr_min_fill must be in [0, 1]")
        if self.plr_temperature <= 0 or self.plr_capacity < 1:
            raise ValueError("curriculum.plr_temperature must be > 0 and plr_capacity >= 1")
        for name in ("band_ramp", "regret_scale", "regret_weight", "band_weight", "max_designer_scale",
                     "plr_temperature"):
            if not abs(getattr(self, name)) < float("inf"):  # NaN fails too
                raise ValueError(f"curriculum.{name} must be a finite number, got {getattr(self, name)}")
        if self.regret_weight < 0 or self.band_weight < 0:
            raise ValueError(f"curriculum.regret_weight and band_weight must be >= 0, got {self.regret_weight}, "
                             f"{self.band_weight}")
        if not -1.0 <= self.hung_penalty <= 0.0:
            raise ValueError(f"curriculum.hung_penalty must be in [-1, 0] (a penalty), got {self.hung_penalty}")
        if not 0.0 <= self.positive_low <= self.positive_high <= 1.0:
            raise ValueError("curriculum.positive_low and positive_high must satisfy 0 <= low <= high <= 1")
        if not 0.0 <= self.negative_hard <= self.negative_easy <= 1.0:
            raise ValueError("curriculum.negative_hard and negative_easy must satisfy 0 <= hard <= easy <= 1")
        if self.positive_pool is not None and self.positive_pool < 1:
            raise ValueError(f"curriculum.positive_pool must be >= 1, got {self.positive_pool}")


__all__ = [
    "SKILLS", "skills_for_regeneration", "CurriculumConfig", "CorpusConfig", "Document", "GroundingCorpus",
    "embedded_corpus", "load_corpus", "EnvMemory", "EnvRecord", "PLRState", "DESIGNER_SCORES", "ScoreInputs",
    "designer_advantages", "designer_scale", "designer_scores", "hint_regret", "learnability",
    "learning_potential", "paired_regret", "plateau", "plateau_input", "solve_rate_band", "spade_blend",
]
