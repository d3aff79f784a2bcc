"""One accelerator's figures for a Qwen3-1.7B-shaped model with random weights, in a few minutes:

1. attention: every `model.attention` implementation against the einsum path on this device;
2. decode at batch 16 as a share of the HBM roofline: (weight bytes + KV bytes read per step) / step
   time / the device's peak HBM bandwidth (from its device kind);
3. train-step MFU in bf16: model FLOPs (6 x matmul params x tokens + causal attention) / step time /
   the device's peak bf16 FLOP/s;
4. the wall time of one self-play iteration (`experiments.run --config tiny`) at that scale.

    python benchmarks/gpu_suite.py [--out DIR] [--dry-run] [--attention einsum|dot_product|splash]
        [--peak-hbm-gbs X] [--peak-tflops Y] [--skip attention,decode,train,selfplay]

`--dry-run` runs every part with tiny shapes on whatever device there is (CPU included): what the quick
test checks. Peaks of unknown device kinds are missing (the shares are then null) unless given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

# Device kind substring -> (peak HBM bytes/s, peak dense bf16 FLOP/s), from the vendors' data sheets.
# The first match wins, so more specific names come first.
PEAKS = (
    ("GH200", 4.0e12, 989e12),
    ("H200", 4.8e12, 989e12),
    ("H100 PCIe", 2.0e12, 756e12),
    ("H100", 3.35e12, 989e12),  # SXM
    ("H800", 3.35e12, 989e12),
    ("B200", 8.0e12, 2250e12),
    ("A100-SXM4-80GB", 2.039e12, 312e12),
    ("A100 80GB", 2.039e12, 312e12),
    ("A100", 1.555e12, 312e12),
    ("L40S", 0.864e12, 362e12),
    ("L4", 0.3e12, 121e12),
    ("A10G", 0.6e12, 70e12),
    ("TPU v5p", 2.765e12, 459e12),
    ("TPU v5 lite", 0.819e12, 197e12),
    ("TPU v6 lite", 1.64e12, 918e12),
    ("TPU v4", 1.2e12, 275e12),
)

FULL = dict(model="qwen3-1.7b", decode_batch=16, prompt=128, new_short=32, new_long=160, train_rows=8,
            train_length=1024, selfplay_timeout=420)
DRY = dict(model="tiny", decode_batch=4, prompt=16, new_short=4, new_long=68, train_rows=2, train_length=32,
           selfplay_timeout=420)


def peaks(kind: str, hbm_gbs: float | None, tflops: float | None) -> tuple[float | None, float | None]:
    hbm, flops = next(((h, f) for name, h, f in PEAKS if name.lower() in kind.lower()), (None, None))
    return (hbm if hbm_gbs is None else hbm_gbs * 1e9), (flops if tflops is None else tflops * 1e12)


def attention_parity(dtype, decode: bool = False) -> dict:
    """Largest |impl - einsum| of each implementation on random GQA inputs with left padding: a causal
    self-attention of 256 tokens, or (`decode`) one new token over a 256-slot cache."""
    from spade_jax.models.attention import ATTENTION, AttnMask, attend

    b, s, kvh, g, d = 2, 256, 2, 4, 128
    t = 1 if decode else s
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, t, kvh, g, d)), dtype)
    k = jnp.asarray(rng.normal(size=(b, kvh, d, s)), dtype)
    v = jnp.asarray(rng.normal(size=(b, kvh, s, d)), dtype)
    valid = np.ones((b, s), bool)
    valid[1, :40] = False
    if decode:
        valid[:, 200:] = False  # slots not written yet
        keys = np.broadcast_to(valid[:, None], (b, 1, s))
        valid_q = np.ones((b, 1), bool)
    else:
        keys = np.tril(np.ones((t, s), bool))[None] & valid[:, None]
        valid_q = valid
    mask = AttnMask(jnp.asarray(keys), jnp.asarray(valid), self_attention=not decode)
    outs = {}
    for impl in ATTENTION:
        try:
            outs[impl] = np.asarray(jax.jit(attend, static_argnums=0)(impl, q, k, v, mask), np.float32)
        except Exception as err:  # a kernel this device lacks: say which, keep going
            outs[impl] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    want = outs["einsum"]
    return {impl: out if isinstance(out, str) else float(np.abs(out - want)[valid_q].max())
            for impl, out in outs.items()}


def _param_bytes(model) -> int:
    from flax import nnx

    return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def decode_roofline(cfg: dict, hbm: float | None) -> dict:
    """Steady decode step time at the batch, from two generations that differ only in their length."""
    from spade_jax.models.presets import get_preset, init_decoder
    from spade_jax.sampling import Sampler, SamplingConfig

    spec = get_preset(cfg["model"])
    model = init_decoder(spec, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    model.set_attention(cfg["attention"])
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, spec.vocab_size, cfg["prompt"]).tolist() for _ in range(cfg["decode_batch"])]
    sampler = Sampler(model)

    def timed(new):
        # One new-token bucket for both lengths: the same compiled program and cache size.
        config = SamplingConfig(max_new_tokens=new, temperature=0.0, ignore_eos=True, new_token_bucket=cfg["new_long"])
        best = math.inf
        for _ in range(3):  # the first call compiles
            t0 = time.perf_counter()
            sampler.generate(prompts, config, 0)
            best = min(best, time.perf_counter() - t0)
        return best

    short, long = timed(cfg["new_short"]), timed(cfg["new_long"])
    step_s = (long - short) / (cfg["new_long"] - cfg["new_short"])
    weights = _param_bytes(model)
    # KV a step must read: both caches of every layer, filled to the prompt plus half the new tokens
    # (the average over the steps); bf16.
    filled = cfg["prompt"] + (cfg["new_short"] + cfg["new_long"]) / 2
    kv = 2 * spec.num_layers * cfg["decode_batch"] * spec.num_kv_heads * spec.head_dim * filled * 2
    achieved = (weights + kv) / step_s
    return {"model": cfg["model"], "attention": cfg["attention"], "batch": cfg["decode_batch"],
            "step_ms": round(step_s * 1e3, 3),
            "tokens_per_s": round(cfg["decode_batch"] / step_s, 1), "weight_bytes": weights,
            "kv_bytes_per_step": int(kv), "achieved_gbs": round(achieved / 1e9, 1),
            "peak_gbs": None if hbm is None else round(hbm / 1e9), "roofline_share":
            None if hbm is None else round(achieved / hbm, 3)}


def train_flops(spec, rows: int, length: int) -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation counted)."""
    e, h, kvh, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
    per_layer = e * h * d * 2 + e * kvh * d * 2 + 3 * e * spec.intermediate_size
    matmul_params = spec.num_layers * per_layer + spec.vocab_size * e  # blocks + output projection
    tokens = rows * length
    attention = 6 * spec.num_layers * h * d * length * length * rows  # causal: half of QK^T and PV, x3
    return 6 * matmul_params * tokens + attention


