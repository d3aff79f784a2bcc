"""Fixed-pool GRPO vs SPADE vs a frozen designer: same model, same budget, same held-out suite.

python -m experiments.compare [--iterations N] [--suite quick|heldout] [--out DIR] [key=value ...]
Writes DIR/results.json and DIR/results.md (the table that goes into docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
  parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every arm (e.g. model.name=tiny)")
  args = parser.parse_args(argv)

  from spade_jax import evaluation  # noqa: PLC0415
  from spade_jax.config import ConfigError, load_config  # noqa: PLC0415
  from spade_jax.models.registry import load_model  # noqa: PLC0415
  from spade_jax.sampling import SamplingConfig  # noqa: PLC0415

  from experiments.eval import load_run  # noqa: PLC0415
  from experiments.run import run  # noqa: PLC0415

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  suite = evaluation.get_suite(args.suite, args.episodes)
  common = [f"iterations={args.iterations}", f"seed={args.seed}", "progress=false", *args.overrides]
  rows = []
  for label, config_name in ARMS:
    try:
      config = load_config(config_name or "default", common)
    except ConfigError as err:
      print(f"error: {err}", file=sys.stderr)
      return 2
    started = time.perf_counter()
    if config_name is not None:
      run(config, out / config_name)
    train_s = time.perf_counter() - started
    if config_name is None:
      loaded = load_model(config.model.name, seed=config.seed)
    else:
      loaded, _ = load_run(out / config_name)  # the latest checkpoint's params
    # Greedy, in the arm's own answer format (forced reply prefix and stop strings).
    sampling = SamplingConfig(max_new_tokens=config.agent_sampling.max_new_tokens, temperature=0.0,
                              stop_strings=config.agent_sampling.stop_strings)
    policy = evaluation.model_policy(loaded.model, loaded.tokenizer, sampling, seed=args.seed,
                                     reply_prefix=config.rollout.reply_prefix)
    report = evaluation.evaluate(policy, suite, seed=0)
    summary = report.to_dict()
    summary.pop("episodes", None)
    rows.append({"arm": label, "config": config_name, "train_seconds": round(train_s, 1), **summary})
    print(f"{label}: macro success {report.success_rate:.3f}", flush=True)

  (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
  command = "python -m experiments.compare " + " ".join(argv if argv is not None else sys.argv[1:])
  (out / "results.md").write_text(format_table(rows, command))
  print(format_table(rows, command))
  return 0


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
