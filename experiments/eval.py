"""Score a model or a training run on the held-out suite (offline GEM games and reasoning-gym) or on BFCL
tool use (tool_use: multi-turn, tool_use_quick: single-turn AST): prints a success table with 95% intervals,
writes JSON, and flags generated envs that copy an eval env.

  python -m experiments.eval --model smollm2-135m-instruct --suite quick
  python -m experiments.eval --run runs/spade-tiny --suite heldout --out eval.json
  python -m experiments.eval --model smollm2-135m-instruct --suite tool_use_quick --episodes 50
  python -m experiments.eval --run runs/laptop-s0 --suite train   # the run's own games at fixed seeds
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from spade_jax import evaluation


class UsageError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


def _run_config(run_dir: Path) -> dict:
    """The resolved config a run wrote (config.yaml), as plain data."""
    import yaml

    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise UsageError(
            f"{run_dir} is not a run directory (no config.yaml); pass the --out directory of "
            "python -m experiments.run"
        )
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(f"cannot read {config_path}: {reason}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{config_path} is not valid YAML{where}; is it a run's config.yaml?") from None
    if not isinstance(config, dict):
        raise UsageError(f"{config_path} is not a mapping; is it a run's config.yaml?")
    return config


def _model_ref(config: dict) -> str:
    """`model: NAME` or `model: {name: NAME}` of a run config."""
    model = config.get("model")
    if isinstance(model, dict):
        model = model.get("name") or model.get("path")
    if not isinstance(model, str) or not model:
        raise UsageError("the run's config.yaml names no model (expected model.name)")
    return model


def load_run(run_dir: str | Path) -> tuple[Any, dict]:
    """The run's model with the parameters of its latest checkpoint, and where they came from.

    The checkpoint holds the learner's TrainState; its restore target is built from the run's
    own rl section (the optimizer's structure depends on it), then its params are written into
    the model the sampler reads."""
    import jax.numpy as jnp

    from spade_jax.config import ConfigError, from_dict
    from spade_jax.models.registry import load_model
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import make_train_step
    from spade_jax.run.checkpoint import Checkpointer, CheckpointError

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    config = _run_config(run_dir)
    ref = _model_ref(config)
    model_cfg = config.get("model") if isinstance(config.get("model"), dict) else {}
    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    try:
        loaded = load_model(ref, dtype=dtypes.get(model_cfg.get("dtype"), jnp.float32),
                            param_dtype=dtypes.get(model_cfg.get("param_dtype"), jnp.float32))
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from None
    checkpoints = run_dir / "checkpoints"
    if not checkpoints.is_dir():
        raise UsageError(f"{run_dir} has no checkpoints/ yet; wait for the first checkpoint")
    try:
        rl_cfg = from_dict(RLConfig, config.get("rl") or {}, prefix="rl.")
    except ConfigError as err:
        raise UsageError(f"the run's config.yaml: {err}") from None
    train_step = make_train_step(loaded.model, rl_cfg, verbose=False)
    checkpointer = Checkpointer(checkpoints, keep=None, async_save=False)
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise UsageError(f"{checkpoints} holds no finished checkpoint yet")
        state, trainer = checkpointer.restore(train_step.abstract_state(loaded.model), step)
    except CheckpointError as err:
        raise UsageError(str(err)) from None
    finally:
        checkpointer.close()
    train_step.write_params(loaded.model, state)
    source = {"run": str(run_dir), "model": ref, "checkpoint_step": int(step)}
    if isinstance(trainer.get("iteration"), int):
        source["iteration"] = trainer["iteration"]
    return loaded, source


def _load_model(args: argparse.Namespace) -> tuple[Any, dict]:
    from spade_jax.models.registry import load_model

    if args.run:
        loaded, source = load_run(args.run)
    else:
        try:
            loaded = load_model(args.model)
        except (ValueError, FileNotFoundError) as err:
            raise UsageError(str(err)) from None
        source = {"model": args.model}
    return loaded, source


def _load_policy(args: argparse.Namespace) -> tuple[Any, dict]:
    from spade_jax.sampling import SamplingConfig

    loaded, source = _load_model(args)
    # The agent answers as it was trained to: the run's forced reply prefix and stop strings.
    run_config = _run_config(Path(args.run)) if args.run else {}
    reply_prefix = args.reply_prefix
    if reply_prefix is None:
        reply_prefix = str((run_config.get("rollout") or {}).get("reply_prefix") or "")
    stops = args.stop
    if stops is None:
        stops = list((run_config.get("agent_sampling") or {}).get("stop_strings") or [])
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              stop_strings=tuple(stops))
    policy = evaluation.model_policy(loaded.model, loaded.tokenizer, sampling, seed=args.seed,
                                     reply_prefix=reply_prefix)
    return policy, source


def _run_duplicates(run_dir: Path, suite: evaluation.EvalSuite) -> list[dict]:
    """Flags for the run's archived programs (envs/index.jsonl), if it has any."""
    from spade_jax.run import EnvArchive

    if not (run_dir / "envs" / "index.jsonl").is_file():
        return []
    archive = EnvArchive(run_dir)
    programs = {}
    for entry in archive.read_index():
        try:
            programs[entry["env_id"]] = archive.source(entry["env_id"])
        except OSError:
            continue
    return [flag._asdict() for flag in evaluation.flag_duplicates(programs, suite)]


def _train_suite(args: argparse.Namespace) -> evaluation.EvalSuite:
    """The train suite: the run's (or --env-pool's) library games at the run's (or --max-turns') turn cap."""
    config = _run_config(Path(args.run)) if args.run and Path(args.run).is_dir() else {}
    env_pool = args.env_pool or config.get("env_pool")
    if not env_pool:
        raise UsageError("--suite train needs --env-pool 'library:...' or a --run trained on a library env_pool")
    max_turns = args.max_turns
    if max_turns is None:
        max_turns = int((config.get("rollout") or {}).get("max_turns") or 25)
    if max_turns < 1:
        raise UsageError(f"--max-turns must be >= 1, got {max_turns}")
    return evaluation.train_suite(env_pool, max_turns, args.episodes)


def _check_out(out: Path) -> None:
    """Fails (UsageError) before any work unless the JSON report can be written at `out`; makes missing parents."""
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; --out takes a JSON file path such as {out / 'eval.json'}")
    for ancestor in out.parents:
        if ancestor.exists() or ancestor.is_symlink():
            if not ancestor.is_dir():
                raise UsageError(f"--out {out}: {ancestor} is not a directory; choose another path")
            break
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(
            f"--out {out}: cannot create {out.parent} ({err.strerror or err}); choose another path"
        ) from None
    try:
        with tempfile.TemporaryFile(dir=out.parent):  # the directory takes new files
            pass
        if out.exists() and not os.access(out, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as err:
        raise UsageError(f"--out {out} is not writable ({err.strerror or err}); choose another path") from None


def _write_report(out: Path, text: str) -> None:
    """Writes whole or not at all: a temporary file beside `out`, renamed over it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as an open() would make it (mkstemp's own mode is 0600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.eval",
        description="Score a model or run on the held-out suite (works offline).",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="preset name, HF model directory or .gguf file")
    which.add_argument("--run", help="run directory of experiments.run (latest checkpoint)")
    parser.add_argument("--suite", default="heldout",
                        choices=sorted(evaluation.SUITES) + sorted(evaluation.TOOL_SUITES) + [evaluation.TRAIN],
                        help="train: the games a run trains on (its library env_pool, or --env-pool) at fixed "
                             "seeds, not held out")
    parser.add_argument("--env-pool",
                        help="the train suite's 'library:...' pool (default for --run: the run's env_pool)")
    parser.add_argument("--max-turns", type=int,
                        help="the train suite's turn cap (default for --run: the run's rollout.max_turns, else 25)")
    parser.add_argument("--episodes", type=int,
                        help="episodes per task (default: the suite's); for tool_use suites, entries per category")
    parser.add_argument("--tasks", help="comma-separated subset of the suite's env ids (tool_use: bfcl:CATEGORY)")
    parser.add_argument("--seed", type=int, default=0, help="shifts every episode seed (0 = canonical)")
    parser.add_argument("--out", help="JSON report path (default for --run: RUN/eval_<suite>.json)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per agent reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--reply-prefix", default=None,
                        help="text forced at the start of every reply, e.g. '\\boxed{' "
                             "(default for --run: the run's rollout.reply_prefix, else none)")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="stop string, repeatable (default for --run: the run's agent_sampling.stop_strings)")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="most conversations per generation call (bounds prefill memory)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from spade_jax.cache import enable_compilation_cache
    from spade_jax.rollout import AGENT_SYSTEM
    from spade_jax.run import setup_logging
    from spade_jax.run.interrupt import remember_interrupts

    setup_logging(None, "WARNING")
    if args.suite in evaluation.TOOL_SUITES:
        return _main_tool_use(args)
    try:
        if args.episodes is not None and args.episodes < 1:
            raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
        if args.batch_size is not None and args.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.seed < 0:
            raise UsageError(f"--seed must be >= 0, got {args.seed}")
        if args.suite == evaluation.TRAIN:
            suite = _train_suite(args)
        elif args.env_pool or args.max_turns is not None:
            raise UsageError("--env-pool and --max-turns apply to --suite train only")
        else:
            suite = evaluation.get_suite(args.suite, args.episodes)
        if args.tasks:  # commas inside a lib: id's parentheses belong to the id
            suite = suite.only([t.strip() for t in re.split(r",(?![^()]*\))", args.tasks) if t.strip()])
        if args.run and not Path(args.run).is_dir():
            raise UsageError(f"run directory {args.run} does not exist")
        out = Path(args.out) if args.out else (Path(args.run) / f"eval_{suite.name}.json" if args.run else None)
        if out is not None:
            _check_out(out)
        enable_compilation_cache()  # a second evaluation loads the sampler's programs instead of compiling them
        policy, source = _load_policy(args)
    except (UsageError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    with remember_interrupts():  # a Ctrl-C dropped in a gc callback still stops the plays at their next turn
        report = evaluation.evaluate(
            policy, suite, seed=args.seed, batch_size=args.batch_size, progress=not args.no_progress,
            system_prompt=AGENT_SYSTEM,
        )
    result = {"source": source, **report.to_dict()}
    print(report.format_table())
    if args.run and suite.name != evaluation.TRAIN:  # the train suite is the run's own games
        try:
            flags = _run_duplicates(Path(args.run), suite)
        except (OSError, ValueError, KeyError) as err:  # a damaged archive must not cost the report
            print(f"warning: skipped the duplicate check, the run's envs/ archive is unreadable: {err}",
                  file=sys.stderr)
            flags, result["duplicates_error"] = [], str(err)
        result["duplicates"] = flags
        if flags:
            print(f"\n{len(flags)} generated environment(s) resemble an eval environment "
                  f"(content-word Jaccard >= {evaluation.DUPLICATE_THRESHOLD} "
                  f"or family >= {evaluation.FAMILY_THRESHOLD}):")
            for flag in flags:
                print(f"  {flag['env_id']}  ~  {flag['eval_env']}  (similarity {flag['similarity']:.2f}, "
                      f"family {flag['family']:.2f})")
    if out is not None:
        text = json.dumps(result, indent=2) + "\n"
        try:
            _write_report(out, text)
        except OSError as err:
            print(text, end="")  # the report is never lost: stdout gets it instead
            print(f"error: cannot write {out} ({err.strerror or err}); the JSON report is on stdout above",
                  file=sys.stderr)
            return 1
        print(f"\nwrote {out}")
    return 0


def _main_tool_use(args: argparse.Namespace) -> int:
    """BFCL tool use: the model answers in its own chat format with tools (no forced prefix, no held-out seeds)."""
    from spade_jax.sampling import SamplingConfig

    try:
        if args.episodes is not None and args.episodes < 1:
            raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
        if args.batch_size is not None and args.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.seed != 0 or args.reply_prefix:
            raise UsageError(f"--seed and --reply-prefix do not apply to {args.suite} (BFCL entries are fixed)")
        suite = evaluation.get_tool_suite(args.suite, args.episodes)
        if args.tasks:
            wanted = [t.strip().removeprefix("bfcl:") for t in args.tasks.split(",") if t.strip()]
            unknown = [t for t in wanted if t not in suite.categories]
            if unknown:
                raise UsageError(f"suite {suite.name} has no task {'bfcl:' + unknown[0]!r}; "
                                 f"its tasks: {', '.join('bfcl:' + c for c in suite.categories)}")
            suite = evaluation.ToolSuite(suite.name, tuple(wanted), suite.entries)
        if args.run and not Path(args.run).is_dir():
            raise UsageError(f"run directory {args.run} does not exist")
        evaluation.load_category(suite.categories[0], 1)  # bfcl-eval present, before the model loads
        out = Path(args.out) if args.out else (Path(args.run) / f"eval_{suite.name}.json" if args.run else None)
        if out is not None:
            _check_out(out)
        loaded, source = _load_model(args)
    except (UsageError, ValueError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              stop_strings=tuple(args.stop or ()))
    complete = evaluation.model_completer(loaded.model, loaded.tokenizer, sampling, seed=args.seed)
    report = evaluation.evaluate_tools(complete, loaded.tokenizer, suite, batch_size=args.batch_size,
                                       progress=not args.no_progress)
    result = {"source": source, "entries_per_category": suite.entries, **report.to_dict()}
    print(report.format_table())
    if out is not None:
        text = json.dumps(result, indent=2) + "\n"
        try:
            _write_report(out, text)
        except OSError as err:
            print(text, end="")
            print(f"error: cannot write {out} ({err.strerror or err}); the JSON report is on stdout above",
                  file=sys.stderr)
            return 1
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
