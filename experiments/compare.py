"""Fixed-pool GRPO vs SPADE vs a frozen designer: same model, same budget, same held-out suite.

python -m experiments.compare [--iterations N] [--suite quick|heldout] [--out DIR] [key=value ...]
Writes DIR/results.json and DIR/results.md (the table that goes into docs/results.md). Each arm's
row is also saved as DIR/rows/CONFIG.json as soon as it is evaluated, so running the same command
again after a crash or an interrupt keeps the arms already done, resumes an arm's training from
its last checkpoint and starts nothing twice. Train seconds are the arm's summed iteration wall
times from its metrics.jsonl (resumes included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ARMS = (
    ("base model (no training)", None),
    ("fixed-pool GRPO", "fixed_pool"),
    ("SPADE", "default"),
    ("SPADE, frozen designer", "frozen_designer"),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4, help="agent updates per trained arm")
    parser.add_argument("--suite", default="quick", help="held-out suite: quick or heldout")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per eval task (default: the suite's)")
    parser.add_argument("--out", default="runs/compare", help="directory for the runs and the table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16,
                        help="episodes per policy call in the evaluation (bounds its memory)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every arm (e.g. model.name=tiny)")
    args = parser.parse_args(argv)

    from experiments.eval import load_run
    from experiments.run import run
    from spade_jax import evaluation
    from spade_jax.config import ConfigError, load_config
    from spade_jax.models.registry import load_model
    from spade_jax.rollout import AGENT_SYSTEM
    from spade_jax.sampling import SamplingConfig

    if args.batch_size < 1:
        print(f"error: --batch-size must be >= 1, got {args.batch_size}", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    suite = evaluation.get_suite(args.suite, args.episodes)
    common = [f"iterations={args.iterations}", f"seed={args.seed}", "progress=false", *args.overrides]
    # A saved row is reused only if it was made with these settings.
    settings = {"iterations": args.iterations, "suite": args.suite, "episodes": args.episodes,
                "seed": args.seed, "overrides": list(args.overrides)}
    rows = []
    for label, config_name in ARMS:
        try:
            config = load_config(config_name or "default", common)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        row_file = out / "rows" / f"{config_name or 'base'}.json"
        saved = json.loads(row_file.read_text()) if row_file.is_file() else None
        if saved is not None and saved.get("settings") == settings:
            rows.append(saved["row"])
            print(f"{label}: macro success {saved['row']['success_rate']:.3f} (kept from {row_file})", flush=True)
            continue
        if config_name is None:
            loaded = load_model(config.model.name, seed=config.seed)
        else:
            run_dir = out / config_name
            done = finished_iterations(run_dir)
            try:
                same = done is None or load_config(str(run_dir / "config.yaml")) == config
            except ConfigError as err:
                same = False
                print(f"warning: {run_dir}/config.yaml: {err}", file=sys.stderr)
            if not same:
                print(f"error: {run_dir} holds a run made with other settings; choose another --out", file=sys.stderr)
                return 2
            if done is None or done < args.iterations:
                run(config, run_dir, resume=done is not None)
            loaded, _ = load_run(run_dir)  # the latest checkpoint's params
        # Greedy, in the arm's own answer format (forced reply prefix and stop strings).
        sampling = SamplingConfig(max_new_tokens=config.agent_sampling.max_new_tokens, temperature=0.0,
                                  stop_strings=config.agent_sampling.stop_strings)
        policy = evaluation.model_policy(loaded.model, loaded.tokenizer, sampling, seed=args.seed,
                                         reply_prefix=config.rollout.reply_prefix)
        report = evaluation.evaluate(policy, suite, seed=0, batch_size=args.batch_size, system_prompt=AGENT_SYSTEM)
        summary = report.to_dict()
        summary.pop("episodes", None)
        train_s = 0.0 if config_name is None else train_seconds(out / config_name, args.iterations)
        row = {"arm": label, "config": config_name, "train_seconds": round(train_s, 1), **summary}
        row_file.write_text(json.dumps({"settings": settings, "row": row}, indent=1, default=str))
        rows.append(row)
        print(f"{label}: macro success {report.success_rate:.3f}", flush=True)
        del loaded, policy  # one model at a time

    (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    command = "python -m experiments.compare " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "results.md").write_text(format_table(rows, command))
    print(format_table(rows, command))
    return 0


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


def train_seconds(run_dir: Path, iterations: int) -> float:
    """Wall time of the run's first `iterations` iterations, from its metrics.jsonl. Each record's
    `wall_s` counts from its process's start, so a resumed run's clock starts again from 0."""
    from spade_jax.run import read_metrics

    total = previous = 0.0
    for record in read_metrics(run_dir):
        wall = float(record.get("wall_s", previous))
        if record.get("iteration", iterations) < iterations:
            total += wall - previous if wall >= previous else wall
        previous = wall
    return total


def format_table(rows: list[dict], command: str) -> str:
    tasks = [t["env_id"] for t in rows[0].get("tasks", [])] if rows else []
    head = "| arm | train s | macro success | " + " | ".join(tasks) + " |"
    lines = [f"Command: `{command}`", "", head, "|" + "---|" * (3 + len(tasks))]
    for row in rows:
        cells = [f"{t['successes']}/{t['episodes']}" for t in row.get("tasks", [])]
        macro_text = f"{row['success_rate']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        lines.append(f"| {row['arm']} | {row['train_seconds']} | {macro_text} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
