"""Command line for environment programs: `check FILE [--json]` validates one, `play FILE`
lets a person play one in the terminal; both run the program in the sandbox."""

from __future__ import annotations

import argparse
import json
import math
import sys

from spade_jax.envs.backends import BACKEND_CHOICES
from spade_jax.envs.program import ProgramError, extract_code, find_env_class

EXIT_VALID, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def _failure_json(error: str) -> str:
    """The `check --json` line for a check that never got to a verdict."""
    return json.dumps({"valid": False, "backend": None, "errors": [error], "checks": {}})


def _read_program(path: str, as_json: bool = False) -> str:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            text = f.read()
    except OSError as exc:
        raise SystemExit(_usage_error(f"cannot read {path}: {exc.strerror or exc}", as_json)) from None
    if "```" in text:
        try:
            return extract_code(text)
        except ProgramError:
            return text
    return text


def _usage_error(message: str, as_json: bool = False) -> int:
    """One line on stderr (and, for --json, the failure JSON as stdout's last line); exit status 2."""
    if as_json:
        print(_failure_json(f"usage: {message}"), flush=True)
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _wants_json(argv: list[str]) -> bool:
    """--json anywhere on the command line (as argparse would read it, abbreviations included)."""
    return any(a.split("=", 1)[0] in ("--j", "--js", "--jso", "--json") for a in argv)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors keep the --json promise: the last stdout line is JSON."""

    json_errors = False

    def error(self, message):
        if _Parser.json_errors:
            print(_failure_json(f"usage: {message}"), flush=True)
        super().error(message)


def _sandbox_config(args):
    from spade_jax.envs.backends.sandbox import SandboxConfig

    return SandboxConfig(
        workers=0,
        call_timeout_s=args.step_timeout,
        load_timeout_s=args.step_timeout,
        memory_mb=args.memory_mb,
        allow_unisolated=args.allow_unisolated,
    )


def cmd_check(args) -> int:
    from spade_jax.envs.backends.sandbox import SandboxError, SandboxPool, SandboxUnavailable
    from spade_jax.envs.validate import ValidationConfig, validate

    source = _read_program(args.file, as_json=args.json)
    try:
        config = ValidationConfig(budget_s=args.timeout, step_timeout_s=args.step_timeout, memory_mb=args.memory_mb)
        pool = SandboxPool(_sandbox_config(args))
    except (ValueError, SandboxUnavailable) as exc:
        if args.json:
            print(_failure_json(f"sandbox: {exc}"))
        return _usage_error(str(exc))
    try:
        verdict = validate(source, config=config, pool=pool, backend=args.backend)
    except SandboxError as exc:
        if args.json:
            print(_failure_json(f"sandbox: {exc}"))
        return _usage_error(f"sandbox failure: {exc}")
    finally:
        pool.close()
    if args.json:
        out = verdict.to_dict()
        if not verdict.valid:
            out["backend"] = None  # no backend is certified to run an invalid program
        print(json.dumps(out, default=str))
    else:
        status = "VALID" if verdict.valid else "INVALID"
        print(f"{status} {args.file}: class {verdict.class_name or '?'}, backend {verdict.backend or '-'}, "
              f"{verdict.seconds:.2f} s, sandbox {verdict.isolation.get('backend')}")
        for name, check in verdict.checks.items():
            mark = {True: "ok  ", False: "FAIL", None: "-   "}[check["ok"]]
            print(f"  {mark} {name:<15} {check['message']}")
        if verdict.solvable is not None:
            print(f"  solvable: {verdict.solvable}")
        if verdict.backend_reason:
            print(f"  backend note: {verdict.backend_reason}")
    return EXIT_VALID if verdict.valid else EXIT_INVALID


def cmd_play(args) -> int:
    from spade_jax.envs.api import episode_reward
    from spade_jax.envs.backends.sandbox import EnvError, SandboxPool, SandboxUnavailable

    source = _read_program(args.file)
    try:
        class_name = find_env_class(source)
    except ProgramError as exc:
        return _usage_error(str(exc))
    try:
        pool = SandboxPool(_sandbox_config(args))
    except SandboxUnavailable as exc:
        return _usage_error(str(exc))
    print(f"Playing {class_name} from {args.file}. Type an action (plain text is sent as \\boxed{{...}}; a line with "
          "<tool_call> or <answer> as it is),")
    print("':raw TEXT' to send TEXT unchanged, ':solution' for the program's plan, ':quit' to stop.")
    try:
        env = pool.load(source, class_name)
        for episode in range(args.episodes):
            seed = args.seed + episode
            obs, _ = env.reset(seed=seed)
            print(f"\n=== episode {episode + 1}, seed {seed} ===\n{obs}")
            reward, terminated = 0.0, False
            for turn in range(1, args.max_turns + 1):
                try:
                    line = input(f"[turn {turn}] action> ")
                except EOFError:
                    print()
                    return 0
                line = line.strip()
                if line in (":q", ":quit", ":exit"):
                    return 0
                if line == ":solution":
                    if env.has_solution:
                        print(env.solution())
                    else:
                        print("(this environment has no solution() method)")
                    continue
                # A line that is already a reply (a \\boxed command, a tool call, an answer) is sent as it is.
                whole = any(mark in line for mark in ("\\boxed", "<tool_call>", "<answer>"))
                action = line[5:] if line.startswith(":raw ") else (line if whole else f"\\boxed{{{line}}}")
                obs, reward, terminated, truncated, info = env.step(action)
                print(
                    f"{obs}\n  reward {reward:g}"
                    + ("  [terminated]" if terminated else "")
                    + ("  [truncated]" if truncated else "")
                )
                if terminated or truncated:
                    break
            else:
                print(f"(turn limit {args.max_turns} reached)")
            print(f"=== episode reward {episode_reward(reward, terminated):g} ===")
    except EnvError as exc:
        print(f"environment error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print()
        return 0
    finally:
        pool.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m spade_jax.envs", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("file", help="environment program (.py, or designer text with a ```python block)")
        p.add_argument("--step-timeout", type=float, default=30.0, help="seconds per reset/step call (default 30)")
        p.add_argument("--memory-mb", type=int, default=1024, help="sandbox address-space limit in MiB (default 1024)")
        p.add_argument("--allow-unisolated", action="store_true",
                       help="run even when no namespace isolation is available (unsafe)")

    check = sub.add_parser("check", help="validate an environment program")
    common(check)
    check.add_argument("--json", action="store_true", help="print the verdict as one JSON line (last line)")
    check.add_argument("--timeout", type=float, default=60.0, help="validation budget in seconds (default 60)")
    check.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                       help="backend to certify (default auto: JAX when the program fits, else sandbox)")
    check.set_defaults(run=cmd_check)

    play = sub.add_parser("play", help="play an environment in the terminal")
    common(play)
    play.add_argument("--seed", type=int, default=0, help="seed of the first episode (default 0)")
    play.add_argument("--episodes", type=int, default=1, help="episodes to play (default 1)")
    play.add_argument("--max-turns", type=int, default=25, help="turn limit per episode (default 25)")
    play.set_defaults(run=cmd_play)
    return parser


def _flag_error(args) -> str | None:
    """The first out-of-range flag, as a one-line message naming it."""
    for name in ("step_timeout", "timeout"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"--{name.replace('_', '-')} must be a finite number of seconds > 0, got {value:g}"
    if args.memory_mb < 128:
        return f"--memory-mb must be >= 128 (Python and numpy need it), got {args.memory_mb}"
    for name, low in (("seed", 0), ("episodes", 1), ("max_turns", 1)):
        value = getattr(args, name, None)
        if value is not None and value < low:
            return f"--{name.replace('_', '-')} must be >= {low}, got {value}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = _wants_json(argv)
    _Parser.json_errors = as_json
    try:
        args = build_parser().parse_args(argv)
    finally:
        _Parser.json_errors = False
    as_json = getattr(args, "json", False)
    message = _flag_error(args)
    if message:
        return _usage_error(message, as_json)
    if not as_json:
        return args.run(args)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(_failure_json("interrupted"))
        return 130
    except Exception as exc:  # a bug: still end stdout with the promised JSON line, then show the traceback
        print(_failure_json(f"internal error: {type(exc).__name__}: {exc}"), flush=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
