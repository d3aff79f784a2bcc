"""Fixed-pool GRPO vs SPADE vs a frozen designer: same model, same budget, several seeds, same held-out suite.

python -m experiments.compare [--minutes M] [--iterations N] [--seeds 0,1,2] [--arm-base CONFIG] [--arms A,B]
    [--suite quick|heldout|small] [--episodes E] [--batch-size B] [--out DIR] [key=value ...]

With --minutes every arm trains for the same wall-clock budget (each run stops after the iteration
that spends it; --iterations is then only a cap); without, for the same number of iterations. Each
trained arm runs once per seed in DIR/ARM/seedS (a run directory of experiments.run) and is scored
greedily on the suite. Writes DIR/results.json, DIR/results.md (the table that goes into
docs/results.md), DIR/learning_curves.png and DIR/designer.png. Each (arm, seed) row is saved as
DIR/rows/ARM-seedS.json as soon as it is evaluated, so the same command again after a crash or an
interrupt keeps the rows done, resumes an unfinished run from its last checkpoint and starts nothing
twice. Train seconds are the run's summed iteration times (run/train_s, resumes included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

# With --minutes and no --iterations, the iteration cap (the budget stops the runs long before).
MINUTES_ITERATION_CAP = 100_000


@dataclasses.dataclass(frozen=True)
class Arm:
    label: str
    key: str  # its folder (DIR/KEY/seedS) and row files
    config: str  # config name or path
    overrides: tuple[str, ...] = ()  # applied last: what makes it this arm
    trained: bool = True


ARMS = (
    Arm("base model (no training)", "base", "default", trained=False),
    Arm("fixed-pool GRPO", "fixed_pool", "fixed_pool"),
    Arm("SPADE", "spade", "default"),
    Arm("SPADE, frozen designer", "frozen_designer", "frozen_designer"),
)


def arms_from_base(base: str) -> tuple[Arm, ...]:
    """The three methods on one config's settings: as a fixed pool, as SPADE, SPADE with a frozen designer."""
    return (
        Arm("base model (no training)", "base", base, trained=False),
        Arm("fixed-pool GRPO", "fixed_pool", base, ("mode=fixed_pool", "train_designer=false")),
        Arm("SPADE", "spade", base, ("mode=selfplay", "train_designer=true")),
        Arm("SPADE, frozen designer", "frozen_designer", base, ("mode=selfplay", "train_designer=false")),
    )


