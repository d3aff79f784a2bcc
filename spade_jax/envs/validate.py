"""Validation of an environment program: static checks, then contract, determinism, turn-limit
and solvability checks run in the sandbox (with tool probes for a tool-use program), summed up in a
structured, JSON-able Verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

from spade_jax.envs.api import episode_reward, extract_boxed
from spade_jax.envs.backends import BACKEND_CHOICES, get_backend, select_backend
from spade_jax.envs.backends.sandbox import EnvError, EnvTimeout, SandboxConfig, SandboxEnv, SandboxPool
from spade_jax.envs.program import ProgramError, check_imports, find_env_class, parse_program
from spade_jax.envs.tool_use import check_tool_specs, is_tool_use_program, probe_actions as tool_probe_actions

__all__ = ["ValidationConfig", "Verdict", "CHECKS", "validate", "plan_to_actions"]

# Every check, in the order run; a check after a failed one is skipped (ok None).
# "tools" checks a tool-use program's declared tools (None for a game).
CHECKS = ("syntax", "imports", "class", "load", "reset", "tools", "step", "episode_length", "determinism", "solution")


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
    # Seeds reset must handle (non-empty str observation, dict info).
    seeds: tuple[int, ...] = (0, 1, 2, 12345)
    # Actions step must survive, each right after a reset: SPADE's probes, an empty string
    # and a long string.
    probe_actions: tuple[str, ...] = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}", "", "a" * 20_000)
    # Turn limit when the environment declares none (max_turns / MAX_TURNS attribute).
    max_turns: int = 25
    # Largest turn limit an environment may declare.
    max_declared_turns: int = 100
    # Rewards must be finite and within [-reward_bound, reward_bound].
    reward_bound: float = 10.0
    # Seeds whose episodes are played twice, on two instances, and must match.
    determinism_seeds: tuple[int, ...] = (0, 7)
    # Seeds on which solution() is replayed and must win.
    solution_seeds: tuple[int, ...] = (0, 1)
    # Episode reward (last reward clipped to [-1, 1] when terminated) that counts as a win.
    win_threshold: float = 1.0
    # Wall-clock budget of one validation, seconds (SPADE: 60 s).
    budget_s: float = 60.0
    # Wall-clock limit of one reset/step/solution call, seconds (SPADE: 30 s).
    step_timeout_s: float = 30.0
    # Address-space limit of the sandbox process, MiB, when validate() makes its own pool.
    memory_mb: int = 1024

    def __post_init__(self):
        if not self.seeds or not all(isinstance(s, int) for s in self.seeds):
            raise ValueError(f"ValidationConfig.seeds must be a non-empty tuple of ints, got {self.seeds!r}")
        if not all(isinstance(a, str) for a in self.probe_actions):
            raise ValueError("ValidationConfig.probe_actions must be strings")
        if not isinstance(self.max_turns, int) or not 1 <= self.max_turns <= self.max_declared_turns:
            raise ValueError(
                f"ValidationConfig.max_turns must be an int in [1, max_declared_turns], got {self.max_turns!r}"
            )
        for name in ("seeds", "determinism_seeds", "solution_seeds"):
            if any(not isinstance(s, int) or s < 0 for s in getattr(self, name)):
                raise ValueError(f"ValidationConfig.{name} must be ints >= 0, got {getattr(self, name)!r}")
        if not 0 < self.reward_bound < math.inf:
            raise ValueError(f"ValidationConfig.reward_bound must be a finite number > 0, got {self.reward_bound}")
        if not 0 < self.budget_s < math.inf or not 0 < self.step_timeout_s < math.inf:
            raise ValueError(f"ValidationConfig.budget_s and step_timeout_s must be finite numbers > 0, got "
                             f"{self.budget_s}, {self.step_timeout_s}")
        if not -1.0 <= self.win_threshold <= 1.0:
            raise ValueError(f"ValidationConfig.win_threshold must be in [-1, 1], got {self.win_threshold}")
        if self.memory_mb < 128:
            raise ValueError(f"ValidationConfig.memory_mb must be >= 128, got {self.memory_mb}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of validate(): `valid`, the failing checks' messages in `errors`, every check's
    {ok, message} in `checks` (ok None when skipped)."""

    valid: bool  # every check passed
    backend: str | None  # the backend certified ("jax", "sandbox"), or None when the program never ran
    errors: list[str]  # one learnable line per failed check (non-empty when invalid)
    checks: dict[str, dict[str, Any]]  # check name -> {"ok": bool | None, "message": str}
    solvable: bool | None  # solution() replayed and won; None without solution()
    class_name: str | None  # the environment class found
    isolation: dict[str, Any]  # sandbox layers used (see sandbox.detect_isolation)
    seconds: float  # wall time of the validation
    max_turns: int | None = None  # turn limit used for the episode checks
    backend_reason: str | None = None  # why the backend asked for (auto: the preferred ones) was not used

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, default=str)


