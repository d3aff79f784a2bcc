"""Held-out evaluation: offline GEM games and reasoning-gym tasks at fixed seeds, success rates
with Wilson intervals, model-backed policies, and flags for generated envs that copy an eval env."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import logging
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DUPLICATE_THRESHOLD",
    "FAMILY_THRESHOLD",
    "SUITES",
    "DuplicateFlag",
    "EpisodeResult",
    "EvalReport",
    "EvalSuite",
    "EvalTask",
    "Policy",
    "TaskResult",
    "evaluate",
    "family_score",
    "family_words",
    "first_observation",
    "flag_duplicates",
    "get_suite",
    "macro_interval",
    "make_eval_env",
    "model_policy",
    "similarity",
    "tokens_policy",
    "wilson_interval",
]

_log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
# A policy maps a batch of chat conversations (each ending with a user turn) to one reply each.
Policy = Callable[[list[Messages]], list[str]]

# reasoning-gym answers count as solved at this score (scores are in [0, 1]; some are partial).
RG_SUCCESS_SCORE = 0.999
# Default first episode seed: far from the small seeds training and tests use.
HELDOUT_SEED_BASE = 900_000
# Appended to reasoning-gym questions so the answer is read the way GEM reads it.
RG_ANSWER_INSTRUCTION = "Write your final answer inside \\boxed{...}."


# ----------------------------------------------------------------------------- suites


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """One held-out environment and how to play it."""

    env_id: str  # "game:<GEM id>" (GEM game) or "rg:<name>" (reasoning-gym dataset)
    episodes: int  # episodes scored, one per seed
    max_turns: int  # turn cap of one episode (reasoning-gym tasks are single-turn: 1)
    seeds: tuple[int, ...] = ()  # episode seeds; empty means HELDOUT_SEED_BASE + 0..episodes-1

    def __post_init__(self):
        if not re.fullmatch(r"(game|rg):[A-Za-z0-9_.\-]+", self.env_id):
            raise ValueError(
                f"eval env id {self.env_id!r} must look like 'game:TowerofHanoi-v0-easy' or "
                "'rg:countdown'"
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
# (grid search) replaced them; tests/test_evaluation.py checks every suite task with family_score.
_REASONING = ("rg:zebra_puzzles", "rg:largest_island", "rg:arc_1d", "rg:countdown")


def _suite(name: str, episodes: int) -> EvalSuite:
    tasks = [EvalTask(env_id, episodes, turns) for env_id, turns in _GAMES]
    tasks += [EvalTask(env_id, episodes, 1) for env_id in _REASONING]
    return EvalSuite(name, tuple(tasks))


SUITES: dict[str, EvalSuite] = {
    # 50 episodes per task: a Wilson interval of at most +-13.5 points per task.
    "heldout": _suite("heldout", 50),
    # Same tasks, 5 episodes each: a smoke test of the whole path in minutes.
    "quick": _suite("quick", 5),
}


def get_suite(name: str, episodes: int | None = None) -> EvalSuite:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}")
    suite = SUITES[name]
    return suite.with_episodes(episodes) if episodes is not None else suite


# ----------------------------------------------------------------------------- environments


@contextlib.contextmanager
def _saved_global_rng() -> Iterator[None]:
    """Restore Python's and numpy's global RNG state on exit (GEM's reset reseeds both)."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


class _GameEnv:
    """GEM game whose observation text includes `info["suffix"]` (the board), as GEM's
    ObservationWrapper shows it; success is a terminal win (reward 1, not truncated)."""

    def __init__(self, env_id: str):
        from spade_jax.envs.api import make_gem_env

        # Each game runs on its own copy of the global RNG state (GEM's reset reseeds the
        # global generators and some games draw from them every step).
        self._env = make_gem_env(env_id)

    @staticmethod
    def _text(obs: str, info: Mapping[str, Any]) -> str:
        prefix, suffix = info.get("prefix") or "", info.get("suffix") or ""
        parts = [p.strip("\n") for p in (prefix, obs, suffix) if p and p.strip()]
        return "\n".join(parts)

    def reset(self, seed: int) -> str:
        obs, info = self._env.reset(seed=seed)
        return self._text(obs, info or {})

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        obs, reward, terminated, truncated, info = self._env.step(action)
        reward = float(reward)
        # The games return (reward 1, terminated, not truncated) only on a win; running out of
        # turns may pay a partial reward, which does not count as success.
        self.success = bool(terminated) and not bool(truncated) and reward >= 1.0 - 1e-6
        return self._text(obs, info or {}), reward, bool(terminated), bool(truncated)


class _ReasoningGymEnv:
    """One reasoning-gym item per seed, answered in one turn; success is score >= 0.999."""

    def __init__(self, env_id: str):
        import reasoning_gym

        self.name = env_id.split(":", 1)[1]
        if self.name not in reasoning_gym.factory.DATASETS:
            raise ValueError(f"unknown reasoning-gym task {self.name!r} in {env_id!r}")
        self._create = reasoning_gym.create_dataset

    def reset(self, seed: int) -> str:
        with _saved_global_rng():
            self._dataset = self._create(self.name, size=1, seed=seed)
            self._entry = self._dataset[0]
        self.answer = self._entry["answer"]
        return f"{self._entry['question'].rstrip()}\n\n{RG_ANSWER_INSTRUCTION}"

    def step(self, action: str) -> tuple[str, float, bool, bool]:
        from spade_jax.envs.api import extract_boxed

        answer = extract_boxed(action)
        try:
            with _saved_global_rng():
                score = float(self._dataset.score_answer(answer.strip(), self._entry)) if answer else 0.0
        except Exception:  # noqa: BLE001 - some scorers raise on malformed answers: unsolved
            score = 0.0
        if not math.isfinite(score):
            score = 0.0
        self.success = score >= RG_SUCCESS_SCORE
        return "Answer recorded.", score, True, False


def make_eval_env(env_id: str) -> _GameEnv | _ReasoningGymEnv:
    """An eval env: `reset(seed) -> text`, `step(action) -> (text, reward, terminated,
    truncated)`, and `.success` after the last step."""
    kind = env_id.split(":", 1)[0]
    if kind == "game":
        return _GameEnv(env_id)
    if kind == "rg":
        return _ReasoningGymEnv(env_id)
    raise ValueError(f"eval env id {env_id!r} must start with 'game:' or 'rg:'")


def first_observation(env_id: str, seed: int = HELDOUT_SEED_BASE) -> str:
    """The text an agent sees first in `env_id` at `seed` (instructions and board)."""
    return make_eval_env(env_id).reset(seed)


# ----------------------------------------------------------------------------- statistics


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% by default); (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n]; got {successes} of {n}")
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def macro_interval(
    counts: Sequence[tuple[int, int]], z: float = 1.959963984540054
) -> tuple[float, float, float]:
    """Mean of per-task success rates and a normal-approximation interval for it: the tasks
    are independent, so Var(mean) = sum p_i (1 - p_i) / n_i / K^2. Returns (mean, low, high)."""
    rates = [(k / n, n) for k, n in counts if n > 0]
    if not rates:
        return 0.0, 0.0, 1.0
    mean = sum(p for p, _ in rates) / len(rates)
    # Using each task's Wilson-adjusted centre keeps the variance positive at 0/n and n/n.
    var = 0.0
    for (k, n) in counts:
        if n > 0:
            p_adj = (k + z * z / 2) / (n + z * z)
            var += p_adj * (1 - p_adj) / n
    se = math.sqrt(var) / len(rates)
    return mean, max(0.0, mean - z * se), min(1.0, mean + z * se)


