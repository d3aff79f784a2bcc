"""BFCL-v4 tool-use evaluation offline, from the `bfcl-eval` package's data and executable backends: multi-turn
categories played against the backends and scored by BFCL's own checker, single-turn AST categories scored by
BFCL's AST checker; per-category Wilson intervals and a macro average, as an EvalReport.

The agent calls tools in its own chat format (rollout/tool_chat.py: Qwen's <tool_call> JSON), as BFCL's Qwen
FC handler reads it. Play follows BFCL's inference loop (`BaseHandler.inference_multi_turn_prompting`): each
user turn is followed by model steps until a step holds no call (at most 20 steps, else the entry fails);
calls run on the entry's backend instances and each result comes back as a `tool` turn.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import keyword
import re
import sys
import types
import uuid
from typing import Any, Callable, Sequence

from spade_jax.evaluation.driver import EpisodeResult, EvalReport, TaskResult
from spade_jax.evaluation.stats import macro_interval, wilson_interval
from spade_jax.rollout.tool_calls import ToolCall, parse_tool_calls
from spade_jax.rollout.tool_chat import assistant_message, render_tool_chat, tool_messages

MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
AST_CATEGORIES = ("simple_python", "multiple", "parallel")
MAX_STEPS = 20  # BFCL's MAXIMUM_STEP_LIMIT: more model steps in one user turn and the entry fails


@dataclasses.dataclass(frozen=True)
class ToolSuite:
    """A BFCL suite: categories and how many entries of each (an evenly spaced sample, None for all)."""

    name: str
    categories: tuple[str, ...]
    entries: int | None

    def __post_init__(self):
        unknown = [c for c in self.categories if c not in MULTI_TURN + AST_CATEGORIES]
        if unknown:
            raise ValueError(f"unknown BFCL categories {unknown}; known: {', '.join(MULTI_TURN + AST_CATEGORIES)}")
        if self.entries is not None and self.entries < 1:
            raise ValueError(f"entries per category must be >= 1, got {self.entries}")


TOOL_SUITES = {
    "tool_use": ToolSuite("tool_use", MULTI_TURN, 20),
    "tool_use_quick": ToolSuite("tool_use_quick", AST_CATEGORIES, 50),
}


def get_tool_suite(name: str, entries: int | None = None) -> ToolSuite:
    if name not in TOOL_SUITES:
        raise ValueError(f"unknown tool-use suite {name!r}; known: {', '.join(TOOL_SUITES)}")
    suite = TOOL_SUITES[name]
    return suite if entries is None else dataclasses.replace(suite, entries=entries)


def _bfcl():
    try:
        import bfcl_eval.utils as utils
    except ImportError:
        raise ImportError("BFCL needs the bfcl-eval package: pip install -e '.[tool_use]' "
                          "(then pip install --no-deps bfcl-eval, see docs/evaluation.md)") from None
    return utils


def load_category(category: str, entries: int | None = None) -> list[tuple[dict, dict]]:
    """(entry, ground truth) pairs of a BFCL category, with function docs as BFCL's loader fills them; an
    evenly spaced sample of `entries` when given."""
    utils = _bfcl()
    data = utils.load_dataset_entry(category)
    answers = {a["id"]: a for a in utils.load_ground_truth_entry(category)}
    pairs = [(e, answers[e["id"]]) for e in data]
    if entries is not None and entries < len(pairs):
        pairs = [pairs[i * len(pairs) // entries] for i in range(entries)]
    return pairs


# -- calls as BFCL executes them ----------------------------------------------------------------------

def call_string(call: ToolCall) -> str:
    """A call in BFCL's execution syntax (`convert_to_function_call`: `name(k=repr(v),...)`)."""
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def _is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def safe_call_strings(calls: Sequence[ToolCall], methods: set[str]) -> list[str]:
    """The calls as BFCL strings, each naming a backend method with identifier keywords. BFCL `eval`s these
    strings; anything else (a builtin, an injected expression) is replaced by a call that fails as an unknown
    function does, so it changes no state and executes nothing."""
    out = []
    for call in calls:
        if call.name in methods and all(isinstance(k, str) and _is_name(k) for k in call.arguments):
            out.append(call_string(call))
        else:
            out.append("spade_unknown_function()")
    return out


def ground_truth_calls(strings: Sequence[str], entry: dict) -> list[ToolCall]:
    """BFCL's ground-truth call strings as ToolCalls (positional arguments named from the backend method)."""
    import importlib
    import inspect

    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    signatures = {}
    for class_name in entry["involved_classes"]:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            signatures.setdefault(name, inspect.signature(fn))
    calls = []
    for text in strings:
        node = ast.parse(text, mode="eval").body
        name = node.func.id
        params = [p for p in signatures[name].parameters if p != "self"]
        arguments = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
        arguments.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
        calls.append(ToolCall(name, arguments))
    return calls


