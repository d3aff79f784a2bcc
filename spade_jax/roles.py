"""The three roles one model plays: designer (writes, rewrites or tunes an environment), hint writer,
agent, for each domain (games; tool use, where environments extend ToolEnv). Builds each role's chat
messages within a small model's context and parses what each role writes."""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from spade_jax.curriculum.corpus import Document, truncate_text
from spade_jax.envs.api import boxed_command
from spade_jax.envs.constants import apply_tuning, constant_lines
from spade_jax.envs.program import strip_thinking
from spade_jax.rollout import AGENT_SYSTEM, with_hint  # the agent's turn format lives with the episodes

Messages = list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class RolesConfig:
    # chance a design is an edit of a past or library environment (ACCEL-style) rather than written from nothing
    edit_prob: float = 0.8
    # in edit mode, chance the base comes from memory (when it has positives) instead of the library
    edit_from_memory_prob: float = 0.5
    # share of edits that only retune the base's UPPERCASE constants (ACCEL's small edits); the rest are full rewrites
    tune_prob: float = 0.0
    # tune prompts show the whole base program, not only its docstring and constants
    # (a 135M model tunes far less reliably with it)
    tune_show_program: bool = True
    # token budget of a tune reply (a few `NAME = value` lines; capped by designer_sampling's), sampled in its own batch
    tune_max_new_tokens: int = 160
    # give an invalid program one repair turn (the repaired program feeds the agent, not the designer's reward)
    repair: bool = True
    max_hint_sentences: int = 3  # hints are cut to this many sentences
    max_prompt_chars: int = 18_000  # designer prompt budget (~5k tokens: leaves ~3k of an 8k context for the program)
    doc_max_chars: int = 6_000  # most of a grounding document shown to the designer
    doc_min_chars: int = 600  # the document is cut to no less than this, even over the prompt budget
    example_max_chars: int = 6_000  # library example or edit base; longer ones are skipped when another fits
    memory_example_max_chars: int = 2_000  # each past environment from memory is cut to this (SPADE: 2000)
    hint_source_max_chars: int = 12_000  # environment source shown to the hint writer
    library_example: bool = True  # show one library environment in write mode
    # tell the designer which Python subset the JAX backend transpiles (ours; the reference has no such line)
    jax_subset_advice: bool = True

    def __post_init__(self):
        for name in ("edit_prob", "edit_from_memory_prob", "tune_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"roles.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_hint_sentences < 1:
            raise ValueError("roles.max_hint_sentences must be >= 1")
        if self.tune_max_new_tokens < 1:
            raise ValueError(f"roles.tune_max_new_tokens must be >= 1, got {self.tune_max_new_tokens}")
        if min(self.max_prompt_chars, self.doc_max_chars, self.example_max_chars, self.memory_example_max_chars,
               self.hint_source_max_chars) < 1 or self.doc_min_chars < 0:
            raise ValueError("roles character budgets must be positive")


SKILL_DESCRIPTIONS: dict[str, str] = {
    "mathematical reasoning": "arithmetic, algebra, number theory or counting, worked out step by step",
    "logical deduction": "clues and constraints that pin down one answer",
    "spatial reasoning": "positions, grids, shapes, moves and paths",
    "pattern recognition": "a hidden rule or regularity to infer from examples and apply",
    "optimization": "the best plan, order or allocation under limits",
    "causal inference": "experiments and observations that reveal hidden causes and effects",
    # the tool-use domain's skills (spade_jax.envs.library.TOOL_USE_SKILLS)
    "API orchestration": "chaining calls whose results feed the next call's arguments and change state",
    "data retrieval": "querying tools to discover facts, then combining them into one precise answer",
    "state modification": "a sequence of state changes, each depending on the state the last one left",
    "error recovery": "tool failures whose error messages tell how to retry, correct or route around them",
    "tool selection": "choosing the right tools among many, most of them irrelevant to the task",
    "multi-step workflows": "ordered procedures whose later steps need the results of earlier ones",
}

# The environment contract: what spade_jax/envs/validate.py checks (interface, determinism, reward
# range, turn limit, solution() wins) plus what SPADE's designer prompt asks of a game (hidden state,
# partial progress rewards, robustness, self-verification, standard library, several steps).
ENV_CONTRACT = """\
An environment is ONE Python class whose name ends in `Env` that imports only the Python standard library (random, re, math, ...), with:
- reset(self, seed=None) -> (observation: str, info: dict). The same seed gives the same episode: draw all randomness from rng = random.Random(seed), never from the global random module.
- step(self, action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict). The action is the player's whole reply; read the command from its last \\boxed{...}.
- solution(self) -> list of actions (each a "\\boxed{...}" string) that wins the episode of the last reset, worked out from the hidden state.
- close(self) -> None.
Rules:
- Hidden state: reset() keeps something from the player (a secret, a rule, a layout) that it uncovers by acting. Every observation shows the current state, the result of the last action and the legal actions written as \\boxed{...}.
- Several steps: winning takes at least 3 actions; never state the whole task at once and grade one reply.
- Rewards lie in [0, 1]. The step that reaches the goal returns 1.0 with terminated=True. A loss ends the episode (terminated=True) with partial credit below 1.0 for the progress made (0.0 for none); other steps may return partial progress below 1.0. The reward of the step that ends the episode is the score. When the turn limit (at most 25 turns) runs out: reward 0.0, terminated=False, truncated=True.
- Self-verifying: step() checks every answer itself against the hidden state, and solution() wins by that same check.
- Robust to malformed actions: an action that is empty, has no \\boxed{...}, or holds an unknown or illegal command never raises; it uses up a turn, earns 0.0, and the observation says why and what is legal. Every path of step() returns the 5-tuple.
- Before you reply, trace your program: solution() from reset(seed=0) must reach the goal, and two different action sequences must lead to different observations."""  # noqa: E501 (prompt text, one line per rule)
# What the JAX backend transpiles (spade_jax.roles.RolesConfig.jax_subset_advice).
JAX_SUBSET_ADVICE = (
    "Fast subset (preferred): state in ints, bools and fixed-length lists of ints; randomness only in reset; "
    "for loops over range(...) instead of while loops; no recursion, files, network or threads."
)

DESIGNER_SYSTEM = (
    "You design text games (reinforcement-learning environments) that train a reasoning agent. "
    "A good game is solvable, needs several steps of thinking, and is neither trivial nor hopeless.\n\n"
    + ENV_CONTRACT
)


# The tool-use environment contract: what ToolEnv (spade_jax/envs/tool_use/runtime.py) expects of a subclass
# and what validation checks (declared tools served, malformed and unknown calls survived, solution() wins),
# plus what SPADE's tool-use designer prompt asks (simulated stateful tools, hidden information, several
# dependent calls, distractor tools, exact arguments, self-verification).
TOOL_ENV_CONTRACT = """\
A tool-use environment is ONE Python class whose name ends in `Env` and that extends ToolEnv. ToolEnv is already defined: do not define or import it. Import only the Python standard library. ToolEnv already implements reset(seed), step(reply), the <tool_call>{"name": ..., "arguments": {...}}</tool_call> protocol, argument checking against your schemas, the <answer>...</answer> ending and the reward: never write reset or step yourself. You write:
- TOOLS = [{"name": ..., "description": ..., "parameters": {"type": "object", "properties": {ARG: {"type": "string"|"integer"|"number"|"boolean"|"array"|"object"}}, "required": [...]}}, ...]: 3 to 8 tools, including 1 or 2 the task does not need (do not label them unused).
- setup(self, rng) -> str: build all simulated data and state from rng (a random.Random(seed); never the global random module) and return the task: what to achieve and the answer format, not the facts the tools reveal.
- One method tool_NAME(self, ARG, ...) per tool, with exactly the parameter names declared in TOOLS. It reads or changes the hidden state and returns a str or JSON-able value; on a bad id, a wrong precondition or any other failure it raises ToolError("what went wrong and what to do"). Tools use no randomness.
- subgoals(self) -> list of bools read from the hidden state: every required state change and, when the task asks for a value, self.answer_matches(expected); none holds before the agent acts, and a constraint ("change nothing else") is and-ed into the goals it guards. The episode's reward is their share met when the agent answers (1.0 when all are met).
- solution(self) -> list of replies that wins the episode of the last reset: each reply is one or more self.call("NAME", ARG=value, ...) joined together, and the last is self.final(answer) (self.final("done") when the task asks for no value).
- MAX_TURNS = N (at most 25): the number of replies allowed; the task must be solvable in MAX_TURNS - 2 replies.
Rules:
- Hidden information: the agent learns the facts only from tool results, and no single tool reveals enough: it must combine at least two tools and make at least 3 dependent calls, later calls using what earlier ones returned or changed.
- Stateful: offer query tools and mutation tools; a mutation with a wrong precondition raises ToolError instead of silently succeeding.
- Exact: arguments and answers are checked exactly (answer_matches ignores case, spacing and number formatting); the answer is computed from the data, never written as a constant.
- Self-contained: tools are simulated in Python; no files, network, subprocesses or real APIs; never mention a source document.
- Before you reply, trace your program: from setup with seed 0, solution()'s calls must all succeed and meet every subgoal."""  # noqa: E501 (prompt text, one line per rule)

TOOL_DESIGNER_SYSTEM = (
    "You design tool-use tasks (reinforcement-learning environments) that train an agent to call tools. "
    "A good task is solvable, needs several dependent tool calls, and is neither trivial nor hopeless.\n\n"
    + TOOL_ENV_CONTRACT
)

DOMAINS = ("games", "tool_use")  # what the designer writes: text games or tool-use tasks


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, got {domain!r}")


def designer_system(cfg: RolesConfig, domain: str = "games") -> str:
    """The designer's system turn: the domain's contract, plus (games) the JAX-subset advice when the config
    asks for it; tool-use programs always run in the sandbox."""
    _check_domain(domain)
    if domain == "tool_use":
        return TOOL_DESIGNER_SYSTEM
    return DESIGNER_SYSTEM + ("\n" + JAX_SUBSET_ADVICE if cfg.jax_subset_advice else "")

TOOL_HINT_SYSTEM = ("You write short hints for an agent that solves a task by calling tools. You can read the "
                    "task's code; the agent sees only the task, the tool list and the tool results.")

HINT_SYSTEM = ("You write short hints for the player of a text game. You can read the game's code; the player sees "
               "only its observations.")


REPLY_WITH_CODE = "Reply with one ```python block that holds the whole program, and nothing after it."


# ---------------------------------------------------------------------------------------------
# Designer
# ---------------------------------------------------------------------------------------------


def _code_block(source: str, max_chars: int) -> str:
    source = source.strip("\n")
    if len(source) > max_chars:
        source = truncate_text(source, max_chars) + "\n# ... (rest omitted)"
    return f"```python\n{source}\n```"


def _record_line(record: Any) -> str:
    parts = []
    for name, label in (("skill", "skill"), ("win_rate", "agent win rate"), ("regret", "hint regret")):
        value = getattr(record, name, None)
        if isinstance(value, float) and not np.isnan(value):
            parts.append(f"{label} {value:.2f}")
        elif isinstance(value, str) and value:
            parts.append(f"{label}: {value}")
    return "(" + ", ".join(parts) + ")" if parts else ""


def _class_name(record: Any) -> str:
    """The environment class of a memory record's program (the last `class` line, or the record's id,
    when the program does not parse)."""
    source = getattr(record, "source", "") or ""
    try:
        from spade_jax.envs.program import ProgramError, find_env_class
    except ImportError:
        pass
    else:
        try:
            return find_env_class(source)
        except ProgramError:
            pass
    names = re.findall(r"^class\s+([A-Za-z_]\w*)", source, flags=re.MULTILINE)
    return names[-1] if names else str(getattr(record, "env_id", "?"))


# Headers of the memory part of a designer prompt (the ablation tests look for them).
MEMORY_POSITIVES_HEADER = "Past environments at the right level for the agent"
MEMORY_NEGATIVES_HEADER = "Past environments at the wrong level for the agent"


def _memory_sections(positives: Sequence[Any], negatives: Sequence[Any], cfg: RolesConfig) -> list[str]:
    """SPADE's memory examples: each positive with the start of its code, each negative as one line
    ("too easy"/"too hard", its win rate and class name) without code."""
    sections = []
    if positives:
        parts = [f"{MEMORY_POSITIVES_HEADER} (it won some plays and lost others). Learn from their structure "
                 "and difficulty, but do not copy them:"]
        for i, record in enumerate(positives, 1):
            parts.append(f"Past environment {i} {_record_line(record)}:\n"
                         + _code_block(record.source, cfg.memory_example_max_chars))
        sections.append("\n\n".join(parts))
    if negatives:
        lines = []
        for record in negatives:
            win_rate = float(getattr(record, "win_rate", float("nan")))
            too = "too easy" if win_rate > 0.5 else "too hard"
            lines.append(f"- {too} (agent win rate {win_rate:.2f}): class {_class_name(record)}")
        sections.append(f"{MEMORY_NEGATIVES_HEADER}; do not make games like these:\n" + "\n".join(lines))
    return sections


def _document_section(document: Document, used_chars: int, cfg: RolesConfig) -> str:
    """The grounding document, cut to what the prompt budget leaves (within [doc_min_chars, doc_max_chars])."""
    room = cfg.max_prompt_chars - used_chars - len(document.title) - 40
    budget = max(cfg.doc_min_chars, min(cfg.doc_max_chars, room))
    return f"Grounding document: {document.title}\n\"\"\"\n{truncate_text(document.text, budget)}\n\"\"\""


def _skill_line(skill: str) -> str:
    description = SKILL_DESCRIPTIONS.get(skill)
    return f"Skill to train: {skill}" + (f" ({description})." if description else ".")


def _edit_direction(win_rate: float | None, low: float = 0.4, high: float = 0.6) -> str:
    # ACCEL edits toward the frontier: harder when the agent wins too often, easier when it rarely does.
    if win_rate is None or np.isnan(win_rate) or win_rate > high:
        return "harder"
    return "easier" if win_rate < low else "different"


def _edit_instruction(
    win_rate: float | None, low: float = 0.4, high: float = 0.6, lead: str = "Rewrite it into"
) -> str:
    return {
        "harder": f"{lead} a HARDER variant: more steps, larger state or a less obvious rule.",
        "easier": f"{lead} an EASIER variant: fewer steps, a smaller state or clearer feedback.",
        "different": f"{lead} a DIFFERENT variant of similar difficulty: change the rules, the state or the goal.",
    }[_edit_direction(win_rate, low, high)]


def designer_prompt(
    skill: str,
    document: Document | None,
    positives: Sequence[Any] = (),
    negatives: Sequence[Any] = (),
    library_example: str | None = None,
    mode: str = "write",
    base_program: str | None = None,
    base_win_rate: float | None = None,
    cfg: RolesConfig = RolesConfig(),
    domain: str = "games",
) -> Messages:
    """Chat messages asking the designer for one environment of `domain` (games or tool_use).

    `positives` and `negatives` are memory records (with .source, .win_rate, .regret, .skill); as in
    SPADE they go into every mode's prompt: positives with their code, negatives as one line each. In
    "write" mode the designer also sees the library example; in "edit" mode it sees `base_program`
    and is asked for a harder, easier or different variant; "tune" mode is `tune_prompt` (new values
    for the base's constants). The grounding document fills whatever the prompt budget leaves,
    within [doc_min_chars, doc_max_chars].
    """
    _check_domain(domain)
    if mode not in ("write", "edit", "tune"):
        raise ValueError(f"designer mode must be 'write', 'edit' or 'tune', got {mode!r}")
    if mode in ("edit", "tune") and not base_program:
        verb = "rewrite" if mode == "edit" else "tune"
        raise ValueError(f"{mode} mode needs base_program (the environment to {verb})")
    if mode == "tune":
        return tune_prompt(skill, base_program, base_win_rate, cfg, document=document, positives=positives,
                           negatives=negatives)
    sections: list[str] = [_skill_line(skill)]
    if mode == "write" and library_example and cfg.library_example:
        sections.append("A complete example environment:\n" + _code_block(library_example, cfg.example_max_chars))
    sections += _memory_sections(positives, negatives, cfg)
    if mode == "edit":
        sections.append(
            "Environment to rewrite" + (f" (agent win rate {base_win_rate:.2f})" if base_win_rate is not None
                                        and not np.isnan(base_win_rate) else "") + ":\n"
            + _code_block(base_program, cfg.example_max_chars)
        )
        task = (
            _edit_instruction(base_win_rate) + f" It must exercise {skill}. Keep the class interface and "
            "rename the class (it must still end in Env"
            + (" and extend ToolEnv)." if domain == "tool_use" else ").")
            + (" Take new rules, names or quantities from the document above." if document else "")
            + "\n" + REPLY_WITH_CODE
        )
    else:
        kind = "tool-use environment" if domain == "tool_use" else "environment"
        task = (
            f"Write a NEW {kind} that exercises {skill}"
            + (", with its theme and rules drawn from the document" if document else "")
            + ", different from the examples. " + REPLY_WITH_CODE
        )
    if document is not None:
        used = len(designer_system(cfg, domain)) + sum(len(s) + 2 for s in sections) + len(task)
        sections.insert(1, _document_section(document, used, cfg))
    sections.append(task)
    return [
        {"role": "system", "content": designer_system(cfg, domain)},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


def _extract_code_fallback(text: str) -> str:
    """Used only when spade_jax.envs.program is unavailable: last ```python block, else last block."""
    blocks = re.findall(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", text, flags=re.DOTALL)
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    candidates = python or [code for _, code in blocks]
    if candidates:
        return max(reversed(candidates), key=len).strip("\n") + "\n"
    return text if re.search(r"^class\s+\w+", text, re.MULTILINE) else ""


def parse_designer_output(text: str) -> str:
    """The program in the designer's reply ('' when there is none; validation then reports it)."""
    text = strip_thinking(text)
    try:
        from spade_jax.envs.program import ProgramError, extract_code
    except ImportError:
        return _extract_code_fallback(text)
    try:
        return extract_code(text)
    except ProgramError:
        return ""


def repair_prompt(source: str, errors: Sequence[str], cfg: RolesConfig = RolesConfig(),
                  domain: str = "games") -> Messages:
    """One repair turn for a program that failed validation.

    The repaired program may feed the agent, but the designer is trained on its original reply and
    that reply's verdict: the repair turn carries no loss and does not change the designer's reward.
    """
    listed = "\n".join(f"- {e}" for e in errors) if errors else "- (no message)"
    return [
        {"role": "system", "content": designer_system(cfg, domain)},
        {"role": "user", "content": (
            "This environment program failed validation:\n" + listed + "\n\n"
            + _code_block(source, cfg.max_prompt_chars // 2)
            + "\n\nFix every error and keep the game the same. " + REPLY_WITH_CODE
        )},
    ]


# ---------------------------------------------------------------------------------------------
# Tune mode: new values for a program's constants (ACCEL's small edits)
# ---------------------------------------------------------------------------------------------

TUNER_SYSTEM = (
    "You tune text games (reinforcement-learning environments) that train a reasoning agent. "
    "A good game is solvable, needs several steps of thinking, and is neither trivial nor hopeless. "
    "You change a game only by giving its constants new values."
)

NO_CHANGE_ERROR = (
    "no change: the reply gave no constant of the base program a new value of the same type "
    "(reply with lines like `NAME = value` for the listed constants)"
)

_TUNE_LIST_MAX = 12  # constants listed in a tune prompt
_TUNE_VALUE_MAX_CHARS = 160  # longer values (big tables) are not offered for tuning


def _constant_lines(source: str) -> list[str]:
    """`NAME = value  # comment` for the constants a tune prompt offers (short values only)."""
    return constant_lines(source, _TUNE_VALUE_MAX_CHARS)[:_TUNE_LIST_MAX]


# The one demonstration in every tune prompt: a made-up game whose changed names (RANGE, TRIES) no
# library program uses, so copying it changes nothing. Small models follow a shown exchange far better
# than a described format.
_TUNE_DEMO_GAME = "Game GuessEnv: guess a hidden number from higher/lower feedback."
_TUNE_DEMO_CONSTANTS = ["MAX_TURNS = 10  # hard cap on steps", "RANGE = 50  # the number is in 1..RANGE",
                        "TRIES = 3  # wrong guesses allowed"]
_TUNE_DEMO_REPLY = {"harder": "RANGE = 200\nTRIES = 2", "easier": "RANGE = 20\nTRIES = 5",
                    "different": "RANGE = 80\nTRIES = 4"}


def _tune_request(skill: str, game: str, constants: Sequence[str], win_rate: float | None,
                  context: Sequence[str] = ()) -> str:
    return "\n\n".join([
        _skill_line(skill),
        *context,
        game,
        "Its constants, with their current values:\n```python\n" + "\n".join(constants) + "\n```",
        _edit_instruction(win_rate, lead="Tune it into")
        + " Change one to three of these constants; keep every turn limit at most 25 and the game solvable "
        "in at least 3 steps. "
        + ("Everything above the game is context: change only its constants. " if context else "")
        + "Reply with only the changed constants, one `NAME = value` line each, in one ```python block. "
        "Use only these names: " + ", ".join(line.split(" =")[0] for line in constants) + ".",
    ])


def _game_summary(source: str) -> str:
    """'Game NameEnv: <docstring>' for a tune prompt that does not show the program."""
    tree = ast.parse(source)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    doc = ast.get_docstring(tree) or (ast.get_docstring(classes[0]) if classes else None) or ""
    name = classes[-1].name if classes else "the game"
    return f"Game {name}: {' '.join(doc.split())}" if doc else f"Game {name}."


def tune_prompt(skill: str, base_program: str, base_win_rate: float | None = None,
                cfg: RolesConfig = RolesConfig(), document: Document | None = None,
                positives: Sequence[Any] = (), negatives: Sequence[Any] = ()) -> Messages:
    """Chat messages asking the designer for new values of `base_program`'s constants: one made-up
    demonstration exchange, then the grounding document and the memory examples (as in every
    designer prompt), the base (the whole program when `cfg.tune_show_program`, else its docstring),
    the list of its constants with their current values and the harder/easier/different instruction."""
    constants = _constant_lines(base_program)
    if not constants:
        raise ValueError("tune mode needs a base program with UPPERCASE literal constants; use edit mode for this one")
    known = base_win_rate is not None and not np.isnan(base_win_rate)
    if cfg.tune_show_program:
        game = (f"Environment to tune{f' (agent win rate {base_win_rate:.2f})' if known else ''}:\n"
                + _code_block(base_program, cfg.example_max_chars))
    else:
        game = _game_summary(base_program) + (f"\nAgent win rate: {base_win_rate:.2f}." if known else "")
    demo_reply = _TUNE_DEMO_REPLY[_edit_direction(base_win_rate)]
    demo = [
        {"role": "system", "content": TUNER_SYSTEM},
        {"role": "user", "content": _tune_request("pattern recognition", _TUNE_DEMO_GAME, _TUNE_DEMO_CONSTANTS,
                                                  base_win_rate)},
        {"role": "assistant", "content": f"```python\n{demo_reply}\n```"},
    ]
    context = _memory_sections(positives, negatives, cfg)
    if document is not None:
        used = sum(len(m["content"]) for m in demo) + len(_tune_request(skill, game, constants, base_win_rate, context))
        context.insert(0, _document_section(document, used, cfg))
    return [*demo, {"role": "user", "content": _tune_request(skill, game, constants, base_win_rate, context)}]


def designer_program(request: "DesignRequest", reply_text: str) -> tuple[str, str | None]:
    """The program a designer reply stands for, and why it is rejected before validation (None when
    it is not). A tune reply is applied to the request's base; one that changes nothing is rejected
    with NO_CHANGE_ERROR (program ''): a copy of the base teaches nothing, so it scores as invalid."""
    if request.mode != "tune":
        return parse_designer_output(reply_text), None
    if not request.base_source:
        raise ValueError("a tune request needs base_source (the program its reply is applied to)")
    tuned = apply_tuning(request.base_source, reply_text)
    if tuned == request.base_source:
        return "", NO_CHANGE_ERROR
    return tuned, None


# ---------------------------------------------------------------------------------------------
# Choosing what the designer is shown
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DesignRequest:
    """One designer prompt with what went into it (for the environment archive and logs)."""

    skill: str
    mode: str  # "write", "edit" (full rewrite of a base) or "tune" (new values for the base's constants)
    messages: Messages
    document_title: str | None
    base_name: str | None  # env id or library name of the edited environment (edit and tune modes)
    positive_ids: tuple[str, ...]  # memory positives shown with their code (an edit base from memory is not repeated)
    negative_ids: tuple[str, ...]  # memory negatives shown as one line each
    base_source: str | None = None  # the base program (edit and tune modes); a tune reply is applied to it


def _library_items(domain: str = "games") -> list[Any]:
    try:
        from spade_jax.envs.library import library_programs
    except ImportError:
        return []
    return list(library_programs(domain=domain))


def _ids(records: Sequence[Any]) -> tuple[str, ...]:
    return tuple(r.env_id for r in records)


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    # One uniform draw whatever len(items) is (Generator.integers may draw more than once), so
    # picking from the library or from memory leaves the stream in the same place.
    return items[min(int(rng.random() * len(items)), len(items) - 1)]


def design_request(
    rng: np.random.Generator,
    skill: str,
    corpus: Any | None = None,
    memory: Any | None = None,
    library: Sequence[Any] | None = None,
    cfg: RolesConfig = RolesConfig(),
    positives: int = 2,
    negatives: int = 1,
    domain: str = "games",
) -> DesignRequest:
    """Sample everything one designer prompt needs (mode, document, memory examples, library
    example or edit base) and build it. Modes: "edit" with chance `edit_prob` (when there is a base),
    of which a share `tune_prob` are "tune"; else "write". Every mode's prompt carries the document
    and the memory examples (SPADE puts both into every generation prompt). `library` items have
    .name, .skill and .source; None means spade_jax.envs.library's programs.

    The document, the memory draw and the choices (mode, base, example) use three streams seeded
    from `rng` by one fixed draw, so the no-corpus and no-memory ablations (corpus or memory None)
    change only what they remove: the same rng gives the same mode, base and document.
    """
    _check_domain(domain)
    library = _library_items(domain) if library is None else list(library)
    doc_rng, memory_rng, rng = (np.random.default_rng(int(seed)) for seed in rng.integers(0, 2**63, size=3))
    document = corpus.sample(doc_rng) if corpus is not None else None
    title = document.title if document is not None else None
    pos, neg = memory.sample_for_designer(memory_rng, positives, negatives, skill) if memory is not None else ([], [])
    same_skill = [item for item in library if getattr(item, "skill", None) == skill] or library
    fitting = [item for item in same_skill if len(item.source) <= cfg.example_max_chars] or same_skill
    mode = "edit" if (rng.random() < cfg.edit_prob and (pos or fitting)) else "write"
    if mode == "edit":
        from_memory = rng.random() < cfg.edit_from_memory_prob  # drawn even without memory: streams stay aligned
        if pos and (not fitting or from_memory):
            base = _pick(rng, pos)
            base_name, base_source, base_w = base.env_id, base.source, base.win_rate
            shown = [r for r in pos if r is not base]  # the base is already in the prompt
        else:
            item = _pick(rng, fitting)
            base_name, base_source, base_w, shown = item.name, item.source, None, pos
        # A base without constants to tune (a program written from nothing may have none) is rewritten.
        if cfg.tune_prob > 0 and rng.random() < cfg.tune_prob and _constant_lines(base_source):
            messages = tune_prompt(skill, base_source, base_w, cfg, document=document, positives=shown, negatives=neg)
            mode = "tune"
        else:
            messages = designer_prompt(skill, document, shown, neg, mode="edit", base_program=base_source,
                                       base_win_rate=base_w, cfg=cfg, domain=domain)
        return DesignRequest(skill, mode, messages, title, base_name, _ids(shown), _ids(neg), base_source)
    example = _pick(rng, fitting).source if fitting else None
    messages = designer_prompt(skill, document, pos, neg, example, mode="write", cfg=cfg, domain=domain)
    return DesignRequest(skill, "write", messages, title, None, _ids(pos), _ids(neg))


# ---------------------------------------------------------------------------------------------
# Hint writer
# ---------------------------------------------------------------------------------------------


HINT_MAX_WORDS = 100  # a hint longer than this is cut at a sentence boundary (SPADE asks for under 100 words)


def hint_prompt(source: str, cfg: RolesConfig = RolesConfig(), domain: str = "games") -> Messages:
    """The hint writer reads the source and works out the puzzle, how its answer is derived and the
    form an action takes; the hint states the approach and the format, never the answer (SPADE). For a
    tool-use task: which tools to use in which order and what to carry from one result to the next."""
    _check_domain(domain)
    if domain == "tool_use":
        return [
            {"role": "system", "content": TOOL_HINT_SYSTEM},
            {"role": "user", "content": (
                "Here is the code of a tool-use task:\n" + _code_block(source, cfg.hint_source_max_chars) + "\n\n"
                "Read setup(), the tools and subgoals() and work out three things: what the task asks as the agent "
                "sees it, which tools it needs in which order and what each result contributes to the next call, "
                "and what the final <answer> must hold (a number, an id, a name, or done). Then write a hint of 1 "
                f"to {cfg.max_hint_sentences} sentences, under {HINT_MAX_WORDS} words, that explains that plan and "
                "warns of the trap (a distractor tool, an error to recover from, a required last step). Speak only "
                "of what the agent sees, never of the code's variables. Never give the answer, concrete ids or "
                "values, or any <tool_call> text. Reply with the hint only."
            )},
        ]
    return [
        {"role": "system", "content": HINT_SYSTEM},
        {"role": "user", "content": (
            "Here is the code of a text game:\n" + _code_block(source, cfg.hint_source_max_chars) + "\n\n"
            "Read reset() and step() and work out three things: the puzzle as the player sees it, how the "
            "winning answer is derived from what the player can observe, and the form an action takes (a "
            "number, a word, a list, ...). Then write a hint of 1 to "
            f"{cfg.max_hint_sentences} sentences, under {HINT_MAX_WORDS} words, that explains that approach and "
            "names the action format in words. Speak only of what the player sees, never of the code's "
            "variables, and be specific to this game. Never give the answer, the winning actions or any "
            "\\boxed{...} command. Reply with the hint only."
        )},
    ]


_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# "The answer is 42" leaks; "the answer is a single integer" names the format the prompt asks for.
_FORMAT_WORDS = r"(?:a|an|always|written|given|entered|typed|formatted|expected|in)\b"
# A tool call or an <answer> block in a hint is a literal action: dropped like a \boxed command.
_LEAK = re.compile(r"\\boxed|<tool_call>|<answer>|\bthe (?:final )?answer is\b(?!\s+" + _FORMAT_WORDS + r")"
                   r"|\banswer\s*:|\bsolution is\b|\bsolution\s*:", re.IGNORECASE)


def _solution_tokens(solution: Any) -> list[str]:
    if solution is None:
        return []
    actions = list(solution) if isinstance(solution, (list, tuple)) else [str(solution)]
    tokens = []
    for action in actions:
        command = boxed_command(str(action))
        tokens.append(command if command is not None else str(action).strip().lower())
    return [t for t in tokens if t]


def _contains_in_order(sentence: str, tokens: list[str]) -> bool:
    at = 0
    lowered = sentence.lower()
    for token in tokens:
        match = re.search(r"(?<!\w)" + re.escape(token) + r"(?!\w)", lowered[at:])
        if match is None:
            return False
        at += match.end()
    return True


def parse_hint(text: str, max_sentences: int = 3, solution: Any = None, max_words: int = HINT_MAX_WORDS) -> str:
    """The hint in the hint writer's reply: at most `max_sentences` sentences and `max_words` words
    (a first sentence longer than that is cut), without sentences that leak the answer (a \\boxed
    command, 'the answer is 42', or the whole known solution)."""
    text = strip_thinking(text).strip()
    text = re.sub(r"^\s*(\*\*)?hint(\*\*)?\s*:\s*", "", text, flags=re.IGNORECASE)
    text = re.sub(r"```.*?(```|\Z)", " ", text, flags=re.DOTALL)  # code is never a hint
    tokens = _solution_tokens(solution)
    kept, words = [], 0
    for sentence in _SENTENCE.split(" ".join(text.split())):
        sentence = sentence.strip()
        if not sentence or _LEAK.search(sentence):
            continue
        if tokens and _contains_in_order(sentence, tokens):
            continue
        n = len(sentence.split())
        if words + n > max_words:
            if not kept:
                kept.append(" ".join(sentence.split()[:max_words]))
            break
        kept.append(sentence)
        words += n
        if len(kept) == max_sentences:
            break
    return " ".join(kept)


# ---------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------


# The agent's system turn for tool use (rollout.system_prompt None selects it when domain is tool_use).
TOOL_AGENT_SYSTEM = (
    "You solve tasks by calling tools. Each turn, think briefly, then call one or more tools, each written as "
    "<tool_call>{\"name\": \"TOOL\", \"arguments\": {\"ARG\": VALUE}}</tool_call> with valid JSON; the results "
    "come back in the next message. Use only the listed tools and their argument names. When the task is done, "
    "reply with <answer>the final answer</answer> (<answer>done</answer> when no value is asked for)."
)


def agent_system(domain: str = "games") -> str:
    """The agent's default system turn for a domain."""
    _check_domain(domain)
    return TOOL_AGENT_SYSTEM if domain == "tool_use" else AGENT_SYSTEM


def agent_messages(observation: str, hint: str | None = None, domain: str = "games") -> Messages:
    """The agent's conversation at the first turn (hint appended in the hinted arm)."""
    return [
        {"role": "system", "content": agent_system(domain)},
        {"role": "user", "content": with_hint(observation, hint)},
    ]


def agent_turn(messages: Messages, reply: str, observation: str) -> Messages:
    """The conversation after the agent replied and the environment answered (a new list)."""
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