# ----------------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    env_id: str  # eval task
    seed: int  # episode seed
    success: bool  # won the game / solved the item
    turns: int  # agent replies
    total_reward: float  # sum of step rewards
    final_reward: float  # last step reward (0 when no step ran)
    error: str | None = None  # env crash, if any (the episode counts as failed)


@dataclasses.dataclass(frozen=True)
class TaskResult:
    env_id: str  # eval task
    episodes: int  # episodes played
    successes: int  # episodes won
    success_rate: float  # successes / episodes
    ci_low: float  # Wilson 95% interval
    ci_high: float
    mean_reward: float  # mean total reward (context only: random play earns some)
    mean_turns: float  # mean agent replies per episode


@dataclasses.dataclass(frozen=True)
class EvalReport:
    suite: str  # suite name
    seed: int  # evaluate(seed=...) (shifts every episode seed)
    tasks: tuple[TaskResult, ...]  # one per suite task, in suite order
    episodes: tuple[EpisodeResult, ...]  # every episode
    success_rate: float  # macro average over tasks
    ci_low: float  # normal-approximation 95% interval of the macro average
    ci_high: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        rows = [("task", "success", "95% CI", "episodes", "mean reward", "mean turns")]
        for t in self.tasks:
            rows.append((
                t.env_id, f"{100 * t.success_rate:.1f}%",
                f"[{100 * t.ci_low:.1f}, {100 * t.ci_high:.1f}]", str(t.episodes),
                f"{t.mean_reward:.3f}", f"{t.mean_turns:.1f}",
            ))
        rows.append((
            "macro average", f"{100 * self.success_rate:.1f}%",
            f"[{100 * self.ci_low:.1f}, {100 * self.ci_high:.1f}]",
            str(sum(t.episodes for t in self.tasks)), "", "",
        ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = []
        for j, row in enumerate(rows):
            lines.append("  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
            ).rstrip())
            if j == 0 or j == len(rows) - 2:
                lines.append("  ".join("-" * w for w in widths))
        return f"suite {self.suite} (seed {self.seed})\n" + "\n".join(lines)


def _agent_messages(observation: str) -> Messages:
    from spade_jax.roles import agent_messages

    return agent_messages(observation)


def _agent_turn(messages: Messages, reply: str, observation: str) -> Messages:
    from spade_jax.roles import agent_turn

    return agent_turn(messages, reply, observation)


def evaluate(
    policy: Policy,
    suite: EvalSuite | str,
    *,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
) -> EvalReport:
    """Plays every episode of `suite` with `policy`, all live episodes batched per turn.

    Episode seeds are the suite's seeds plus `seed` (0 is the canonical held-out set). The
    conversation is the agent's (roles.agent_messages): observation as user turn, reply as
    assistant turn, up to each task's max_turns replies. `batch_size` caps one policy call.
    """
    if isinstance(suite, str):
        suite = get_suite(suite)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    @dataclasses.dataclass
    class _Live:
        task: EvalTask
        seed: int
        env: Any
        messages: Messages
        turns: int = 0
        rewards: list = dataclasses.field(default_factory=list)
        done: bool = False
        success: bool = False
        error: str | None = None

    episodes: list[_Live] = []
    for task in suite.tasks:
        for episode_seed in task.episode_seeds:
            env = make_eval_env(task.env_id)
            live = _Live(task, episode_seed + seed, env, [])
            try:
                live.messages = _agent_messages(env.reset(live.seed))
            except Exception as err:  # noqa: BLE001 - a broken eval env fails its episodes
                live.done, live.error = True, f"reset failed: {type(err).__name__}: {err}"
            episodes.append(live)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(episodes), desc=f"eval {suite.name}", unit="ep", leave=False)
    while True:
        live = [e for e in episodes if not e.done]
        if not live:
            break
        step = batch_size or len(live)
        replies: list[str] = []
        for start in range(0, len(live), step):
            chunk = [e.messages for e in live[start:start + step]]
            out = list(policy(chunk))
            if len(out) != len(chunk):
                raise ValueError(f"policy returned {len(out)} replies for {len(chunk)} conversations")
            replies.extend(out)
        for e, reply in zip(live, replies):
            if not isinstance(reply, str):
                raise ValueError(f"policy must return str replies, got {type(reply).__name__}")
            e.turns += 1
            try:
                obs, reward, terminated, truncated = e.env.step(reply)
            except Exception as err:  # noqa: BLE001
                e.done, e.error = True, f"step failed: {type(err).__name__}: {err}"
            else:
                e.rewards.append(reward if math.isfinite(reward) else 0.0)
                if terminated or truncated:
                    e.done, e.success = True, bool(e.env.success)
                elif e.turns >= e.task.max_turns:
                    e.done = True
                else:
                    e.messages = _agent_turn(e.messages, reply, obs)
            if e.done and bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()

    results = tuple(
        EpisodeResult(
            e.task.env_id, e.seed, e.success, e.turns, float(sum(e.rewards)),
            float(e.rewards[-1]) if e.rewards else 0.0, e.error,
        )
        for e in episodes
    )
    tasks = []
    for task in suite.tasks:
        mine = [r for r in results if r.env_id == task.env_id]
        wins = sum(r.success for r in mine)
        low, high = wilson_interval(wins, len(mine))
        tasks.append(TaskResult(
            task.env_id, len(mine), wins, wins / len(mine), low, high,
            sum(r.total_reward for r in mine) / len(mine), sum(r.turns for r in mine) / len(mine),
        ))
    mean, low, high = macro_interval([(t.successes, t.episodes) for t in tasks])
    return EvalReport(suite.name, seed, tuple(tasks), results, mean, low, high)