# -- multi-turn play and scoring -----------------------------------------------------------------------

_run_ids = itertools.count()


def _fresh_name() -> str:
    """A name unique to one episode or one scoring: BFCL keeps backend instances in its module's globals
    under the model name and entry id, so reusing a name would continue an earlier episode's state."""
    return f"spade_{uuid.uuid4().hex[:12]}_{next(_run_ids)}"


def _forget(name: str) -> None:
    """Drops the backend instances BFCL kept for `name` (and its `_eval` / `_ground_truth_eval` copies)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
        del vars(multi_turn_utils)[key]


def _long_context(entry: dict) -> bool:
    category = entry["id"].rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


@dataclasses.dataclass
class _Episode:
    entry: dict
    answer: dict
    name: str
    messages: list = dataclasses.field(default_factory=list)
    turn: int = -1
    steps: int = 0
    model_steps: int = 0
    calls_per_turn: list = dataclasses.field(default_factory=list)  # [turn][step] -> BFCL call strings
    force_quit: bool = False
    done: bool = False
    methods: set = dataclasses.field(default_factory=set)

    def start_turn(self) -> None:
        """Opens the next user turn (BFCL's prompt for held-out functions on a miss_func turn); done at the end."""
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

        self.turn += 1
        self.steps = 0
        if self.turn >= len(self.entry["question"]):
            self.done = True
            return
        turn_messages = list(self.entry["question"][self.turn])
        held_out = self.entry.get("missed_function", {})
        if str(self.turn) in held_out:
            text = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out[str(self.turn)])
            turn_messages = [{"role": "user", "content": text}]
        self.messages.extend(turn_messages)
        self.calls_per_turn.append([])


def _instances(episode: _Episode, calls: list[str]):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    entry = episode.entry
    return execute_multi_turn_func_call(calls, entry.get("initial_config", {}), entry["involved_classes"],
                                        episode.name, entry["id"], long_context=_long_context(entry))


def play_multi_turn(complete: Callable[[list[str]], list[str]], tokenizer: Any, pairs: Sequence[tuple[dict, dict]],
                    *, batch_size: int | None = None, on_done: Callable[[], None] | None = None) -> list[_Episode]:
    """Plays BFCL multi-turn entries, all live entries batched per model step. `complete` maps rendered
    prompt texts to reply texts."""
    episodes = []
    for entry, answer in pairs:
        episode = _Episode(entry, answer, _fresh_name())
        _, instances = _instances(episode, [])
        episode.methods = {m for inst in instances.values() for m in dir(inst)
                           if not m.startswith("_") and callable(getattr(inst, m))}
        episode.start_turn()
        episodes.append(episode)
    try:
        while True:
            live = [e for e in episodes if not e.done]
            if not live:
                break
            size = batch_size or len(live)
            for start in range(0, len(live), size):
                batch = live[start:start + size]
                prompts = [render_tool_chat(tokenizer, e.messages, e.entry["function"]) for e in batch]
                for episode, reply in zip(batch, complete(prompts)):
                    _advance(episode, reply)
                    if episode.done and on_done is not None:
                        on_done()
    finally:
        for episode in episodes:
            _forget(episode.name)
    return episodes


def _advance(episode: _Episode, reply: str) -> None:
    episode.messages.append(assistant_message(reply))
    episode.model_steps += 1
    calls = list(parse_tool_calls(reply).calls)
    if not calls:  # BFCL: a step without a decodable call ends the user turn
        episode.start_turn()
        return
    strings = safe_call_strings(calls, episode.methods)
    episode.calls_per_turn[-1].append(strings)
    results, _ = _instances(episode, strings)
    episode.messages.extend(tool_messages(results))
    episode.steps += 1
    if episode.steps > MAX_STEPS:
        episode.force_quit = episode.done = True


