"""Qwen3-MoE sparse block: a float32 softmax router picks top-k experts per token, and a dropless
grouped matmul (`jax.lax.ragged_dot` over tokens sorted by expert) runs only the chosen experts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax.models.layers import param
from spade_jax.models.spec import ModelSpec


def route(x_ne: jax.Array, router_ex: jax.Array, top_k: int, norm_topk_prob: bool):
    """Router logits [N, X] (compute dtype), top-k weights [N, k] (compute dtype) and expert ids [N, k].

    Matches HF `Qwen3MoeTopKRouter`: softmax over all experts in float32, top-k, optional
    renormalisation of the k weights, then a cast back to the logits' dtype.
    """
    logits_nx = x_ne @ router_ex
    probs_nx = jax.nn.softmax(logits_nx.astype(jnp.float32), axis=-1)
    weights_nk, experts_nk = jax.lax.top_k(probs_nx, top_k)
    if norm_topk_prob:
        weights_nk = weights_nk / jnp.sum(weights_nk, axis=-1, keepdims=True)
    return logits_nx, weights_nk.astype(logits_nx.dtype), experts_nk


def load_balancing_loss(logits_nx: jax.Array, top_k: int, valid_n: jax.Array | None = None):
    """Switch-style auxiliary loss, as HF's `load_balancing_loss_func` for one layer:
    num_experts * sum_x (top-k assignments to x per token) * (mean router probability of x).
    """
    num_experts = logits_nx.shape[-1]
    probs_nx = jax.nn.softmax(logits_nx.astype(jnp.float32), axis=-1)
    _, experts_nk = jax.lax.top_k(probs_nx, top_k)
    chosen_nx = jnp.sum(jax.nn.one_hot(experts_nk, num_experts, dtype=jnp.float32), axis=1)
    w_n1 = jnp.ones(logits_nx.shape[:1] + (1,)) if valid_n is None else valid_n.astype(jnp.float32)[:, None]
    rows = jnp.maximum(jnp.sum(w_n1), 1.0)
    tokens_per_expert = jnp.sum(chosen_nx * w_n1, axis=0) / rows
    prob_per_expert = jnp.sum(probs_nx * w_n1, axis=0) / rows
    return num_experts * jnp.sum(tokens_per_expert * prob_per_expert)


class MoE(nnx.Module):
    """Top-k routed SwiGLU experts. Expert weights are [expert, ...] so the `expert` mesh axis shards them."""

    def __init__(self, spec: ModelSpec, *, dtype, param_dtype, rngs: nnx.Rngs):
        e, x, i = spec.hidden_size, spec.num_experts, spec.moe_intermediate_size
        self.dtype, self.top_k, self.norm_topk_prob = dtype, spec.experts_per_token, spec.norm_topk_prob
        self.router = param(rngs, (e, x), ("embed", "expert"), param_dtype)
        self.gate = param(rngs, (x, e, i), ("expert", "embed", "moe_mlp"), param_dtype)
        self.up = param(rngs, (x, e, i), ("expert", "embed", "moe_mlp"), param_dtype)
        self.down = param(rngs, (x, i, e), ("expert", "moe_mlp", "embed"), param_dtype)

    def __call__(self, x_bte: jax.Array) -> jax.Array:
        dt = self.dtype
        b, t, e = x_bte.shape
        x_ne = x_bte.reshape(b * t, e).astype(dt)
        num_experts = self.gate.shape[0]
        _, weights_nk, experts_nk = route(x_ne, self.router[...].astype(dt), self.top_k, self.norm_topk_prob)
        # Dropless dispatch: every (token, choice) pair becomes one row, rows sorted by expert id so each
        # expert's rows are contiguous, and ragged_dot multiplies each group by its own expert.
        expert_m = experts_nk.reshape(-1)
        token_m = jnp.repeat(jnp.arange(b * t), self.top_k)
        order_m = jnp.argsort(expert_m, stable=True)
        token_sorted = token_m[order_m]
        group_sizes = jnp.bincount(expert_m, length=num_experts).astype(jnp.int32)
        rows_me = x_ne[token_sorted]
        gate_mi = jax.lax.ragged_dot(rows_me, self.gate[...].astype(dt), group_sizes)
        up_mi = jax.lax.ragged_dot(rows_me, self.up[...].astype(dt), group_sizes)
        out_me = jax.lax.ragged_dot(jax.nn.silu(gate_mi) * up_mi, self.down[...].astype(dt), group_sizes)
        out_me = out_me * weights_nk.reshape(-1)[order_m][:, None]
        combined_ne = jnp.zeros((b * t, e), jnp.float32).at[token_sorted].add(out_me.astype(jnp.float32))
        return combined_ne.astype(dt).reshape(b, t, e)
