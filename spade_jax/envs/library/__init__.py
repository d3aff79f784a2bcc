"""Hand-written environment programs: the designer's few-shot examples and the fixed-pool baseline's pool.
Each program is one standalone file (standard library only) defining one `...Env` class; this module indexes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

SKILLS = (
    "mathematical reasoning",
    "logical deduction",
    "spatial reasoning",
    "pattern recognition",
    "optimization",
    "causal inference",
)

# (file stem, skill, class name); two programs per skill, in SKILLS order.
_INDEX = (
    ("target_number", "mathematical reasoning", "TargetNumberEnv"),
    ("modular_lock", "mathematical reasoning", "ModularLockEnv"),
    ("code_breaker", "logical deduction", "CodeBreakerEnv"),
    ("knights_knaves", "logical deduction", "KnightsKnavesEnv"),
    ("grid_maze", "spatial reasoning", "GridMazeEnv"),
    ("sliding_puzzle", "spatial reasoning", "SlidingPuzzleEnv"),
    ("sequence_rule", "pattern recognition", "SequenceRuleEnv"),
    ("odd_one_out", "pattern recognition", "OddOneOutEnv"),
    ("knapsack", "optimization", "KnapsackEnv"),
    ("delivery_route", "optimization", "DeliveryRouteEnv"),
    ("switch_lights", "causal inference", "SwitchLightsEnv"),
    ("causal_chain", "causal inference", "CausalChainEnv"),
)


@dataclasses.dataclass(frozen=True)
class LibraryProgram:
    """One hand-written environment program of the library."""

    name: str  # file stem, e.g. "grid_maze"; also the key for load_library_env
    skill: str  # one of SKILLS
    path: Path  # the program file
    class_name: str  # the environment class the program defines

    def __post_init__(self):
        if self.skill not in SKILLS:
            raise ValueError(f"unknown skill {self.skill!r}; use one of {', '.join(SKILLS)}")

    @property
    def source(self) -> str:
        """The program's text, as the designer and the validator see it."""
        return self.path.read_text(encoding="utf-8")


def library_dir() -> Path:
    """The folder holding the library's program files."""
    return Path(__file__).resolve().parent


def library_programs(skill: str | None = None) -> list[LibraryProgram]:
    """Every library program in a fixed order, or only those of one skill."""
    if skill is not None and skill not in SKILLS:
        raise ValueError(f"unknown skill {skill!r}; use one of {', '.join(SKILLS)}")
    return [
        LibraryProgram(name=name, skill=program_skill, path=library_dir() / f"{name}.py", class_name=class_name)
        for name, program_skill, class_name in _INDEX
        if skill is None or program_skill == skill
    ]


def library_program(name: str) -> LibraryProgram:
    """The library program called `name` (its file stem)."""
    for program in library_programs():
        if program.name == name:
            return program
    names = ", ".join(program.name for program in library_programs())
    raise ValueError(f"no library environment named {name!r}; choose one of {names}")


LIBRARY_POOL = "library:"  # env_pool prefix naming library programs, e.g. "library:knapsack,grid_maze"


def library_pool_names(env_pool: str) -> list[str]:
    """The program names of a `library:a,b` pool spec (not checked here: see library_program)."""
    names = [name.strip() for name in env_pool[len(LIBRARY_POOL):].split(",") if name.strip()]
    if not names:
        raise ValueError(f"{env_pool!r} names no library program; write e.g. 'library:knapsack,grid_maze'")
    return names


def load_library_env(name: str):
    """Executes the program in-process (trusted code) and returns a fresh, un-reset instance of its class."""
    program = library_program(name)
    namespace: dict = {"__name__": f"spade_library_{program.name}"}
    exec(compile(program.source, str(program.path), "exec"), namespace)
    return namespace[program.class_name]()