def score_multi_turn(entry: dict, answer: dict, calls_per_turn: Sequence[Sequence[Sequence[str]]]) -> dict:
    """BFCL's verdict on a transcript ([turn][step] -> call strings): a force-quit transcript (fewer turns)
    fails; else `multi_turn_checker` replays it and the ground truth on fresh backends and, after each turn,
    compares the instances' state and requires the ground truth's execution results among the model's."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    truth = answer["ground_truth"]
    if len(calls_per_turn) != len(truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    decoded = [[list(step) for step in turn if step] for turn in calls_per_turn]
    name = _fresh_name()
    try:
        category = entry["id"].rsplit("_", 1)[0]
        return multi_turn_checker(decoded, truth, {k: v for k, v in entry.items() if k != "function"}, category,
                                  name)
    finally:
        _forget(name)


# -- single-turn AST categories ------------------------------------------------------------------------

def _ast_checker():
    """BFCL's `ast_checker`. Its module imports the model registry (every API SDK) only to ask whether a
    model renames dots in function names; our agent writes names as given, so when those SDKs are absent a
    registry that answers "no renaming" stands in while the checker module loads."""
    try:
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        return ast_checker
    except ImportError:
        pass
    _bfcl()
    name = "bfcl_eval.constants.model_config"
    saved = sys.modules.get(name)

    class _NoRenaming(dict):
        def __missing__(self, key):
            return types.SimpleNamespace(underscore_to_dot=False)

    registry = types.ModuleType(name)
    registry.MODEL_CONFIG_MAPPING = _NoRenaming()
    sys.modules[name] = registry
    try:
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved
    return ast_checker


def score_ast(entry: dict, answer: dict, reply: str, category: str) -> dict:
    """BFCL's AST verdict on a single-turn reply: its well-formed calls as `[{name: arguments}]` (what BFCL's
    Qwen FC handler decodes) checked against the possible answers."""
    from bfcl_eval.constants.enums import Language

    decoded = [{c.name: dict(c.arguments)} for c in parse_tool_calls(reply).calls]
    if not decoded:
        return {"valid": False, "error_type": "ast_decoder:no_call"}
    return _ast_checker()(entry["function"], decoded, answer["ground_truth"], Language.PYTHON, category,
                          "spade_agent")


def play_ast(complete: Callable[[list[str]], list[str]], tokenizer: Any, pairs: Sequence[tuple[dict, dict]],
             *, batch_size: int | None = None, on_done: Callable[[], None] | None = None) -> list[str]:
    """One reply per single-turn entry (its question with its functions as tools)."""
    prompts = [render_tool_chat(tokenizer, [m for turn in e["question"] for m in turn], e["function"])
               for e, _ in pairs]
    size = batch_size or max(len(prompts), 1)
    replies: list[str] = []
    for start in range(0, len(prompts), size):
        replies.extend(complete(prompts[start:start + size]))
        if on_done is not None:
            for _ in prompts[start:start + size]:
                on_done()
    return replies


# -- the suite -----------------------------------------------------------------------------------------

def evaluate_tools(complete: Callable[[list[str]], list[str]], tokenizer: Any, suite: ToolSuite | str, *,
                   batch_size: int | None = None, progress: bool = False) -> EvalReport:
    """Plays and scores every sampled entry of `suite`; one task per category, the entry's index as its seed."""
    if isinstance(suite, str):
        suite = get_tool_suite(suite)
    plans = {c: load_category(c, suite.entries) for c in suite.categories}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(p) for p in plans.values()), desc=f"eval {suite.name}", unit="entry", leave=False)
    on_done = None if bar is None else (lambda: bar.update(1))
    results: list[EpisodeResult] = []
    try:
        for category, pairs in plans.items():
            if category in MULTI_TURN:
                for episode in play_multi_turn(complete, tokenizer, pairs, batch_size=batch_size, on_done=on_done):
                    verdict = ({"valid": False, "error_type": "multi_turn:force_terminated"} if episode.force_quit
                               else score_multi_turn(episode.entry, episode.answer, episode.calls_per_turn))
                    results.append(_result(category, episode.entry, verdict, episode.model_steps))
            else:
                replies = play_ast(complete, tokenizer, pairs, batch_size=batch_size, on_done=on_done)
                for (entry, answer), reply in zip(pairs, replies):
                    results.append(_result(category, entry, score_ast(entry, answer, reply, category), 1))
    finally:
        if bar is not None:
            bar.close()
    tasks = []
    for category in suite.categories:
        mine = [r for r in results if r.env_id == f"bfcl:{category}"]
        wins = sum(r.success for r in mine)
        low, high = wilson_interval(wins, len(mine))
        tasks.append(TaskResult(f"bfcl:{category}", len(mine), wins, wins / len(mine), low, high,
                                sum(r.total_reward for r in mine) / len(mine), sum(r.turns for r in mine) / len(mine)))
    mean, low, high = macro_interval([(t.successes, t.episodes) for t in tasks])
    return EvalReport(suite.name, 0, tuple(tasks), tuple(results), mean, low, high)


def _result(category: str, entry: dict, verdict: dict, steps: int) -> EpisodeResult:
    valid = bool(verdict.get("valid"))
    index = int(re.sub(r".*_", "", entry["id"]))
    error = None if valid else str(verdict.get("error_type", "invalid"))
    return EpisodeResult(f"bfcl:{category}", index, valid, steps, float(valid), float(valid), error)
