"""Hand-written environment programs: the designer's few-shot examples and the fixed-pool baseline's pool, for
games (this folder) and tool use (tool_use/). Each program is one file (standard library only) defining one
`...Env` class (a tool-use one extends the runtime's ToolEnv); this module indexes them by domain."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

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


@dataclasses.dataclass(frozen=True)
class PoolEntry:
    """One program of a `library:` pool, with the constants it is played at (none: its defaults)."""

    name: str
    constants: tuple[tuple[str, Any], ...] = ()

    @property
    def env_id(self) -> str:
        """`lib-<name>`, and `-NAME=value` per set constant (file- and metric-name safe)."""
        parts = [f"lib-{self.name}"] + [f"{k}={v!r}" for k, v in self.constants]
        return re.sub(r"[^A-Za-z0-9_.=,-]+", "", "-".join(parts))

    def source(self) -> str:
        """The program's text with the entry's constants written in (ValueError when one does not fit)."""
        from spade_jax.envs.constants import set_constants

        source = library_program(self.name).source
        if not self.constants:
            return source
        try:
            return set_constants(source, dict(self.constants))
        except ValueError as err:
            raise ValueError(f"library program {self.name}: {err}") from None


def parse_library_pool(env_pool: str) -> list[PoolEntry]:
    """The entries of a `library:a,b(NAME=value, ...)` pool spec: program names, each optionally with
    tunable constants set to Python literals (an easier or harder variant of the program). Names and
    constants are not checked here: see PoolEntry.source."""
    spec = env_pool[len(LIBRARY_POOL):].strip()
    usage = "write e.g. 'library:knapsack,knights_knaves(PEOPLE=3, QUESTIONS=2)'"
    if not spec.strip(" ,"):
        raise ValueError(f"{env_pool!r} names no library program; {usage}")
    try:
        items = ast.parse(f"({spec},)", mode="eval").body.elts
    except (SyntaxError, ValueError):
        raise ValueError(f"{env_pool!r} does not parse; {usage}") from None
    entries = []
    for item in items:
        if isinstance(item, ast.Name):
            entries.append(PoolEntry(item.id))
            continue
        if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and not item.args
                and all(k.arg for k in item.keywords)):
            raise ValueError(f"{env_pool!r}: {ast.unparse(item)!r} is not name or name(CONSTANT=value, ...); {usage}")
        constants = []
        for keyword in item.keywords:
            try:
                constants.append((keyword.arg, ast.literal_eval(keyword.value)))
            except (ValueError, TypeError, SyntaxError):
                raise ValueError(f"{env_pool!r}: {keyword.arg}={ast.unparse(keyword.value)} is not a Python "
                                 "literal") from None
        entries.append(PoolEntry(item.func.id, tuple(constants)))
    return entries


def load_library_env(name: str, source: str | None = None):
    """Executes the program in-process (trusted code; a tool-use one on the ToolEnv runtime) and returns a
    fresh, un-reset instance of its class. `source`: its text with other constants (`PoolEntry.source`)."""
    program = library_program(name)
    source = program.source if source is None else source
    if program.domain == "tool_use":
        from spade_jax.envs.tool_use import load_in_process

        return load_in_process(source, program.class_name, f"spade_library_{program.name}")()
    namespace: dict = {"__name__": f"spade_library_{program.name}"}
    exec(compile(source, str(program.path), "exec"), namespace)
    return namespace[program.class_name]()
