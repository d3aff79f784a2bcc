"""Flags for generated environments that copy a held-out task: content-word similarity to its first
observation, and puzzle-family words and names; programs are read, never run."""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from spade_jax.evaluation.environments import first_observation
from spade_jax.evaluation.suites import HELDOUT_SEED_BASE, SUITES, EvalSuite, get_suite

# A generated env is flagged against an eval task when either of two scores reaches its
# threshold (docs/evaluation.md has the measurements). A flag asks for a look, it is not proof.
# - similarity: content-word Jaccard of the program's text and the task's first observation.
#   It catches copies and restatements (the tests' rewrites: 0.24, 0.37; a copy: 1.0) but
#   not a new text about the same puzzle: the library's knights-and-knaves env scored 0.07
#   against rg:knights_knaves. Library envs score at most 0.09 against the suite's tasks.
DUPLICATE_THRESHOLD = 0.2
# - family: is it the same kind of puzzle? 1.0 when the program's class names or docstrings use
#   every word of the task's name, else the share of the task's family words (family_words)
#   that the program's text uses. Library knights-and-knaves env vs rg:knights_knaves: 1.0 by
#   name, 0.54 by words alone; library envs vs the suite's tasks: at most 0.20.
FAMILY_THRESHOLD = 0.3
# First observations read per task for its family words; a word must be in 3/4 of them.
FAMILY_SEEDS = 8

_STOPWORDS = frozenset(
    """the and for you your are with that this from have has not but can will its into any each
    all one two must only use using then than when what which who how get got may also out our
    they them their there here were was been being more most other such some per via off just
    should would could does did done make made see let""".split()
)
_WORD = re.compile(r"[a-z]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_GLUED = re.compile(r"(?<=[a-z])(of|the)(?=[A-Z])")  # GEM ids glue small words: "TowerofHanoi"


def _content_words(text: str) -> frozenset[str]:
    text = _CAMEL.sub(" ", text)
    return frozenset(w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOPWORDS)


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of the content-word sets of two texts, in [0, 1]."""
    wa, wb = _content_words(a), _content_words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _stems(text: str, length: int | None = 5) -> frozenset[str]:
    """Content words made singular and cut to `length` letters, so that word forms meet:
    "Knights" and "knight", "islanders" and "island", "truthful" and "truth"."""
    return frozenset(_singular(w)[:length] for w in _content_words(text))


def _task_name(env_id: str) -> str:
    """The puzzle's name in an eval env id: "game:TowerofHanoi-v0-easy" -> "Tower of Hanoi",
    "rg:knights_knaves" and "rg:knights_knaves(n_people=2)" -> "knights knaves"."""
    name = re.split(r"-v\d|\(", env_id.split(":", 1)[-1])[0]  # no version, no config
    return _GLUED.sub(r" \1 ", name).replace("_", " ")


_OBSERVATION_CACHE: dict[tuple[str, int], str] = {}


def _observation(env_id: str, seed: int) -> str:
    if (env_id, seed) not in _OBSERVATION_CACHE:
        _OBSERVATION_CACHE[env_id, seed] = first_observation(env_id, seed)
    return _OBSERVATION_CACHE[env_id, seed]


@functools.cache
def _instruction_stems(env_id: str) -> frozenset[str]:
    """Stems in at least 3/4 of the task's first FAMILY_SEEDS observations: the words of its
    instructions, not one episode's names and numbers (rg:knights_knaves calls its people
    knights/knaves, heroes/villains, angels/devils, ... from seed to seed)."""
    counts = Counter()
    for i in range(FAMILY_SEEDS):
        counts.update(_stems(_observation(env_id, HELDOUT_SEED_BASE + i)))
    return frozenset(w for w, k in counts.items() if 4 * k >= 3 * FAMILY_SEEDS)


def family_words(env_id: str) -> frozenset[str]:
    """The stems that mark eval task `env_id`'s puzzle family: the words of its name plus its
    instruction words, less boilerplate (instruction words of 3 or more tasks of the
    `heldout` suite: answer format, "board", "move", ...)."""
    counts = Counter(w for task in SUITES["heldout"].tasks for w in _instruction_stems(task.env_id))
    boilerplate = {w for w, k in counts.items() if k >= 3}
    return (_instruction_stems(env_id) - boilerplate) | _stems(_task_name(env_id))


def family_score(text: str, env_id: str, names: str = "") -> float:
    """How much a program belongs to the puzzle family of eval task `env_id`, in [0, 1]: 1.0 when
    its `names` (class names and docstrings) use every word of the task's name, as whole words
    ("KnightsKnavesEnv" for rg:knights_knaves); else the share of family_words(env_id) that its
    `text` (what it shows a player, or an observation) uses."""
    name = _stems(_task_name(env_id), length=None)
    if name and name <= _stems(names, length=None):
        return 1.0
    family = family_words(env_id)
    return len(family & _stems(text)) / len(family) if family else 0.0


def _program_names(source: str) -> str:
    """A program's class names and docstrings (module, classes, functions); "" if unparseable."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
        if isinstance(node, ast.ClassDef):
            parts.append(node.name.removesuffix("Env"))
    return "\n".join(parts)


def _program_text(source: str) -> str:
    """What a program would show a player, read without running it: its string literals
    (f-string text and docstrings included) and its class names."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
        elif isinstance(node, ast.ClassDef):
            parts.append(node.name.removesuffix("Env"))
    return "\n".join(parts)


class DuplicateFlag(NamedTuple):
    env_id: str  # generated environment
    eval_env: str  # eval task it resembles
    similarity: float  # content-word Jaccard with the task's first observation
    family: float  # family_score against the task


def flag_duplicates(
    program_sources: Mapping[str, str] | Sequence[str],
    suite: EvalSuite | str = "heldout",
    *,
    observations: Mapping[str, str] | None = None,
    threshold: float = DUPLICATE_THRESHOLD,
    family_threshold: float = FAMILY_THRESHOLD,
) -> list[DuplicateFlag]:
    """Generated envs that look like an eval env: one flag per program whose similarity reaches
    `threshold` or whose family score reaches `family_threshold` against some eval task, for the
    task with the highest of the two scores; most alike first. Programs are never run: their
    text is their string literals and class names; `observations` (env_id -> first observation
    text, e.g. from rollouts) adds what the env actually showed, and the higher score counts.
    A sequence is keyed by index."""
    if isinstance(suite, str):
        suite = get_suite(suite)
    for name, value in (("threshold", threshold), ("family_threshold", family_threshold)):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} must lie in (0, 1], got {value}")
    if not isinstance(program_sources, Mapping):
        program_sources = {str(i): src for i, src in enumerate(program_sources)}
    observations = observations or {}
    references = [(task.env_id, _observation(task.env_id, task.episode_seeds[0])) for task in suite.tasks]
    flags = []
    for env_id, source in program_sources.items():
        texts = [_program_text(source)]
        if env_id in observations:
            texts.append(observations[env_id])
        names = _program_names(source)
        hits = []
        for eval_env, reference in references:
            sim = max(similarity(text, reference) for text in texts)
            fam = max(family_score(text, eval_env, names) for text in texts)
            if sim >= threshold or fam >= family_threshold:
                hits.append((max(sim, fam), eval_env, sim, fam))
        # One flag per program, for the eval task it resembles most.
        if hits:
            _, eval_env, sim, fam = max(hits)
            flags.append(DuplicateFlag(env_id, eval_env, round(sim, 4), round(fam, 4)))
    flags.sort(key=lambda f: (-max(f.similarity, f.family), f.env_id, f.eval_env))
    return flags
