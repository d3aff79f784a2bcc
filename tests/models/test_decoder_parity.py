"""Logits parity of spade_jax.models.decoder against transformers (PyTorch, fp32) for every family."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")

from hf_tiny import hf_logits, hf_model, left_padded_batch, save_hf  # noqa: E402 (after the torch importorskip)

from spade_jax.models.decoder import Decoder, KVCache, rope_attention_factor, rope_inv_freq  # noqa: E402 (after the torch importorskip)
from spade_jax.models.hf import load_hf, spec_from_hf_config  # noqa: E402 (after the torch importorskip)
from spade_jax.models.presets import init_decoder  # noqa: E402 (after the torch importorskip)

TOL = 1e-4


@nnx.jit
def _forward(model, tokens, positions, valid):
    return model(tokens, positions, valid)[0]


def _ours(model, tokens, positions, valid=None):
    if valid is None:
        valid = np.ones(tokens.shape, bool)
    return np.asarray(_forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (HF torch model, saved directory)."""
    out = {}
    for family in ("llama", "qwen2", "qwen3", "qwen3_moe"):
        model = hf_model(family)
        out[family] = (model, save_hf(model, tmp_path_factory.mktemp(family)))
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_logits_match_transformers_with_left_padding(checkpoints, family):
    hf, path = checkpoints[family]
    ours = load_hf(path)
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size)
    want = hf_logits(hf, tokens, valid)
    got = _ours(ours, tokens, positions, valid)
    assert np.abs(want).max() > 0.5  # the random weights make non-trivial logits
    assert np.abs(got - want)[valid].max() <= TOL


@pytest.mark.parametrize("attention", ["dot_product", "splash"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2-sliding"])
def test_attention_implementations_match_transformers(checkpoints, tmp_path, family, attention):
    if family == "qwen2-sliding":
        hf = hf_model("qwen2", seed=7, use_sliding_window=True, sliding_window=4, max_window_layers=1)
        path = save_hf(hf, tmp_path)
    else:
        hf, path = checkpoints[family]
    ours = load_hf(path)
    ours.set_attention(attention)
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size)
    want = hf_logits(hf, tokens, valid)
    got = _ours(ours, tokens, positions, valid)
    assert np.abs(got - want)[valid].max() <= TOL


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_scan_layers_matches_loop(checkpoints, family):
    _, path = checkpoints[family]
    tokens, positions, valid = left_padded_batch(96, seed=3)
    loop = _ours(load_hf(path), tokens, positions, valid)
    scan = _ours(load_hf(path, scan_layers=True), tokens, positions, valid)
    assert np.abs(loop - scan)[valid].max() <= 1e-5


@pytest.mark.parametrize(
    "family,scan_layers,stacked_cache",
    # The model's own cache layout (per-layer buffers for the loop, stacked for scan) and the other
    # one, which the decoder converts to and back.
    [("qwen2", False, False), ("qwen3_moe", False, False), ("qwen2", True, True),
     ("qwen2", False, True), ("qwen2", True, False)],
)
def test_greedy_decode_through_cache_matches_generate(checkpoints, family, scan_layers, stacked_cache):
    hf, path = checkpoints[family]
    ours = load_hf(path, scan_layers=scan_layers)
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size, seed=5, batch=2, length=6)
    steps = 10
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        hf_out = hf.generate(
            torch.tensor(tokens),
            attention_mask=torch.tensor(valid.astype(np.int64)),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )[:, tokens.shape[1] :].numpy()

    @nnx.jit
    def step(model, toks, pos, val, cache):
        logits, cache = model(toks, pos, val, cache)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    cache = KVCache.create(ours.spec, 2, tokens.shape[1] + steps, stacked=stacked_cache)
    if stacked_cache == scan_layers:
        assert jax.tree.structure(cache) == jax.tree.structure(ours.new_cache(2, tokens.shape[1] + steps))
    nxt, cache = step(ours, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid), cache)
    pos = jnp.asarray(positions[:, -1])
    chosen = [nxt]
    for _ in range(steps - 1):
        pos = pos + 1
        nxt, cache = step(ours, nxt[:, None], pos[:, None], jnp.ones((2, 1), bool), cache)
        chosen.append(nxt)
    assert (np.stack(chosen, axis=1) == hf_out).all()


