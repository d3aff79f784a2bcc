"""Tokens/s of our jitted GRPO train step vs a PyTorch implementation of the same step (same
transformers LlamaForCausalLM weights, batch, loss, clip, AdamW) on this machine; MFU on accelerators.

python benchmarks/train_step.py [--layers 4 --hidden 256 --vocab 8192 --batch 8 --seq 256 --steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np


def make_batch(args, seed=0):
    rng = np.random.default_rng(seed)
    b, t = args.batch, args.seq
    tokens = rng.integers(0, args.vocab, (b, t)).astype(np.int32)
    prompt = t // 4
    loss_mask = np.zeros((b, t), bool)
    loss_mask[:, prompt:] = True
    return {
        "tokens": tokens,
        "positions": np.tile(np.arange(t, dtype=np.int32), (b, 1)),
        "loss_mask": loss_mask,
        "behaviour": np.log(rng.uniform(0.5, 1.0, (b, t)) / args.vocab).astype(np.float32),
        "advantages": rng.normal(0, 1, b).astype(np.float32),
    }


def hf_model(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64 or 64,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 192),
        head_dim=64, max_position_embeddings=max(2048, args.seq), rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).float(), config


def torch_grpo_step_fn(model, args):
    """The same GRPO step in PyTorch: token-level clipped surrogate, clip_grad_norm_, AdamW."""
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-6, betas=(0.9, 0.98), eps=1e-8)

    def step(batch):
        tokens = torch.from_numpy(batch["tokens"]).long()
        logits = model(input_ids=tokens, position_ids=torch.from_numpy(batch["positions"]).long()).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
        mask = torch.from_numpy(batch["loss_mask"][:, 1:]).float()
        old = torch.from_numpy(batch["behaviour"][:, 1:])
        adv = torch.from_numpy(batch["advantages"])[:, None]
        ratio = torch.exp(logp - old)
        pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.28) * adv)
        loss = (pg * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach().item()

    return step


def ours(model_torch, config, args):
    import jax
    import jax.numpy as jnp

    from spade_jax.models.hf import spec_from_hf_config, state_dict_items_to_model
    from spade_jax.rl import RLConfig, TrainBatch, make_train_step

    spec = spec_from_hf_config(config.to_dict())
    items = ((k, v.detach().numpy()) for k, v in model_torch.state_dict().items())
    dtype = jnp.bfloat16 if args.bf16 else jnp.float32
    model = state_dict_items_to_model(items, spec, dtype=dtype)
    cfg = RLConfig(aggregation="token", tis_cap=None, logprob_chunk=args.logprob_chunk,
                   compute_dtype="bfloat16" if args.bf16 else "float32", micro_batches=args.micro_batches)
    init, step = make_train_step(model, cfg, verbose=True)
    state = init(model)

    def to_batch(b):
        return TrainBatch(tokens_bt=b["tokens"], positions_bt=b["positions"], valid_bt=np.ones_like(b["loss_mask"]),
                          loss_mask_bt=b["loss_mask"], behaviour_logprobs_bt=b["behaviour"],
                          advantages_b=b["advantages"])

    holder = {"state": state}
    n_params = sum(x.size for x in jax.tree.leaves(state.params))

    def run(b):
        holder["state"], metrics = step(holder["state"], to_batch(b))
        return float(metrics["loss"])  # blocks until the step is done

    return run, n_params


def timed(fn, batches, warmup):
    for b in batches[:warmup]:
        first = fn(b)
    times = []
    for b in batches[warmup:]:
        start = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up)")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--logprob-chunk", type=int, default=None)
    ap.add_argument("--bf16", action="store_true", help="bfloat16 compute (ours only; fp32 masters)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="accelerator peak for MFU (default: H100/H200 bf16 989)")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch baseline (e.g. on an accelerator host)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    batches = [make_batch(args, seed) for seed in range(args.steps + 1)]
    tokens = args.batch * args.seq
    model_torch, config = hf_model(args)
    run_ours, n_params = ours(model_torch, config, args)  # copies the weights before torch trains them
    start = time.perf_counter()
    loss_ours, t_ours = timed(run_ours, batches, warmup=1)
    compile_s = time.perf_counter() - start - t_ours * args.steps
    import jax

    result = {
        "model": f"Llama {args.layers}x{args.hidden}, vocab {args.vocab}, {n_params / 1e6:.1f}M params",
        "batch": f"{args.batch}x{args.seq}", "backend": jax.default_backend(),
        "ours_tokens_per_s": tokens / t_ours, "ours_first_step_loss": loss_ours,
        "ours_first_call_s_incl_compile": round(compile_s, 1),
    }
    if not args.skip_torch:
        loss_torch, t_torch = timed(torch_grpo_step_fn(model_torch, args), batches, warmup=1)
        result.update(torch_tokens_per_s=tokens / t_torch, torch_first_step_loss=loss_torch,
                      ratio=t_torch / t_ours)
    # 6 N T for the dense matmuls plus 6 * 2 * layers * T^2 * hidden-per-token for attention (fwd + bwd).
    flops = 6 * n_params * tokens + 12 * args.layers * args.batch * args.seq ** 2 * (config.num_attention_heads * 64)
    result["model_tflops_per_s"] = flops / t_ours / 1e12
    if jax.default_backend() != "cpu":
        peak = args.peak_tflops or 989.0
        result["mfu"] = flops / t_ours / 1e12 / peak
    print(json.dumps(result, indent=1))
    line = f"ours {result['ours_tokens_per_s']:.0f} tokens/s"
    if "ratio" in result:
        line += f", PyTorch {result['torch_tokens_per_s']:.0f} tokens/s, ratio {result['ratio']:.2f}x"
    if "mfu" in result:
        line += f", MFU {100 * result['mfu']:.1f}%"
    print(line)


if __name__ == "__main__":
    main()
