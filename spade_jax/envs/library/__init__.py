"""Hand-written environment programs: the designer's few-shot examples and the fixed-pool baseline's pool, for
games (this folder) and tool use (tool_use/). Each program is one file (standard library only) defining one
`...Env` class (a tool-use one extends the runtime's ToolEnv); this module indexes them by domain."""

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

# SPADE's tool-use skills (the reference's --spade-skills for --spade-game-type tool_use).
TOOL_USE_SKILLS = (
    "API orchestration",
    "data retrieval",
    "state modification",
    "error recovery",
    "tool selection",
    "multi-step workflows",
)

# Each domain's skills; a run's `domain` picks one.
DOMAIN_SKILLS = {"games": SKILLS, "tool_use": TOOL_USE_SKILLS}

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

# The tool-use programs, in tool_use/: two per skill, in TOOL_USE_SKILLS order.
_TOOL_USE_INDEX = (
    ("travel_booking", "API orchestration", "TravelBookingEnv"),
    ("invoice_payment", "API orchestration", "InvoicePaymentEnv"),
    ("employee_directory", "data retrieval", "EmployeeDirectoryEnv"),
    ("weather_stations", "data retrieval", "WeatherStationsEnv"),
    ("inventory_update", "state modification", "InventoryUpdateEnv"),
    ("calendar_reschedule", "state modification", "CalendarRescheduleEnv"),
    ("flaky_payment", "error recovery", "FlakyPaymentEnv"),
    ("archived_records", "error recovery", "ArchivedRecordsEnv"),
    ("shop_assistant", "tool selection", "ShopAssistantEnv"),
    ("library_desk", "tool selection", "LibraryDeskEnv"),
    ("support_refund", "multi-step workflows", "SupportRefundEnv"),
    ("employee_onboarding", "multi-step workflows", "EmployeeOnboardingEnv"),
)
_INDEXES = {"games": ("", _INDEX), "tool_use": ("tool_use", _TOOL_USE_INDEX)}


def _check_domain(domain: str) -> None:
    if domain not in DOMAIN_SKILLS:
        raise ValueError(f"unknown domain {domain!r}; use one of {', '.join(DOMAIN_SKILLS)}")


@dataclasses.dataclass(frozen=True)
class LibraryProgram:
    """One hand-written environment program of the library."""

    name: str  # file stem, e.g. "grid_maze"; also the key for load_library_env
    skill: str  # one of the domain's skills (SKILLS or TOOL_USE_SKILLS)
    path: Path  # the program file
    class_name: str  # the environment class the program defines
    domain: str = "games"  # games or tool_use

    def __post_init__(self):
        _check_domain(self.domain)
        skills = DOMAIN_SKILLS[self.domain]
        if self.skill not in skills:
            raise ValueError(f"unknown skill {self.skill!r}; use one of {', '.join(skills)}")

    @property
    def source(self) -> str:
        """The program's text, as the designer and the validator see it."""
        return self.path.read_text(encoding="utf-8")


def library_dir() -> Path:
    """The folder holding the library's program files."""
    return Path(__file__).resolve().parent


def library_programs(skill: str | None = None, domain: str = "games") -> list[LibraryProgram]:
    """Every library program of a domain in a fixed order, or only those of one skill."""
    _check_domain(domain)
    if skill is not None and skill not in DOMAIN_SKILLS[domain]:
        raise ValueError(f"unknown skill {skill!r}; use one of {', '.join(DOMAIN_SKILLS[domain])}")
    folder, index = _INDEXES[domain]
    return [
        LibraryProgram(name=name, skill=program_skill, path=library_dir() / folder / f"{name}.py",
                       class_name=class_name, domain=domain)
        for name, program_skill, class_name in index
        if skill is None or program_skill == skill
    ]


def library_program(name: str) -> LibraryProgram:
    """The library program called `name` (its file stem), of any domain."""
    programs = [p for domain in DOMAIN_SKILLS for p in library_programs(domain=domain)]
    for program in programs:
        if program.name == name:
            return program
    names = ", ".join(program.name for program in programs)
    raise ValueError(f"no library environment named {name!r}; choose one of {names}")


LIBRARY_POOL = "library:"  # env_pool prefix naming library programs, e.g. "library:knapsack,grid_maze"


def library_pool_names(env_pool: str) -> list[str]:
    """The program names of a `library:a,b` pool spec (not checked here: see library_program)."""
    names = [name.strip() for name in env_pool[len(LIBRARY_POOL):].split(",") if name.strip()]
    if not names:
        raise ValueError(f"{env_pool!r} names no library program; write e.g. 'library:knapsack,grid_maze'")
    return names


def load_library_env(name: str):
    """Executes the program in-process (trusted code; a tool-use one on the ToolEnv runtime) and returns a
    fresh, un-reset instance of its class."""
    program = library_program(name)
    if program.domain == "tool_use":
        from spade_jax.envs.tool_use import load_in_process

        return load_in_process(program.source, program.class_name, f"spade_library_{program.name}")()
    namespace: dict = {"__name__": f"spade_library_{program.name}"}
    exec(compile(program.source, str(program.path), "exec"), namespace)
    return namespace[program.class_name]()
