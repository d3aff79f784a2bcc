"""Generation throughput: our JAX sampler vs transformers `generate` (PyTorch, same machine, same
SmolLM2-135M weights from the embedded GGUF, float32, greedy), prompt ~40 tokens + 64 new tokens.

    .venv/bin/python benchmarks/generate.py [--batches 1,16] [--new-tokens 64] [--repeats 3]
        [--torch-threads N] [--dtype float32|bfloat16] [--baseline-dtype float32|bfloat16]
        [--model HF_DIR | --model PRESET --random-weights] [--cpu-kernel auto|xla]

Prints tokens/s for both (best call) and their ratio per batch size: the median over calls made
back to back (ours, then transformers, `--repeats` times, so both see the same state of a shared
machine), with its range and the ratio of the two best calls; our compile time is reported
separately (first call minus a steady call). Both sides generate exactly --new-tokens per row (EOS ignored /
suppressed) so they do the same work, and our prompt-prefix reuse is off (each call prefills its
prompts in full, as transformers does). `--dtype bfloat16` runs our side with bf16 weights and
activations (float32 accumulation) against the same float32 baseline: a speed option, not parity;
`--baseline-dtype bfloat16` runs transformers in bf16 too (the fair pairing on a GPU). The baseline
runs on CUDA when PyTorch sees a GPU, else on the CPU. `--cpu-kernel xla` turns off our packed
float32 decode kernel (`SamplingConfig.cpu_kernel`; on by default on AVX2/AVX-512 CPUs): the A/B of it.

`--random-weights` initialises the preset's architecture randomly instead of loading weights, with
prompts of random token ids of SmolLM2-like lengths (34-46 tokens); transformers loads the same
random weights from an HF directory we export. Under greedy decoding with EOS ignored the work does
not depend on the weights' values, so this measures the same speed where the 98 MB GGUF cannot
travel (the GPU machine) and for architecture presets without local weights (`--model qwen3-1.7b`).

It also prints the roofline of one decode step: its time is measured by differencing a run of
--new-tokens and one of half as many (prefill cancels out), and compared with the time to read the
weights and the KV cache once (at the HBM bandwidth of a known GPU, or on a CPU at the read
bandwidth measured here by a jitted reduction over 1 GiB) and with the time for its matmul FLOPs
at the rate a jitted 2048^3 matmul reaches here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.models.hf import export_hf
from spade_jax.models.presets import get_preset, init_decoder
from spade_jax.models.registry import EMBEDDED_GGUF, EMBEDDED_MODEL, embedded_gguf_path, load_model
from spade_jax.sampling import Sampler, SamplingConfig, fit_bucket

QUESTIONS = [
    "What is the capital of France?", "Name three primary colors.", "How many legs does a spider have?",
    "What does a compiler do?", "Give me a synonym for happy.", "Why is the sky blue?",
    "What is two plus three?", "Name a famous painter.", "What is photosynthesis?",
    "How do magnets work?", "What is the largest ocean?", "Explain gravity briefly.",
    "What is a prime number?", "Who wrote Hamlet?", "What is the boiling point of water?",
    "Describe a cat in one line.",
]
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # spec sheets; else measured


def _prompts(tokenizer, batch: int) -> list[list[int]]:
    return [tokenizer.encode_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
            for i in range(batch)]


def _random_prompts(vocab_size: int, batch: int) -> list[list[int]]:
    """Token ids drawn at random, 34-46 per row (the chat prompts above are 35-45 SmolLM2 tokens)."""
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab_size, size=34 + (i * 5) % 13).tolist() for i in range(batch)]


def bench_model(name: str, random_weights: bool, dtype):
    """(model, tokenizer, spec): the preset `name` randomly initialised (with the byte tokenizer, of
    which only the pad id and EOS are used), or `name` loaded (embedded model or HF directory)."""
    if random_weights:
        spec = get_preset(name)
        return init_decoder(spec, dtype=dtype, param_dtype=dtype), load_model("tiny").tokenizer, spec
    return load_model(name, dtype=dtype, param_dtype=dtype)


def bench_prompts(tokenizer, spec, batch: int, random_weights: bool) -> list[list[int]]:
    return _random_prompts(spec.vocab_size, batch) if random_weights else _prompts(tokenizer, batch)


def _time(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def ours_runner(model, tokenizer, prompts, new_tokens, cpu_kernel="auto"):
    """(seconds of the first call, which compiles and packs the decode weights; a function that
    makes one steady call; the sampler)."""
    sampler = Sampler(model, tokenizer)
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                            reuse_prefix=False, cpu_kernel=cpu_kernel)
    start = time.perf_counter()
    first = sampler.generate(prompts, config)
    first_s = time.perf_counter() - start
    assert all(len(t) == new_tokens for t in first.tokens)
    return first_s, lambda: sampler.generate(prompts, config), sampler


def transformers_runner(prompts, new_tokens, pad_id, threads=0, hf_dir=None, dtype="float32"):
    """(seconds of the first call, a function that makes one call, torch threads, torch device).

    Loads the embedded GGUF, or the HF directory `hf_dir` when given; runs on CUDA if PyTorch sees it.
    """
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    if hf_dir is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(embedded_gguf_path()), gguf_file=EMBEDDED_GGUF, dtype=torch_dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch_dtype)
    model = model.to(device).eval()
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):  # left padding, as decoder-only generation needs
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)

    def run():
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, pad_token_id=pad_id)
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == width + new_tokens

    start = time.perf_counter()
    run()
    return time.perf_counter() - start, run, torch.get_num_threads(), device


def alternated(runs, repeats: int) -> list[list[float]]:
    """Seconds of each run, called in turn `repeats` times: on a shared VM each side's speed drifts by
    tens of percent within minutes, and alternating lets both see the same machine."""
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, out in zip(runs, times):
            out += _time(run, 1)
    return times


def _summary(times: list[float], first_s: float, rows: int, new_tokens: int) -> dict:
    best = min(times)
    return {"tokens_per_s": rows * new_tokens / best, "best_s": best,
            "median_s": statistics.median(times), "first_s": first_s, "times_s": times}


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes/s a jitted reduction reads from device memory (host RAM on a CPU backend)."""
    data = jnp.ones((int(gib * 2**30) // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(data).block_until_ready()
    best = min(_time(lambda: total(data).block_until_ready(), repeats))
    return data.nbytes / best


def matmul_flops(dtype=jnp.float32, repeats: int = 5) -> float:
    """FLOP/s of a jitted square matmul in `dtype` (2048^3 on a CPU, 8192^3 on an accelerator): what
    this backend's dense kernels reach."""
    size = 2048 if jax.default_backend() == "cpu" else 8192
    a = jnp.ones((size, size), dtype)
    mm = jax.jit(jnp.matmul)
    mm(a, a).block_until_ready()
    best = min(_time(lambda: mm(a, a).block_until_ready(), repeats))
    return 2 * size**3 / best


def decode_roofline(model, spec, batch, prompt_len, new_tokens, step_s, bandwidth, flops):
    """One decode step against the time to read the weights + KV cache once and to do its matmuls."""
    leaves = jax.tree.leaves(model)
    param_bytes = sum(x.size * x.dtype.itemsize for x in leaves)
    itemsize = max(leaves, key=lambda x: x.size).dtype.itemsize
    slots = fit_bucket(prompt_len, SamplingConfig().prompt_buckets, "prompt") + 64 * -(-new_tokens // 64)
    kv_bytes = 2 * spec.num_layers * batch * slots * spec.num_kv_heads * spec.head_dim * itemsize
    matmul_params = sum(x.size for x in leaves if x.ndim >= 2)  # dense models: every expert counts
    if not spec.tie_embeddings:  # the input embedding is a gather, not a matmul
        matmul_params -= spec.vocab_size * spec.hidden_size
    step_flops = 2 * batch * matmul_params
    read_s = (param_bytes + kv_bytes) / bandwidth
    compute_s = step_flops / flops
    return {"decode_step_s": step_s, "decode_tokens_per_s": batch / step_s,
            "bytes_per_step": param_bytes + kv_bytes, "read_s": read_s,
            "flops_per_step": step_flops, "compute_s": compute_s,
            "roofline_tokens_per_s": batch / max(read_s, compute_s),
            "roofline_fraction": max(read_s, compute_s) / step_s,
            "bound": "bandwidth" if read_s >= compute_s else "compute"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="our weights and activations (the baseline's: --baseline-dtype)")
    parser.add_argument("--baseline-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="transformers' weights and activations")
    parser.add_argument("--model", default=EMBEDDED_MODEL,
                        help="the embedded SmolLM2 (its GGUF), an HF model directory (both sides load it), "
                             "or with --random-weights any preset")
    parser.add_argument("--random-weights", action="store_true",
                        help="random init of the preset's architecture; random prompt ids (see above)")
    parser.add_argument("--cpu-kernel", default="auto", choices=("auto", "xla"),
                        help="our decode matmuls on a CPU: the packed float32 kernel where it applies, or XLA's dot")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch.set_num_threads for the baseline (0: PyTorch's default); on a loaded "
                             "machine 1 avoids OpenMP oversubscription that slows PyTorch far more than XLA")
    args = parser.parse_args()

    dtype = jnp.dtype(args.dtype)
    hf_dir, exported = None, False  # what transformers loads (None: the embedded GGUF)
    if not (args.random_weights or args.model == EMBEDDED_MODEL or os.path.isdir(args.model)):
        parser.error(f"--model {args.model}: use {EMBEDDED_MODEL}, an HF model directory, or a preset "
                     "with --random-weights")
    model, tokenizer, spec = bench_model(args.model, args.random_weights, dtype)
    if args.random_weights and not args.skip_transformers:
        hf_dir, exported = tempfile.mkdtemp(prefix="generate-bench-"), True
        export_hf(model, hf_dir)
    elif os.path.isdir(args.model):
        hf_dir = args.model
    print(f"backend={jax.default_backend()} devices={len(jax.devices())} cpus={os.cpu_count()} "
          f"load average={os.getloadavg()[0]:.1f} (other processes share these cores) "
          f"model={args.model}{' (random weights)' if args.random_weights else ''}")
    kind = getattr(jax.devices()[0], "device_kind", "")
    measured = read_bandwidth()
    bandwidth = next((v for k, v in HBM_BYTES_PER_S.items() if k in kind), None) or measured
    flops = matmul_flops(dtype)
    print(f"{kind}: read bandwidth {bandwidth / 1e9:.1f} GB/s (measured by a reduction: "
          f"{measured / 1e9:.1f}), {args.dtype} matmul {flops / 1e12:.2f} TFLOP/s")
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = bench_prompts(tokenizer, spec, batch, args.random_weights)
        mean_len = float(np.mean([len(p) for p in prompts]))
        first_s, ours_run, sampler = ours_runner(model, tokenizer, prompts, args.new_tokens, args.cpu_kernel)
        _, half_run, _ = ours_runner(model, tokenizer, prompts, args.new_tokens // 2, args.cpu_kernel)
        runs = [ours_run, half_run]
        if not args.skip_transformers:
            ref_first_s, ref_run, threads, torch_device = transformers_runner(
                prompts, args.new_tokens, tokenizer.pad_token_id, args.torch_threads, hf_dir,
                args.baseline_dtype)
            runs.append(ref_run)
        times = alternated(runs, args.repeats)
        ours = _summary(times[0], first_s, batch, args.new_tokens)
        ours["compile_s"] = max(first_s - ours["best_s"], 0.0)
        ours["compiles"] = sampler.compile_count
        ours["decode_matmul"] = ("packed kernel" if sampler.uses_cpu_kernel(SamplingConfig(cpu_kernel=args.cpu_kernel))
                                 else "xla")
        half_best = min(times[1])
        row = {"batch": batch, "prompt_tokens": mean_len, "new_tokens": args.new_tokens, "ours": ours,
               "dtype": args.dtype}
        step_s = (ours["best_s"] - half_best) / (args.new_tokens - args.new_tokens // 2)
        row["roofline"] = decode_roofline(model, spec, batch, max(map(len, prompts)), args.new_tokens,
                                          step_s, bandwidth, flops)
        if not args.skip_transformers:
            ref = _summary(times[2], ref_first_s, batch, args.new_tokens)
            ref["threads"] = threads
            ref["device"] = torch_device
            ref["dtype"] = args.baseline_dtype
            row["transformers"] = ref
            paired = [theirs / mine for mine, theirs in zip(times[0], times[2])]
            row["ratio"] = statistics.median(paired)  # of calls made back to back
            row["ratio_range"] = [min(paired), max(paired)]
            row["ratio_of_bests"] = ours["tokens_per_s"] / ref["tokens_per_s"]
        rows.append(row)
        line = (f"batch {batch:3d} prompt ~{mean_len:.0f} tok + {args.new_tokens} new: "
                f"ours ({args.dtype}, {ours['decode_matmul']}) "
                f"{ours['tokens_per_s']:7.1f} tok/s (compile {ours['compile_s']:.1f} s)")
        if "transformers" in row:
            where = (f"{row['transformers']['threads']} threads" if torch_device == "cpu"
                     else torch_device)
            line += (f" | transformers ({where}, {args.baseline_dtype}) "
                     f"{row['transformers']['tokens_per_s']:7.1f} tok/s | ratio {row['ratio']:.2f}x "
                     f"(back-to-back pairs {row['ratio_range'][0]:.2f}-{row['ratio_range'][1]:.2f}x, "
                     f"bests {row['ratio_of_bests']:.2f}x)")
        roof = row["roofline"]
        line += (f" | decode step {1e3 * roof['decode_step_s']:.1f} ms = {roof['decode_tokens_per_s']:.0f} "
                 f"tok/s, {100 * roof['roofline_fraction']:.0f}% of the {roof['bound']} roofline "
                 f"({roof['roofline_tokens_per_s']:.0f} tok/s: read {1e3 * roof['read_s']:.1f} ms, "
                 f"matmuls {1e3 * roof['compute_s']:.1f} ms)")
        print(line + f" [load {os.getloadavg()[0]:.1f}]", flush=True)
    print(json.dumps(rows))
    if exported:
        shutil.rmtree(hf_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