class _Failed(Exception):
    def __init__(self, check: str, message: str):
        super().__init__(message)
        self.check = check


class _Budget:
    def __init__(self, config: ValidationConfig):
        self.config = config
        self.deadline = time.monotonic() + config.budget_s

    def timeout(self, check: str) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Failed(
                check, f"validation exceeded its {self.config.budget_s:g} s budget; make reset() and step() faster"
            )
        return min(self.config.step_timeout_s, remaining)


def plan_to_actions(plan: str | list[str]) -> list[str]:
    """solution()'s plan as agent texts: a list is one action per item (a bare command is boxed; a
    reply with a tool call or an <answer> is kept as it is); a str holding \\boxed{...} commands is one
    action per box; any other str is one boxed action."""
    if isinstance(plan, list):
        return [a if any(mark in a for mark in _REPLY_MARKS) else f"\\boxed{{{a}}}" for a in plan]
    boxes = []
    rest = plan
    while True:
        content = extract_boxed(rest)
        if content is None:
            break
        boxes.append(f"\\boxed{{{content}}}")
        rest = rest[: rest.rfind("\\boxed")]
    if boxes:
        return boxes[::-1]
    return [f"\\boxed{{{plan.strip()}}}"]


_REPLY_MARKS = ("\\boxed", "<tool_call>", "<answer>")  # a plan item holding one of these is a whole reply


def _short(text: str, n: int = 60) -> str:
    text = repr(text)
    return text if len(text) <= n else text[: n - 5] + "...'"


def _check_reward(reward: float, action: str, config: ValidationConfig) -> None:
    if not math.isfinite(reward):
        raise _Failed(
            "step", f"step({_short(action)}) returned a non-finite reward ({reward}); rewards must be finite floats"
        )
    if abs(reward) > config.reward_bound:
        raise _Failed(
            "step",
            f"step({_short(action)}) returned reward {reward:g}, "
            f"outside [-{config.reward_bound:g}, {config.reward_bound:g}]; "
            "use 1.0 for a win and 0.0 otherwise",
        )


def _check_tool_probe(what: str, action: str, info: dict) -> None:
    """A tool-use step must report malformed calls in info["malformed_tool_calls"] and serve every
    tool it declares."""
    malformed = info.get("malformed_tool_calls")
    if not isinstance(malformed, list):
        raise _Failed("step", f"step() on {what} returned info without a 'malformed_tool_calls' list; "
                              "let ToolEnv.step handle replies")
    if what in ("a call with broken JSON", "a call without a name", "an unclosed call") and not malformed:
        raise _Failed("step", f"step() on {what} reported no malformed tool call; let ToolEnv.step handle replies")
    if what.startswith("a call of ") and "without" not in what:
        for error in info.get("tool_errors") or []:
            if isinstance(error, dict) and str(error.get("error", "")).startswith("unknown tool"):
                raise _Failed("tools", f"tool {error.get('name')!r} is declared in TOOLS but the class has no "
                                       f"tool_{error.get('name')} method")


def _call(check: str, budget: _Budget, fn, *args, **kwargs):
    try:
        return fn(*args, timeout=budget.timeout(check), **kwargs)
    except EnvTimeout as exc:
        if budget.deadline - time.monotonic() <= 0.05:
            raise _Failed(check, f"{exc} (validation budget {budget.config.budget_s:g} s)") from None
        raise _Failed(check, str(exc)) from None
    except EnvError as exc:
        raise _Failed(check, str(exc)) from None


def _play(env: SandboxEnv, seed: int, actions: list[str], budget: _Budget, check: str, config: ValidationConfig):
    """Reset then step through `actions` until the episode ends; the trace of (obs, reward,
    terminated, truncated) for comparison."""
    obs, _ = _call(check, budget, env.reset, seed=seed)
    trace = [(obs,)]
    for action in actions:
        obs, reward, terminated, truncated, _ = _call(check, budget, env.step, action)
        trace.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            break
    return trace


