"""reasoning-gym items that are the same in every process.

Some generators draw from a set of strings (reasoning-gym 0.1.23's `ransom_note` picks letters with
`rng.choice(list(self.letters))`), and a set's order follows the process's string-hash seed, which
Python draws afresh for every process: the same task and seed gave another question in each run, so two
evaluations of one model differed (29 and 31 of 60 `ransom_note` items solved). Unless this process was
started with PYTHONHASHSEED=0, items are built and scored in a helper process that was (`serve`: one
JSON request and reply per line), started on first use and kept for this process's lifetime.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from spade_jax.envs.api import saved_global_rng

HASH_SEED = "0"  # the helper's PYTHONHASHSEED
# The helper imports spade_jax from where this process did, whatever its sys.path was made of.
_PACKAGE_PATH = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))


def parse_rg_task(spec: str) -> tuple[str, dict[str, Any]]:
    """A task spec's reasoning-gym dataset and config: "basic_arithmetic" -> ("basic_arithmetic", {}),
    "chain_sum(max_terms=2, max_digits=1)" -> ("chain_sum", {"max_terms": 2, "max_digits": 1}): the
    generator at a chosen difficulty, with its config fields set to Python literals (lists as tuples).
    Raises ValueError naming what is wrong: the syntax, an unknown dataset or an unknown field."""
    from reasoning_gym.factory import DATASETS

    usage = "write e.g. 'rg:chain_sum' or 'rg:chain_sum(max_terms=2, max_digits=1)'"
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"reasoning-gym task {spec!r} does not parse; {usage}") from None
    if isinstance(node, ast.Name):
        name, keywords = node.id, []
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
          and all(k.arg for k in node.keywords)):
        name, keywords = node.func.id, node.keywords
    else:
        raise ValueError(f"reasoning-gym task {spec!r} is not name or name(field=value, ...); {usage}")
    if name not in DATASETS:
        raise ValueError(f"unknown reasoning-gym task {name!r} in {spec!r}")
    fields = {f.name for f in dataclasses.fields(DATASETS[name][1])} - {"seed", "size"}
    config = {}
    for keyword in keywords:
        if keyword.arg not in fields:
            raise ValueError(f"reasoning-gym task {spec!r}: {name} has no config field {keyword.arg!r}; "
                             f"its fields: {', '.join(sorted(fields))}")
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError):
            raise ValueError(f"reasoning-gym task {spec!r}: {keyword.arg}={ast.unparse(keyword.value)} is not a "
                             "Python literal") from None
        config[keyword.arg] = tuple(value) if isinstance(value, list) else value
    return name, config


def rg_dataset(spec: str) -> str:
    """The reasoning-gym dataset a task spec names, its config left out: "chain_sum(max_terms=2)" ->
    "chain_sum" (an "rg:" prefix is dropped too)."""
    return spec.removeprefix("rg:").split("(", 1)[0].strip()


def rg_item(name: str, seed: int) -> dict[str, str]:
    """Item `seed` of reasoning-gym task `name` (a `parse_rg_task` spec): {"question": ..., "answer": ...}
    (the answer as text)."""
    return _request({"op": "item", "name": name, "seed": seed})


def rg_score(name: str, seed: int, answer: str) -> float:
    """The task's score in [0, 1] for `answer` to item `seed` (0 when the scorer raises or is not finite)."""
    return _request({"op": "score", "name": name, "seed": seed, "answer": answer})


def _request(request: dict) -> Any:
    if not sys.flags.hash_randomization:  # started with PYTHONHASHSEED=0, as the helper is
        return _answer(request)
    return _HELPER.ask(request)


class _Helper:
    """The helper process, (re)started on demand; one request at a time."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def ask(self, request: dict) -> Any:
        line = json.dumps(request) + "\n"
        with self._lock:
            for _ in range(2):
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-c", "from spade_jax.evaluation.rg_items import serve; serve()"],
                        env={**os.environ, "PYTHONHASHSEED": HASH_SEED, "PYTHONPATH": _PACKAGE_PATH},
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                    )
                try:
                    self._proc.stdin.write(line)
                    self._proc.stdin.flush()
                    reply = self._proc.stdout.readline()
                except (BrokenPipeError, OSError):
                    reply = ""
                if reply:
                    break
                self._proc.kill()  # it died (killed, out of memory): one fresh start, then the error
                self._proc = None
            else:
                raise RuntimeError("the reasoning-gym helper process (spade_jax.evaluation.rg_items) exited twice "
                                   "without answering; its error is above")
        try:
            reply = json.loads(reply)
        except ValueError:
            raise RuntimeError(f"the reasoning-gym helper process answered {reply[:80]!r}, not JSON") from None
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["result"]


_HELPER = _Helper()


@functools.lru_cache(maxsize=64)
def _dataset(name: str, seed: int):
    import reasoning_gym

    with saved_global_rng():
        dataset_name, config = parse_rg_task(name)
        dataset = reasoning_gym.create_dataset(dataset_name, size=1, seed=seed, **config)
        return dataset, dataset[0]


def _answer(request: dict) -> Any:
    dataset, entry = _dataset(request["name"], int(request["seed"]))
    if request["op"] == "item":
        return {"question": str(entry["question"]), "answer": str(entry["answer"])}
    try:
        with saved_global_rng():
            score = float(dataset.score_answer(request["answer"], entry))
    except Exception:  # some scorers raise on malformed answers: unsolved
        return 0.0
    return score if math.isfinite(score) else 0.0


def serve() -> None:
    """The helper's loop: a JSON request per line on stdin, its reply on stdout (anything else the
    generators print goes to stderr)."""
    replies, sys.stdout = sys.stdout, sys.stderr
    for line in sys.stdin:
        try:
            reply = {"result": _answer(json.loads(line))}
        except Exception as err:  # a bad task name or seed: the caller raises it
            reply = {"error": f"reasoning-gym: {type(err).__name__}: {err}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