class UsageError(ValueError):
    """A bad command line; the message is one line."""


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--seeds must be comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds:
        raise UsageError(f"--seeds must name at least one seed, got {text!r}")
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds must be distinct integers >= 0, got {text!r}")
    return seeds


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-clock training budget per run (each arm, each seed); --iterations becomes a cap")
    parser.add_argument("--iterations", type=int, default=None,
                        help="agent updates per run (default 4; with --minutes a cap, default "
                             f"{MINUTES_ITERATION_CAP})")
    parser.add_argument("--seeds", "--seed", default="0,1,2",
                        help="comma-separated training seeds (default 0,1,2: three runs per arm)")
    parser.add_argument("--arm-base", default=None,
                        help="config the arms share (e.g. laptop): it as a fixed pool, as SPADE and as SPADE with a "
                             "frozen designer (default: the fixed_pool, default and frozen_designer configs)")
    parser.add_argument("--arms", default=None,
                        help="comma-separated arms to run, of base, fixed_pool, spade, frozen_designer (default: all); "
                             "rows already made for the others are not redone, so the full command later reuses them")
    parser.add_argument("--suite", default="quick", help="held-out suite: quick, heldout or small")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per eval task (default: the suite's)")
    parser.add_argument("--out", default="runs/compare", help="directory for the runs, the table and the plots")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="episodes per policy call in the evaluation (bounds its memory)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every arm (e.g. model.name=tiny)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise UsageError(f"--minutes must be a number of minutes > 0, got {args.minutes}")
    if args.iterations is not None and args.iterations < 1:
        raise UsageError(f"--iterations must be >= 1, got {args.iterations}")
    if args.episodes is not None and args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    args.seeds = parse_seeds(args.seeds)
    if args.iterations is None:
        args.iterations = MINUTES_ITERATION_CAP if args.minutes else 4
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from spade_jax import evaluation
    from spade_jax.config import ConfigError, load_config
    from spade_jax.run import RunDirError, RunDirLocked

    try:
        suite = evaluation.get_suite(args.suite, args.episodes)
    except ValueError as err:
        print(f"error: --suite: {err}", file=sys.stderr)
        return 2
    arms = arms_from_base(args.arm_base) if args.arm_base else ARMS
    if args.arms is not None:
        keys = [key.strip() for key in args.arms.split(",") if key.strip()]
        unknown = sorted(set(keys) - {arm.key for arm in arms})
        if unknown or not keys:
            print(f"error: --arms {args.arms!r}: choose from {', '.join(arm.key for arm in arms)}", file=sys.stderr)
            return 2
        arms = tuple(arm for arm in arms if arm.key in keys)
    out = Path(args.out)
    try:
        (out / "rows").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        print(f"error: --out {out}: cannot create {out / 'rows'} ({err.strerror}); choose a writable directory",
              file=sys.stderr)
        return 2
    budget = [f"iterations={args.iterations}", "progress=false"]
    if args.minutes:
        budget.append(f"max_minutes={args.minutes}")
    rows, histories = [], {}
    for arm in arms:
        for seed in args.seeds if arm.trained else args.seeds[:1]:  # an untrained model is scored once
            # A saved row is reused only if it was made with these settings.
            settings = {"iterations": args.iterations, "minutes": args.minutes, "suite": args.suite,
                        "episodes": args.episodes, "seed": seed, "arm_base": args.arm_base,
                        "overrides": list(args.overrides)}
            try:
                config = load_config(arm.config, [*args.overrides, *budget, f"seed={seed}", *arm.overrides])
            except ConfigError as err:
                print(f"error: {arm.label}: {err}", file=sys.stderr)
                return 2
            run_dir = out / arm.key / f"seed{seed}"
            row_file = out / "rows" / (f"{arm.key}-seed{seed}.json" if arm.trained else f"{arm.key}.json")
            saved = _read_json(row_file)
            if saved is not None and saved.get("settings") == settings:
                row = saved["row"]
                print(f"{arm.label}, seed {seed}: macro success {row['success_rate']:.3f} (kept from {row_file})",
                      flush=True)
            else:
                try:
                    row = score_arm(arm, seed, config, run_dir, suite, args)
                except (ConfigError, RunDirError, RunDirLocked) as err:
                    print(f"error: {err}", file=sys.stderr)
                    return 2
                except KeyboardInterrupt:
                    print("interrupted; the same command keeps the rows done and resumes each run from its last "
                          "checkpoint", file=sys.stderr)
                    return 130
                _write_text(row_file, json.dumps({"settings": settings, "row": row}, indent=1, default=str))
                print(f"{arm.label}, seed {seed}: macro success {row['success_rate']:.3f}", flush=True)
            rows.append(row)
            if arm.trained:
                histories.setdefault(arm.label, []).append(kept_metrics(run_dir, row["iterations"]))

    command = "python -m experiments.compare " + " ".join(argv)
    summary = aggregate(rows)
    _write_text(out / "results.json", json.dumps({"command": command, "rows": rows, "arms": summary},
                                                 indent=1, default=str))
    table = format_table(summary, command, args.minutes)
    _write_text(out / "results.md", table)
    write_plots(out, histories)
    print(table)
    return 0


def score_arm(arm: Arm, seed: int, config, run_dir: Path, suite, args) -> dict:
    """Trains the arm's run for `seed` (or resumes it; an untrained arm is the model as loaded), then
    scores it greedily on the suite in its own answer format; returns its row."""
    from experiments.eval import load_run
    from spade_jax import evaluation
    from spade_jax.models.registry import load_model
    from spade_jax.rollout import AGENT_SYSTEM
    from spade_jax.sampling import SamplingConfig

    done = 0
    if not arm.trained:
        loaded = load_model(config.model.name, seed=config.seed)
    else:
        done = ensure_trained(config, run_dir)
        loaded, _ = load_run(run_dir)  # the latest checkpoint's params
    # Greedy, in the arm's own answer format (forced reply prefix and stop strings).
    sampling = SamplingConfig(max_new_tokens=config.agent_sampling.max_new_tokens, temperature=0.0,
                              stop_strings=config.agent_sampling.stop_strings)
    policy = evaluation.model_policy(loaded.model, loaded.tokenizer, sampling, seed=seed,
                                     reply_prefix=config.rollout.reply_prefix)
    report = evaluation.evaluate(policy, suite, seed=0, batch_size=args.batch_size, system_prompt=AGENT_SYSTEM)
    result = report.to_dict()
    result.pop("episodes", None)
    train_s = train_seconds(run_dir, done) if arm.trained else 0.0
    result["eval_seed"] = result.pop("seed", None)  # the suite's episodes; "seed" is the training seed
    return {**result, "arm": arm.label, "key": arm.key, "config": arm.config, "seed": seed, "iterations": done,
            "train_seconds": round(train_s, 1), "machines": training_machines(run_dir) if arm.trained else []}


def training_machines(run_dir: Path) -> list[dict]:
    """The machines the run trained on (its start's and each resume's, from run.json): a minutes budget
    buys different work on different machines, so the table says where each row was made."""
    from spade_jax.run import RunDirError, read_record

    try:
        record = read_record(run_dir)
    except RunDirError:
        return []
    starts = [record, *(r for r in record.get("resumes") or [] if isinstance(r, dict))]
    return [start["machine"] for start in starts if isinstance(start.get("machine"), dict)]


def ensure_trained(config, run_dir: Path) -> int:
    """Trains `config` into `run_dir`, resumes it, or leaves it when it is finished (its iterations done
    or its max_minutes spent); a run made with another config is refused. Returns the iterations done."""
    from spade_jax.config import ConfigError, load_config

    done = finished_iterations(run_dir)
    if done is not None or (run_dir / "config.yaml").is_file():
        try:
            same = load_config(str(run_dir / "config.yaml")) == config
        except ConfigError as err:
            raise ConfigError(f"{run_dir}/config.yaml: {err}; choose another --out") from None
        if not same:
            raise ConfigError(f"{run_dir} holds a run made with other settings; choose another --out")
    if done is None or (done < config.iterations and not budget_spent(run_dir, done, config.max_minutes)):
        train(config, run_dir, resume=done is not None)
    return finished_iterations(run_dir) or 0


def train(config, run_dir: Path, *, resume: bool) -> None:
    from experiments.run import run

    run(config, run_dir, resume=resume)


def finished_iterations(run_dir: Path) -> int | None:
    """The iteration of the run's latest checkpoint, or None when it has none."""
    from spade_jax.run.checkpoint import Checkpointer

    if not (run_dir / "checkpoints").is_dir():
        return None
    checkpoints = Checkpointer(run_dir / "checkpoints", async_save=False)
    try:
        return checkpoints.latest_step()
    finally:
        checkpoints.close()


def kept_metrics(run_dir: Path, iterations: int) -> list[dict]:
    """The run's metrics records of its first `iterations` iterations (those its checkpoint holds)."""
    from spade_jax.run import read_metrics

    return [r for r in read_metrics(run_dir) if isinstance(r.get("iteration"), int) and r["iteration"] < iterations]


def train_seconds(run_dir: Path, iterations: int) -> float:
    """Training seconds of the run's first `iterations` iterations, resumes included."""
    from spade_jax.run.budget import spent_seconds

    return spent_seconds(kept_metrics(run_dir, iterations))


def budget_spent(run_dir: Path, iterations: int, max_minutes: float | None) -> bool:
    """Whether the run's first `iterations` iterations spent its max_minutes (then it is finished)."""
    return bool(max_minutes) and train_seconds(run_dir, iterations) >= max_minutes * 60.0


def aggregate(rows: list[dict]) -> list[dict]:
    """Per arm (in first-seen order): the mean over seeds of the macro success, the Wilson interval of
    all episodes of all seeds pooled, each seed's figure, train seconds and iterations, per-task totals."""
    from spade_jax.evaluation.stats import wilson_interval

    by_arm: dict[str, list[dict]] = {}
    for row in rows:
        by_arm.setdefault(row["arm"], []).append(row)
    out = []
    for label, group in by_arm.items():
        tasks: dict[str, list[int]] = {}
        for row in group:
            for task in row.get("tasks", []):
                counts = tasks.setdefault(task["env_id"], [0, 0])
                counts[0] += task["successes"]
                counts[1] += task["episodes"]
        successes = sum(s for s, _ in tasks.values())
        episodes = sum(n for _, n in tasks.values())
        low, high = wilson_interval(successes, episodes)
        out.append({
            "arm": label, "seeds": [r.get("seed") for r in group],
            "success_mean": sum(r["success_rate"] for r in group) / len(group),
            "successes": successes, "episodes": episodes, "ci_low": low, "ci_high": high,
            "per_seed": [r["success_rate"] for r in group],
            "train_seconds": [r.get("train_seconds", 0.0) for r in group],
            "iterations": [r.get("iterations", 0) for r in group],
            "machines": [r.get("machines") or [] for r in group],
            "tasks": [{"env_id": env_id, "successes": s, "episodes": n} for env_id, (s, n) in tasks.items()],
        })
    return out


def format_table(arms: list[dict], command: str, minutes: float | None = None) -> str:
    """The markdown table of aggregate() for docs/results.md."""
    tasks = [t["env_id"] for t in arms[0]["tasks"]] if arms else []
    budget = f"{minutes:g} training minutes per run" if minutes else "the same iterations per run"
    head = ("| arm | seeds | macro success, mean of seeds [pooled 95% Wilson] | per seed | train s | iterations | "
            + " | ".join(tasks) + " |")
    lines = [f"Command: `{command}`", "",
             f"Budget: {budget}. Macro success is each seed's mean over tasks, averaged over seeds; the interval is "
             "the Wilson interval of all episodes of all seeds pooled; task columns pool the seeds.", "",
             head, "|" + "---|" * (6 + len(tasks))]
    for arm in arms:
        cells = [f"{t['successes']}/{t['episodes']}" for t in arm["tasks"]]
        macro = f"{arm['success_mean']:.3f} [{arm['ci_low']:.3f}, {arm['ci_high']:.3f}]"
        per_seed = ", ".join(f"{rate:.3f}" for rate in arm["per_seed"])
        seconds = ", ".join(f"{s:.1f}" for s in arm["train_seconds"])
        iterations = ", ".join(str(i) for i in arm["iterations"])
        seeds = ", ".join(str(s) for s in arm["seeds"])
        lines.append(f"| {arm['arm']} | {seeds} | {macro} | {per_seed} | {seconds} | {iterations} | "
                     + " | ".join(cells) + " |")
    machines = machines_paragraph(arms)
    return "\n".join(lines + ([""] + machines if machines else [])) + "\n"


def machines_paragraph(arms: list[dict]) -> list[str]:
    """One line per kind of machine the trained rows ran on (CPU, cores, features, accelerator), naming
    the rows and the range of its measured matmul rates; nothing when no row recorded its machine."""
    from spade_jax.run.machine import summary

    kinds: dict[str, tuple[list[str], list[float]]] = {}
    unrecorded = []  # trained rows made before run.json recorded machines
    for arm in arms:
        for seed, machines, iterations in zip(arm["seeds"], arm.get("machines") or [], arm["iterations"]):
            name = f"{arm['arm']} seed {seed}"
            if iterations and not machines:
                unrecorded.append(name)
            for machine in machines:
                runs, rates = kinds.setdefault(summary({**machine, "matmul_gflops": None}), ([], []))
                if name not in runs:
                    runs.append(name)
                if isinstance(machine.get("matmul_gflops"), (int, float)):
                    rates.append(machine["matmul_gflops"])
    lines = []
    for kind, (runs, rates) in kinds.items():
        rate = ""
        if rates:
            span = f"{min(rates):g}" if min(rates) == max(rates) else f"{min(rates):g}-{max(rates):g}"
            rate = f"; numpy float32 matmul {span} GFLOP/s"
        lines.append(f"- Trained on {kind}{rate}: {'; '.join(runs)}.")  # arm labels may hold commas
    if kinds and unrecorded:
        lines.append(f"- No machine recorded: {'; '.join(unrecorded)}.")
    if len(kinds) > 1:
        lines.insert(0, "The rows were trained on different machines, so a minutes budget bought different work:")
    elif kinds and unrecorded:
        lines.insert(0, "Not every row recorded its machine; a minutes budget buys different work on different "
                        "machines:")
    return lines


def write_plots(out: Path, histories: dict[str, list[list[dict]]]) -> list[Path]:
    """OUT/learning_curves.png and OUT/designer.png from the trained arms' metrics."""
    from spade_jax.run.curves import write_designer_curves, write_learning_curves

    return [write_learning_curves(out / "learning_curves.png", histories),
            write_designer_curves(out / "designer.png", histories)]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None  # a damaged row is made again


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