@pytest.mark.parametrize(
    "family,overrides",
    [
        ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                            low_freq_factor=1.0, high_freq_factor=4.0,
                                            original_max_position_embeddings=64))),
        ("qwen3", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                            original_max_position_embeddings=64))),
        ("qwen2", dict(rope_parameters=dict(rope_type="linear", rope_theta=5000.0, factor=2.0))),
        ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
        ("qwen3", dict(attention_bias=True, num_hidden_layers=3)),
        ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
        ("qwen3_moe", dict(norm_topk_prob=False, mlp_only_layers=[0], num_hidden_layers=3)),
        ("qwen3_moe", dict(decoder_sparse_step=2, tie_word_embeddings=True)),
    ],
    ids=["llama3-rope", "yarn-rope", "linear-rope", "llama-biases-tied", "qwen3-bias",
         "qwen2-sliding", "moe-dense-layer-unnormed", "moe-sparse-step-tied"],
)
def test_config_variants_match_transformers(tmp_path, family, overrides):
    hf = hf_model(family, seed=7, **overrides)
    ours = load_hf(save_hf(hf, tmp_path))
    # Positions beyond original_max_position_embeddings exercise the scaled frequencies.
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size, seed=2, length=12)
    positions = positions + valid * 70
    want_valid = valid
    with torch.no_grad():
        want = hf(
            torch.tensor(tokens),
            attention_mask=torch.tensor(valid.astype(np.int64)),
            position_ids=torch.tensor(positions),
        ).logits.numpy()
    got = _ours(ours, tokens, positions, valid)
    assert np.abs(got - want)[want_valid].max() <= TOL


def test_rope_frequencies_match_transformers_for_yarn():
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = dict(rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768)
    config = Qwen3Config(head_dim=128, max_position_embeddings=131072, rope_parameters=dict(rope))
    want_freq, want_scale = ROPE_INIT_FUNCTIONS["yarn"](config)
    spec = spec_from_hf_config(config.to_dict())
    np.testing.assert_allclose(np.asarray(rope_inv_freq(spec)), want_freq.numpy(), rtol=1e-6)
    assert rope_attention_factor(spec) == pytest.approx(want_scale)


def test_bf16_compute_runs_and_stays_close(checkpoints):
    hf, path = checkpoints["qwen3"]
    tokens, positions, valid = left_padded_batch(96, seed=4)
    want = hf_logits(hf, tokens, valid)
    for param_dtype in (jnp.float32, jnp.bfloat16):
        ours = load_hf(path, dtype=jnp.bfloat16, param_dtype=param_dtype)
        assert ours.layers[0].attn.q[...].dtype == param_dtype
        got = _ours(ours, tokens, positions, valid)
        assert got.dtype == np.float32 and np.isfinite(got).all()
        err = np.abs(got - want)[valid]
        assert err.max() <= 0.1 * np.abs(want).max()
        # The greedy choice mostly survives bf16 rounding.
        agree = (got.argmax(-1) == want.argmax(-1))[valid].mean()
        assert agree >= 0.8


def test_random_init_models_run_without_a_checkpoint():
    spec = spec_from_hf_config(
        dict(model_type="qwen3_moe", vocab_size=64, hidden_size=16, intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    )
    for scan in (False, True):
        model = init_decoder(spec, seed=0, scan_layers=scan)
        logits = _forward(model, jnp.zeros((1, 3), jnp.int32), jnp.arange(3)[None], jnp.ones((1, 3), bool))
        assert logits.shape == (1, 3, 64) and bool(jnp.isfinite(logits).all())
    stacked = nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0), scan_layers=True))
    assert stacked.layers.mlp.gate.shape == (2, 4, 16, 8)
    assert stacked.layers.mlp.gate.get_metadata()["logical_axes"] == ("layers", "expert", "embed", "moe_mlp")


def test_scan_layers_refuses_mixed_layers():
    spec = spec_from_hf_config(
        dict(model_type="qwen3_moe", vocab_size=64, hidden_size=16, intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, mlp_only_layers=[1])
    )
    with pytest.raises(ValueError, match="scan_layers"):
        nnx.eval_shape(lambda: Decoder(spec, rngs=nnx.Rngs(0), scan_layers=True))


def test_gradients_flow_through_every_parameter(checkpoints):
    _, path = checkpoints["qwen3_moe"]
    model = load_hf(path, scan_layers=True)
    tokens, positions, valid = left_padded_batch(96, seed=1)

    def loss(model):
        logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid))
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1))

    grads = nnx.jit(nnx.grad(loss))(model)
    norms = [float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms)) and min(norms) > 0