# ----------------------------------------------------------------------------- policies


def _prompt_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """Chat-template prompt ids: our Tokenizer's encode_chat, else a transformers tokenizer."""
    encode_chat = getattr(tokenizer, "encode_chat", None)
    if callable(encode_chat):
        return list(encode_chat(messages, add_generation_prompt=True))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokens_policy(
    generate: Callable[[list[list[int]]], Sequence[Any]], tokenizer: Any
) -> Policy:
    """Policy from a token-level generator (prompt ids -> one completion per prompt, each a
    list of ids or an object with `.tokens`, as rollout.GenerateFn returns)."""

    def policy(conversations: list[Messages]) -> list[str]:
        generations = generate([_prompt_ids(tokenizer, messages) for messages in conversations])
        return [
            tokenizer.decode(list(getattr(g, "tokens", g)), skip_special_tokens=True)
            for g in generations
        ]

    return policy


def model_policy(
    model: Any, tokenizer: Any, sampling_config: Any = None, *, mesh: Any = None, seed: int = 0,
    reply_prefix: str = "",
) -> Policy:
    """Policy backed by spade_jax.sampling.Sampler on `model` (greedy, 256 new tokens unless
    `sampling_config` says otherwise); each call draws a fresh key folded from `seed`."""
    import itertools

    import jax

    from spade_jax.sampling import Sampler, SamplingConfig

    config = sampling_config or SamplingConfig(max_new_tokens=256, temperature=0.0)
    sampler = Sampler(model, tokenizer, mesh=mesh)
    calls = itertools.count()
    base_key = jax.random.key(seed)
    # A conversation that no longer fits the context gets an empty reply, which the env
    # scores as an unreadable action: the episode ends unsolved instead of the run failing.
    room = model.spec.max_position - config.max_new_tokens

    def policy(conversations: list[Messages]) -> list[str]:
        forced = tokenizer.encode(reply_prefix, add_special_tokens=False) if reply_prefix else []
        prompts = [_prompt_ids(tokenizer, messages) + forced for messages in conversations]
        fits = [i for i, p in enumerate(prompts) if len(p) <= room]
        if len(fits) < len(prompts):
            _log.warning("%d conversation(s) exceed the model's context; they get an empty reply",
                         len(prompts) - len(fits))
        replies = [""] * len(prompts)
        if fits:
            key = jax.random.fold_in(base_key, next(calls))
            result = sampler.generate([prompts[i] for i in fits], config, key=key)
            for i, text in zip(fits, result.texts):
                replies[i] = reply_prefix + text
        return replies

    return policy


# ----------------------------------------------------------------------------- duplicates

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
    "rg:knights_knaves" -> "knights knaves"."""
    name = re.split(r"-v\d", env_id.split(":", 1)[-1])[0]
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
