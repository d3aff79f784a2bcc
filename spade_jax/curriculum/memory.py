"""Environment memory: the last N designed environments with their regret, win rate and skill.
Samples SPADE's high-regret positives and too-easy/too-hard negatives; saves as plain JSON data."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable

import numpy as np


@dataclasses.dataclass
class EnvRecord:
    """One designed environment as the curriculum remembers it."""

    env_id: str  # unique id (also the file name stem in the run's envs/ archive)
    source: str  # the program text, or a path to it when sources are kept on disk
    skill: str  # the skill the designer was asked for
    regret: float = float("nan")  # hint regret r_hint - r_nohint (NaN until measured)
    win_rate: float = float("nan")  # agent's mean win rate over the window (NaN until measured)
    valid: bool = True  # the program passed validation
    iteration: int = 0  # rollout step at which it was designed
    score: float = float("nan")  # designer score it earned (for logs and PLR)

    @property
    def measured(self) -> bool:
        return not (np.isnan(self.regret) or np.isnan(self.win_rate))

    def to_dict(self) -> dict[str, Any]:
        # NaN is not JSON: store None.
        return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EnvRecord":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(
                f"environment memory record has unknown keys {sorted(unknown)}; was it saved by another version?"
            )
        clean = {
            k: (float("nan") if v is None and k in ("regret", "win_rate", "score") else v) for k, v in data.items()
        }
        return cls(**clean)


class EnvMemory:
    """First-in-first-out store of at most `capacity` environment records (SPADE: 200).

    Sampling follows the reference (spade-rl/spade, spare/core/env_memory.py): positives are records
    of the requested skill with win rate in [positive_low, positive_high], drawn at random from the
    top max(3n, 10) by regret; negatives are records of that skill with win rate above negative_easy
    or below negative_hard."""

    def __init__(
        self,
        capacity: int = 200,
        positive_low: float = 0.15,
        positive_high: float = 0.85,
        negative_easy: float = 0.9,
        negative_hard: float = 0.1,
        positive_pool: int | None = None,
    ):
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        if positive_pool is not None and positive_pool < 1:
            raise ValueError(f"memory positive_pool must be >= 1 or None, got {positive_pool}")
        self.capacity = capacity
        self.positive_low = positive_low
        self.positive_high = positive_high
        self.negative_easy = negative_easy
        self.negative_hard = negative_hard
        self.positive_pool = positive_pool  # None: SPADE's rule, the top max(3n, 10) for n positives
        self._records: collections.OrderedDict[str, EnvRecord] = collections.OrderedDict()

    @classmethod
    def from_config(cls, cfg) -> "EnvMemory":
        return cls(cfg.memory_size, cfg.positive_low, cfg.positive_high, cfg.negative_easy, cfg.negative_hard,
                   cfg.positive_pool)

    # -- contents ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, env_id: str) -> bool:
        return env_id in self._records

    def __getitem__(self, env_id: str) -> EnvRecord:
        return self._records[env_id]

    @property
    def records(self) -> list[EnvRecord]:
        """Oldest first."""
        return list(self._records.values())

    def add(self, record: EnvRecord) -> EnvRecord | None:
        """Store a record (replacing one with the same id in place); returns the evicted record, if any."""
        if record.env_id in self._records:
            self._records[record.env_id] = record
            return None
        self._records[record.env_id] = record
        if len(self._records) > self.capacity:
            _, evicted = self._records.popitem(last=False)
            return evicted
        return None

    def update(self, env_id: str, **fields: Any) -> EnvRecord:
        """Fill in what the delayed window measured (regret, win_rate, score, ...). Age is unchanged."""
        if env_id not in self._records:
            raise KeyError(f"environment {env_id!r} is not in memory (evicted or never added)")
        record = self._records[env_id]
        for name, value in fields.items():
            if not hasattr(record, name):
                raise ValueError(f"EnvRecord has no field {name!r}")
            setattr(record, name, value)
        return record

    # -- sampling (SPADE step 3) ------------------------------------------------------------

    def positive_candidates(self, skill: str | None = None) -> list[EnvRecord]:
        """Valid, measured records with win rate in [low, high] (of `skill` when given), highest
        regret first (stable by age)."""
        pool = [
            r for r in self._records.values()
            if r.valid and r.measured and self.positive_low <= r.win_rate <= self.positive_high
            and (skill is None or r.skill == skill)
        ]
        return sorted(pool, key=lambda r: -r.regret)

    def negative_candidates(self, skill: str | None = None) -> list[EnvRecord]:
        """Valid, measured records (of `skill` when given) the agent found too easy (w > easy) or too
        hard (w < hard), oldest first."""
        return [
            r for r in self._records.values()
            if r.valid and r.measured and (r.win_rate > self.negative_easy or r.win_rate < self.negative_hard)
            and (skill is None or r.skill == skill)
        ]

    def pool_size(self, n: int) -> int:
        """How many top-regret candidates n positives are drawn from: `positive_pool`, or SPADE's
        max(3n, 10) when it is None."""
        return max(3 * n, 10) if self.positive_pool is None else max(self.positive_pool, n)

    def sample_positives(self, rng: np.random.Generator, n: int = 2, skill: str | None = None) -> list[EnvRecord]:
        """n records of `skill` (any skill when None) drawn without replacement from the top
        `pool_size(n)` positive candidates by regret; fewer when there are fewer. Highest regret first.
        Like SPADE, no other skill fills in: the examples must show the skill being asked for."""
        pool = self.positive_candidates(skill)[: self.pool_size(n)]
        take = min(n, len(pool))
        if take <= 0:
            return []
        return [pool[i] for i in sorted(rng.choice(len(pool), size=take, replace=False))]

    def sample_negatives(self, rng: np.random.Generator, n: int = 1, skill: str | None = None) -> list[EnvRecord]:
        """n records of `skill` (any skill when None) drawn uniformly from the too-easy and too-hard ones."""
        pool = self.negative_candidates(skill)
        take = min(n, len(pool))
        if take <= 0:
            return []
        return [pool[i] for i in sorted(rng.choice(len(pool), size=take, replace=False))]

    def sample_for_designer(
        self, rng: np.random.Generator, positives: int = 2, negatives: int = 1, skill: str | None = None
    ) -> tuple[list[EnvRecord], list[EnvRecord]]:
        """SPADE's designer context for one prompt: (high-regret positives, too-easy/too-hard
        negatives), both of `skill` when given."""
        return self.sample_positives(rng, positives, skill), self.sample_negatives(rng, negatives, skill)

    # -- checkpointing ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (orbax can save it as a JSON item)."""
        return {
            "capacity": self.capacity,
            "positive_low": self.positive_low,
            "positive_high": self.positive_high,
            "negative_easy": self.negative_easy,
            "negative_hard": self.negative_hard,
            "positive_pool": self.positive_pool,
            "records": [r.to_dict() for r in self._records.values()],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "EnvMemory":
        memory = cls(state["capacity"], state["positive_low"], state["positive_high"], state["negative_easy"],
                     state["negative_hard"], state["positive_pool"])
        memory.extend(EnvRecord.from_dict(r) for r in state["records"])
        return memory

    def extend(self, records: Iterable[EnvRecord]) -> None:
        for record in records:
            self.add(record)
