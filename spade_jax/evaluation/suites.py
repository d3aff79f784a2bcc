"""The held-out suites: which GEM games and reasoning-gym tasks are scored, at which seeds and turn
caps; `SUITES` holds them by name (`heldout`, `quick` for a smoke test, `small` for small models)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

# Default first episode seed: far from the small seeds training and tests use.
HELDOUT_SEED_BASE = 900_000


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """One held-out environment and how to play it."""

    # "game:<GEM id>" (GEM game), "rg:<name>" or "rg:<name>(field=value,...)" (a reasoning-gym dataset, at its
    # default difficulty or at the config given) or "lib:<name>(CONST=value,...)"
    # (a training library program: the `train` suite, never held out)
    env_id: str
    episodes: int  # episodes scored, one per seed
    max_turns: int  # turn cap of one episode (reasoning-gym tasks are single-turn: 1)
    seeds: tuple[int, ...] = ()  # episode seeds; empty means HELDOUT_SEED_BASE + 0..episodes-1

    def __post_init__(self):
        if not re.fullmatch(r"game:[A-Za-z0-9_.\-]+|(rg|lib):[A-Za-z0-9_]+(\([^()]*\))?", self.env_id):
            raise ValueError(
                f"eval env id {self.env_id!r} must look like 'game:TowerofHanoi-v0-easy', "
                "'rg:countdown', 'rg:chain_sum(max_terms=2)' or 'lib:odd_one_out(ROUNDS=2,CHOICES=3)'"
            )
        if self.episodes < 1:
            raise ValueError(f"{self.env_id}: episodes must be >= 1, got {self.episodes}")
        if self.max_turns < 1:
            raise ValueError(f"{self.env_id}: max_turns must be >= 1, got {self.max_turns}")
        if self.seeds and len(self.seeds) != self.episodes:
            raise ValueError(
                f"{self.env_id}: {len(self.seeds)} seeds for {self.episodes} episodes; "
                "give one seed per episode or none"
            )
        if any(s < 0 for s in self.seeds):
            raise ValueError(f"{self.env_id}: seeds must be >= 0 (GEM rejects negative seeds)")

    @property
    def episode_seeds(self) -> tuple[int, ...]:
        return self.seeds or tuple(range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + self.episodes))

    @property
    def kind(self) -> str:
        return self.env_id.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class EvalSuite:
    """A named, frozen list of tasks."""

    name: str  # printed in reports
    tasks: tuple[EvalTask, ...]  # scored in this order; env ids must be unique

    def __post_init__(self):
        if not self.tasks:
            raise ValueError(f"suite {self.name!r} has no tasks")
        ids = [t.env_id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise ValueError(f"suite {self.name!r} lists an env id twice: {ids}")

    def only(self, env_ids: Sequence[str]) -> EvalSuite:
        """The tasks named in `env_ids`, in suite order."""
        known = [t.env_id for t in self.tasks]
        unknown = [e for e in env_ids if e not in known]
        if unknown:
            raise ValueError(f"suite {self.name!r} has no task {unknown[0]!r}; tasks: {', '.join(known)}")
        return EvalSuite(self.name, tuple(t for t in self.tasks if t.env_id in env_ids))

    def with_episodes(self, episodes: int) -> EvalSuite:
        """The same tasks with `episodes` default seeds each (explicit seeds are dropped)."""
        return EvalSuite(
            f"{self.name}@{episodes}",
            tuple(dataclasses.replace(t, episodes=episodes, seeds=()) for t in self.tasks),
        )


# (env id, turn cap): GEM games work offline with gem-llm 0.1.0 and reset in < 20 ms;
# the caps are the games' own turn limits, so the game (not us) decides when time is up.
_GAMES = (
    ("game:GuessTheNumber-v0-hard", 7),
    ("game:Minesweeper-v0-easy", 25),
    ("game:Sudoku-v0-easy", 15),
    ("game:TowerofHanoi-v0-easy", 10),
    ("game:Sokoban-v0-easy", 20),
)
# reasoning-gym generators with reproducible per-seed items and sound scorers (see FACTS.md).
# No task may be a puzzle family of the training library (spade_jax/envs/library): knights_knaves
# and maze were (KnightsKnavesEnv, GridMazeEnv), so zebra_puzzles (logic) and largest_island
# (grid search) replaced them; tests/evaluation/test_duplicates.py checks every suite task with family_score.
_REASONING = ("rg:zebra_puzzles", "rg:largest_island", "rg:arc_1d", "rg:countdown")


def _suite(name: str, episodes: int) -> EvalSuite:
    tasks = [EvalTask(env_id, episodes, turns) for env_id, turns in _GAMES]
    tasks += [EvalTask(env_id, episodes, 1) for env_id in _REASONING]
    return EvalSuite(name, tuple(tasks))


# For small models (the embedded SmolLM2-135M in its default answer format: the agent's system line,
# replies forced to open with \\boxed{): the one-turn reasoning-gym tasks, some at an easy config, whose
# base success fell inside [10%, 60%] when screened on seeds outside the suite's (`python -m
# experiments.screen`; docs/evaluation.md has the screens and the base model's row), so that a gain and
# a loss can both show. None is a family of the training library or an anchor task. Four are yes/no
# judgements; two ask for a number (the larger or smaller of two, the swaps that make a bit string alternate), which
# a model that answers one constant cannot pass.
_SMALL = (
    "rg:ransom_note", "rg:course_schedule", "rg:syllogism",
    "rg:number_format(min_num_candidates=2, max_num_candidates=2, min_n=10, max_n=99)",
    "rg:isomorphic_strings(min_string_length=2, max_string_length=3)",
    "rg:binary_alternation(min_n=2, max_n=4)",
)

SUITES: dict[str, EvalSuite] = {
    # 50 episodes per task: a Wilson interval of at most +-13.5 points per task.
    "heldout": _suite("heldout", 50),
    # Same tasks, 5 episodes each: a smoke test of the whole path in minutes.
    "quick": _suite("quick", 5),
    # 60 episodes per task, one turn each: about a minute on 2 cores for the embedded model.
    "small": EvalSuite("small", tuple(EvalTask(env_id, 60, 1) for env_id in _SMALL)),
}


# Episodes per game of the `train` suite: its seeds are HELDOUT_SEED_BASE + 0..29, instances the run
# almost surely never played (training seeds are drawn from 0..2**31).
TRAIN_EPISODES = 30
TRAIN = "train"  # the suite of a run's own library games (experiments.eval --suite train)


def train_suite(env_pool: str, max_turns: int, episodes: int | None = None) -> EvalSuite:
    """A `library:` pool's games at fixed seeds: how well an agent plays what it trains on, measured
    greedily on the same instances before and after training (not a held-out suite)."""
    from spade_jax.envs.library import LIBRARY_POOL, parse_library_pool

    if not env_pool.startswith(LIBRARY_POOL):
        raise ValueError(f"the train suite needs a 'library:...' pool, got {env_pool!r}")
    tasks = []
    for entry in parse_library_pool(env_pool):
        entry.source()  # the program exists and takes its constants
        constants = ",".join(f"{k}={v!r}" for k, v in entry.constants)
        env_id = f"lib:{entry.name}({constants})" if constants else f"lib:{entry.name}"
        tasks.append(EvalTask(env_id, episodes or TRAIN_EPISODES, max_turns))
    return EvalSuite(TRAIN, tuple(tasks))


def get_suite(name: str, episodes: int | None = None) -> EvalSuite:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    suite = SUITES[name]
    return suite.with_episodes(episodes) if episodes is not None else suite
