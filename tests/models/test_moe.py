"""spade_jax.models.moe against HF's Qwen3MoeSparseMoeBlock and a dense all-experts formulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from transformers import Qwen3MoeConfig  # noqa: E402 (after the torch importorskip)
from transformers.models.qwen3_moe import modeling_qwen3_moe as hf_moe  # noqa: E402 (after the torch importorskip)

from spade_jax.models.moe import MoE, load_balancing_loss, route  # noqa: E402 (after the torch importorskip)
from spade_jax.models.spec import ModelSpec  # noqa: E402 (after the torch importorskip)

HIDDEN, EXPERTS, TOP_K, INNER = 16, 6, 2, 12


def _spec(norm_topk_prob):
    return ModelSpec(
        arch="qwen3_moe", vocab_size=32, hidden_size=HIDDEN, intermediate_size=24, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=8, qk_norm=True, num_experts=EXPERTS,
        experts_per_token=TOP_K, moe_intermediate_size=INNER, norm_topk_prob=norm_topk_prob,
    )


def _pair(norm_topk_prob, seed=0):
    """An HF sparse block with random weights and our MoE holding the same weights."""
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        moe_intermediate_size=INNER, norm_topk_prob=norm_topk_prob,
    )
    block = hf_moe.Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(0.5 * torch.randn(param.shape))
    ours = MoE(_spec(norm_topk_prob), dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    gate_up = block.experts.gate_up_proj.detach().numpy()  # [X, 2I, E]
    ours.router.set_value(jnp.asarray(block.gate.weight.detach().numpy().T))
    ours.gate.set_value(jnp.asarray(gate_up[:, :INNER].transpose(0, 2, 1)))
    ours.up.set_value(jnp.asarray(gate_up[:, INNER:].transpose(0, 2, 1)))
    ours.down.set_value(jnp.asarray(block.experts.down_proj.detach().numpy().transpose(0, 2, 1)))
    return block, ours


@nnx.jit
def _apply(moe, x):
    return moe(x)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_matches_hf_sparse_moe_block(norm_topk_prob):
    block, ours = _pair(norm_topk_prob)
    x = np.random.RandomState(1).randn(3, 7, HIDDEN).astype(np.float32)
    with torch.no_grad():
        want = block(torch.tensor(x)).numpy()
    got = np.asarray(_apply(ours, jnp.asarray(x)))
    assert np.abs(want).max() > 0.1
    assert np.abs(got - want).max() <= 1e-5


def _dense_reference(moe, x_ne):
    """Every expert on every token, weighted by a [N, X] routing matrix that is zero off the top-k."""
    _, weights_nk, experts_nk = route(x_ne, moe.router[...], moe.top_k, moe.norm_topk_prob)
    combine_nx = jnp.sum(jax.nn.one_hot(experts_nk, EXPERTS) * weights_nk[..., None], axis=1)
    gate = jnp.einsum("ne,xei->xni", x_ne, moe.gate[...])
    up = jnp.einsum("ne,xei->xni", x_ne, moe.up[...])
    out_xne = jnp.einsum("xni,xie->xne", jax.nn.silu(gate) * up, moe.down[...])
    return jnp.einsum("xne,nx->ne", out_xne, combine_nx)


def test_gradients_match_dense_all_experts_formulation():
    _, ours = _pair(True, seed=3)
    x = jnp.asarray(np.random.RandomState(2).randn(1, 9, HIDDEN).astype(np.float32))

    def grouped(moe):
        return jnp.sum(jnp.sin(moe(x)))

    def dense(moe):
        return jnp.sum(jnp.sin(_dense_reference(moe, x[0])))

    g_grouped = nnx.jit(nnx.grad(grouped))(ours)
    g_dense = nnx.jit(nnx.grad(dense))(ours)
    for name in ("router", "gate", "up", "down"):
        np.testing.assert_allclose(
            np.asarray(g_grouped[name][...]), np.asarray(g_dense[name][...]), atol=2e-5, rtol=1e-4
        )


def test_load_balancing_loss_matches_hf():
    rng = np.random.RandomState(4)
    logits = rng.randn(10, EXPERTS).astype(np.float32)
    mask = np.ones((2, 5), np.int64)
    mask[0, :2] = 0
    want = hf_moe.load_balancing_loss_func(
        (torch.tensor(logits),), EXPERTS, TOP_K, torch.tensor(mask)
    ).item()
    got = float(load_balancing_loss(jnp.asarray(logits), TOP_K, jnp.asarray(mask.reshape(-1) > 0)))
    assert got == pytest.approx(want, rel=1e-5)
    want_all = hf_moe.load_balancing_loss_func((torch.tensor(logits),), EXPERTS, TOP_K).item()
    assert float(load_balancing_loss(jnp.asarray(logits), TOP_K)) == pytest.approx(want_all, rel=1e-5)