def _episode_actions(config: ValidationConfig, turns: int, offset: int = 0, probes: tuple[str, ...] = ()) -> list[str]:
    short = [a for a in (*probes, *config.probe_actions) if len(a) < 1000] or ["\\boxed{1}"]
    return [short[(i + offset) % len(short)] for i in range(turns)]


def _run_checks(source: str, config: ValidationConfig, pool: SandboxPool, record, facts: dict[str, Any]) -> None:
    try:
        tree = parse_program(source)
        record("syntax", True, "parses")
        check_imports(tree)
        record("imports", True, "standard library and numpy only")
        class_name = find_env_class(tree)
        facts["class_name"] = class_name
        record("class", True, class_name)
    except ProgramError as exc:
        raise _Failed(exc.check, str(exc)) from None

    budget = _Budget(config)
    if len(source) > pool.config.max_input_chars:
        raise _Failed("load", f"the program has {len(source)} characters; the limit is {pool.config.max_input_chars}")
    try:
        env = pool.load(source, class_name, timeout=budget.timeout("load"))
    except EnvTimeout as exc:
        raise _Failed("load", f"{exc}; module-level code and __init__ must finish quickly") from None
    except EnvError as exc:
        raise _Failed("load", str(exc)) from None
    facts["backend"] = "sandbox"  # where these checks run, whichever backend is certified below
    try:
        record("load", True, f"{class_name}() constructed in the sandbox")

        # reset: several seeds, non-empty str and dict (types are enforced by the worker).
        for seed in config.seeds:
            obs, info = _call("reset", budget, env.reset, seed=seed)
            if not obs.strip():
                raise _Failed(
                    "reset",
                    f"reset(seed={seed}) returned an empty observation; "
                    "describe the task, the state and the legal actions",
                )
        record("reset", True, f"seeds {list(config.seeds)}")

        # tools (tool-use programs): the declared tools, then tool-call probes in step.
        tool_probes: list[tuple[str, str]] = []
        if is_tool_use_program(tree):
            _, info = _call("tools", budget, env.reset, seed=config.seeds[0])
            problem = check_tool_specs(info.get("tools"))
            if problem:
                raise _Failed("tools", problem)
            tool_probes = tool_probe_actions(info["tools"])
            record("tools", True, ", ".join(spec["function"]["name"] for spec in info["tools"]))
        else:
            record("tools", None, "not a tool-use program")

        # step: each probe right after a reset.
        for what, action in [*tool_probes, *((None, a) for a in config.probe_actions)]:
            _call("step", budget, env.reset, seed=config.seeds[0])
            _, reward, _, _, info = _call("step", budget, env.step, action)
            _check_reward(reward, action, config)
            if what is not None:
                _check_tool_probe(what, action, info)
        record("step", True, f"{len(tool_probes) + len(config.probe_actions)} probe actions")
        episode_probes = tuple(action for _, action in tool_probes)

        # episode_length: the declared turn limit holds.
        declared = _call("episode_length", budget, env.declared_turns)
        declared = declared if declared is not None else env.max_turns
        if declared is not None and not 1 <= declared <= config.max_declared_turns:
            raise _Failed(
                "episode_length", f"declared max_turns={declared} is outside [1, {config.max_declared_turns}]"
            )
        limit = declared or config.max_turns
        facts["max_turns"] = limit
        for seed in config.seeds[:2]:
            trace = _play(env, seed, _episode_actions(config, limit, probes=episode_probes), budget,
                          "episode_length", config)
            for entry in trace[1:]:
                _check_reward(entry[1], "<episode>", config)
            last = trace[-1]
            if len(trace) - 1 >= limit and not (last[2] or last[3]):
                raise _Failed(
                    "episode_length",
                    f"the episode (seed {seed}) did not end within {limit} steps; return truncated=True once "
                    f"{'max_turns' if declared else 'the turn limit of ' + str(config.max_turns)} steps were taken",
                )
        record("episode_length", True, f"episodes end within {limit} steps")

        # determinism: two instances, the same seeds and actions, the same episodes.
        twin = _call("determinism", budget, env.clone)
        try:
            for k, seed in enumerate(config.determinism_seeds):
                actions = _episode_actions(config, limit, offset=k, probes=episode_probes)
                first = _play(env, seed, actions, budget, "determinism", config)
                second = _play(twin, seed, actions, budget, "determinism", config)
                again = _play(env, seed, actions, budget, "determinism", config)
                for other, who in ((second, "a second instance"), (again, "the same instance reset again")):
                    if other != first:
                        turn = next(i for i, (a, b) in enumerate(zip(first + [None], other + [None])) if a != b)
                        what = "reset observation" if turn == 0 else f"step {turn}"
                        raise _Failed(
                            "determinism",
                            f"seed {seed} gave a different {what} on {who}; draw all randomness from "
                            "random.Random(seed) created in reset, not from global or time-based state",
                        )
        finally:
            twin.close()
        record("determinism", True, f"seeds {list(config.determinism_seeds)} replay identically")

        # solution: replayed, must win.
        if not env.has_solution:
            record("solution", None, "no solution() method; solvability unknown")
            facts["solvable"] = None
        else:
            for seed in config.solution_seeds:
                _call("solution", budget, env.reset, seed=seed)
                plan = _call("solution", budget, env.solution)
                actions = plan_to_actions(plan)
                if not actions:
                    raise _Failed("solution", f"solution() returned an empty plan for seed {seed}")
                reward, terminated, steps = 0.0, False, 0
                for action in actions[: max(limit, 1)]:
                    _, reward, terminated, truncated, _ = _call("solution", budget, env.step, action)
                    steps += 1
                    if terminated or truncated:
                        break
                won = episode_reward(reward, terminated) >= config.win_threshold
                if not won:
                    facts["solvable"] = False
                    how = "terminated" if terminated else "did not terminate"
                    raise _Failed(
                        "solution",
                        f"replaying solution() for seed {seed} ({len(actions)} actions) {how} after {steps} steps "
                        f"with reward {reward:g}; it must win (reward >= {config.win_threshold:g} on the final, "
                        "terminating step)",
                    )
            facts["solvable"] = True
            record("solution", True, f"solution() wins on seeds {list(config.solution_seeds)}")
    finally:
        env.close()