def train_mfu(cfg: dict, flops_peak: float | None) -> dict:
    from experiments.ablate_sharding import _batch
    from spade_jax.models.presets import get_preset, init_decoder
    from spade_jax.rl.config import RLConfig
    from spade_jax.rl.train import make_train_step

    spec = get_preset(cfg["model"])
    model = init_decoder(spec, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    model.remat = True  # the run config's default
    model.set_attention(cfg["attention"])
    step = make_train_step(model, RLConfig(), None, verbose=False)
    state = step.init(model)
    del model
    batch = _batch(spec, cfg["train_rows"], cfg["train_length"])
    times = []
    for _ in range(4):  # the first call compiles
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times[1:]))
    flops = train_flops(spec, cfg["train_rows"], cfg["train_length"])
    return {"model": cfg["model"], "attention": cfg["attention"], "tokens": cfg["train_rows"] * cfg["train_length"],
            "step_s": round(step_s, 4),
            "model_tflops": round(flops / 1e12, 2), "achieved_tflops": round(flops / step_s / 1e12, 2),
            "peak_tflops": None if flops_peak is None else round(flops_peak / 1e12),
            "mfu": None if flops_peak is None else round(flops / step_s / flops_peak, 3),
            "loss_finite": bool(np.isfinite(float(metrics["loss"])))}


def selfplay_iteration(cfg: dict, out: str) -> dict:
    """One iteration of `experiments.run --config tiny` with the model swapped for the preset (random weights)."""
    run_dir = os.path.join(tempfile.mkdtemp(dir=out, prefix="selfplay_"), "run")  # a run never reuses a directory
    command = [sys.executable, "-m", "experiments.run", "--config", "tiny", "--out", run_dir, "iterations=1",
               f"model.name={cfg['model']}", "tensorboard=false"]
    if cfg["model"] != "tiny":
        command.append("model.dtype=bfloat16")
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=cfg["selfplay_timeout"],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wall = time.perf_counter() - t0
    result = {"model": cfg["model"], "command": " ".join(command[1:]), "returncode": done.returncode,
              "wall_s": round(wall, 1)}
    metrics_file = os.path.join(run_dir, "metrics.jsonl")
    if done.returncode != 0 or not os.path.exists(metrics_file):
        result["error"] = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return result
    with open(metrics_file) as fh:
        last = json.loads(fh.read().splitlines()[-1])
    result["phases_s"] = {k[len("time/"):]: round(v, 2) for k, v in last.items() if k.startswith("time/")}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_suite.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/out", help="directory for gpu_suite.json and the run")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on any device (the CPU test)")
    parser.add_argument("--peak-hbm-gbs", type=float, default=None, help="override the device's HBM GB/s")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 TFLOP/s")
    parser.add_argument("--attention", default="einsum", help="model.attention for the decode and train parts")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: attention,decode,train,selfplay")
    args = parser.parse_args(argv)
    cfg = dict(DRY if args.dry_run else FULL, attention=args.attention)
    os.makedirs(args.out, exist_ok=True)
    device = jax.devices()[0]
    hbm, flops = peaks(device.device_kind, args.peak_hbm_gbs, args.peak_tflops)
    report = {"device": f"{device.platform} {device.device_kind}", "jax": jax.__version__, "dry_run": args.dry_run}
    print(json.dumps(report), flush=True)
    parts = {"attention": lambda: {f"{jnp.dtype(dt)}{' decode' if decode else ''}": attention_parity(dt, decode)
                                   for dt in (jnp.float32, jnp.bfloat16) for decode in (False, True)},
             "decode": lambda: decode_roofline(cfg, hbm), "train": lambda: train_mfu(cfg, flops),
             "selfplay": lambda: selfplay_iteration(cfg, args.out)}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(parts):
        parser.error(f"--skip names unknown parts {sorted(skip - set(parts))}; choose from {', '.join(parts)}")
    for name, part in parts.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            report[name] = part()
        except Exception as err:  # one failing part must not cost the others' figures on a borrowed GPU
            report[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        report[name + "_wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({name: report[name]}), flush=True)
    with open(os.path.join(args.out, "gpu_suite.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    failed = [n for n in parts if n not in skip and isinstance(report[n], dict) and "error" in report[n]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
