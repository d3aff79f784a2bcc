"""Screen candidate one-turn tasks for a calibrated suite: plays each candidate on seeds outside
every suite's (so the suite's own seeds are never tuned on) and prints its success with a 95%
interval, marking those inside the band.

  python -m experiments.screen --model smollm2-135m-instruct --reply-prefix '\\boxed{' --stop '}' \\
      --max-new-tokens 16 --episodes 24

This is how `small` was chosen (docs/evaluation.md): the candidates are reasoning-gym generators at
their default difficulty that share no family with the training library (spade_jax/envs/library).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from experiments.eval import UsageError, _load_policy
from spade_jax import evaluation
from spade_jax.evaluation.rg_items import parse_rg_task, rg_dataset

# Screening seeds: far from the suites' HELDOUT_SEED_BASE + 0..episodes-1.
SCREEN_SEED_BASE = 900_777

# One-turn reasoning-gym generators with short answers, none of the training library's families
# (no knights_knaves, maze, number_sequence, tower_of_hanoi, sokoban, countdown...).
CANDIDATES = (
    "isomorphic_strings", "ransom_note", "course_schedule", "basic_arithmetic", "chain_sum", "gcd", "lcm",
    "count_bits", "letter_counting", "leg_counting", "products", "power_function", "simple_equations", "aiw",
    "family_relationships", "propositional_logic", "dice", "base_conversion", "number_sorting",
    "spell_backward", "word_sequence_reversal", "decimal_arithmetic", "fraction_simplification",
    "binary_alternation", "time_intervals", "calendar_arithmetic", "syllogism", "circuit_logic",
    "count_primes", "bitwise_arithmetic", "decimal_chain_sum", "number_format",
    "self_reference", "game_of_life_halting", "prime_factorization", "word_sorting", "caesar_cipher",
    "letter_jumble", "string_insertion",
)


def split_candidates(text: str) -> list[str]:
    """The comma-separated candidates of --candidates, where a candidate's own config may hold commas:
    "gcd,chain_sum(min_terms=2, max_terms=2)" -> ["gcd", "chain_sum(min_terms=2, max_terms=2)"]."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += (char in "([") - (char in ")]")
        if char == "," and depth <= 0:
            names.append(text[start:i].strip())
            start = i + 1
    return [name for name in names if name]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.screen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="preset name, HF model directory or .gguf file")
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help="comma-separated reasoning-gym datasets, each at its default difficulty or at a "
                             "config, e.g. 'gcd,chain_sum(min_terms=2, max_terms=2)' (default: the built-in list)")
    parser.add_argument("--episodes", type=int, default=24, help="episodes per candidate")
    parser.add_argument("--low", type=float, default=0.10, help="lower edge of the band")
    parser.add_argument("--high", type=float, default=0.60, help="upper edge of the band")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per agent reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--reply-prefix", default="", help="text forced at the start of every reply")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string, repeatable")
    parser.add_argument("--answer-line", default=None,
                        help="the line after each question, in place of the suites' "
                             "(spade_jax.evaluation.RG_ANSWER_INSTRUCTION): to screen under another answer format")
    parser.add_argument("--batch-size", type=int, default=8, help="most conversations per generation call")
    parser.add_argument("--out", help="JSON file for the per-candidate figures")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from spade_jax.run import setup_logging

    setup_logging(None, "WARNING")
    try:
        if args.episodes < 1:
            raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
        if not 0 <= args.low < args.high <= 1:
            raise UsageError(f"the band must satisfy 0 <= --low < --high <= 1, got [{args.low}, {args.high}]")
        names = split_candidates(args.candidates)
        if not names:
            raise UsageError("--candidates names no dataset")
        from reasoning_gym.factory import DATASETS

        for name in names:
            dataset = rg_dataset(name)
            if dataset not in DATASETS:
                close = difflib.get_close_matches(dataset, DATASETS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UsageError(f"no reasoning-gym dataset {dataset!r}{hint}")
            parse_rg_task(name)
        seeds = tuple(range(SCREEN_SEED_BASE, SCREEN_SEED_BASE + args.episodes))
        tasks = [evaluation.EvalTask(f"rg:{name}", args.episodes, 1, seeds) for name in names]
        args.run, args.seed = None, 0
        policy, _ = _load_policy(args)
    except (UsageError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from spade_jax.evaluation import environments

    suites_line = environments.RG_ANSWER_INSTRUCTION
    if args.answer_line is not None:
        environments.RG_ANSWER_INSTRUCTION = args.answer_line
    try:
        rows = _screen(policy, tasks, args)
    finally:
        environments.RG_ANSWER_INSTRUCTION = suites_line
    print(f"\n{sum(r['in_band'] for r in rows)} of {len(rows)} candidates inside [{args.low:.0%}, {args.high:.0%}] (*)")
    return 0


def _screen(policy, tasks: list, args: argparse.Namespace) -> list[dict]:
    from spade_jax.evaluation import environments
    from spade_jax.rollout import AGENT_SYSTEM

    rows = []
    for task in tasks:  # one at a time: each line is printed (and saved) as soon as it is known
        report = evaluation.evaluate(policy, evaluation.EvalSuite("screen", (task,)), batch_size=args.batch_size,
                                     system_prompt=AGENT_SYSTEM)
        row = report.to_dict()["tasks"][0]
        row["in_band"] = args.low <= row["success_rate"] <= args.high
        row["answer_line"] = environments.RG_ANSWER_INSTRUCTION
        rows.append(row)
        print(f"{'*' if row['in_band'] else ' '} {row['env_id']:<48} {row['successes']:>3}/{row['episodes']:<3} "
              f"{row['success_rate']:6.1%}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    sys.exit(main())