def validate(
    source: str,
    *,
    config: ValidationConfig | None = None,
    pool: SandboxPool | None = None,
    backend: str | None = "auto",
) -> Verdict:
    """Validate one environment program's text (for designer output, pass
    program.extract_code(text)). Program faults never raise: they make the verdict invalid.
    SandboxError (e.g. SandboxUnavailable, a worker that cannot start) does raise.
    `backend` is the backend to certify (one of BACKEND_CHOICES), or None for the program's checks
    alone (the caller picks the backend itself)."""
    if backend is not None and backend not in BACKEND_CHOICES:
        raise ValueError(f"backend must be {', '.join(BACKEND_CHOICES)} or None, got {backend!r}")
    if not isinstance(source, str):
        raise TypeError(f"validate() takes the program as a str, got {type(source).__name__}")
    config = config or ValidationConfig()
    start = time.monotonic()
    checks: dict[str, dict[str, Any]] = {name: {"ok": None, "message": "skipped"} for name in CHECKS}
    errors: list[str] = []

    def record(name: str, ok: bool | None, message: str) -> None:
        checks[name] = {"ok": ok, "message": message}

    own_pool = pool is None
    if own_pool:
        pool = SandboxPool(
            SandboxConfig(
                workers=0,
                call_timeout_s=config.step_timeout_s,
                load_timeout_s=config.step_timeout_s,
                memory_mb=config.memory_mb,
                cpu_seconds=max(10, int(config.budget_s * 2)),
            )
        )
    facts: dict[str, Any] = {}
    chosen, reason = None, None
    try:
        try:
            _run_checks(source, config, pool, record, facts)
        except _Failed as exc:
            record(exc.check, False, str(exc))
            errors.append(f"{exc.check}: {exc}")
        chosen = facts.get("backend")
        if not errors and backend is not None:
            # The program is sound; now see which backend takes it (a backend's own checks, such
            # as the JAX backend's equivalence check, run the program in this pool).
            chosen, reason = select_backend(source, facts["class_name"], backend, pool=pool)
            if backend != "auto" and chosen != backend:
                errors.append(f"backend: the {get_backend(backend).title} backend cannot run this program: {reason}")
    finally:
        if own_pool:
            pool.close()
    valid = not errors
    return Verdict(
        valid=valid,
        backend=chosen if facts.get("backend") else None,
        errors=errors,
        checks=checks,
        solvable=facts.get("solvable"),
        class_name=facts.get("class_name"),
        isolation=pool.isolation,
        seconds=round(time.monotonic() - start, 4),
        max_turns=facts.get("max_turns"),
        backend_reason=reason,
    )
