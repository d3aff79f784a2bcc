"""spade_jax.models.hf: config.json -> ModelSpec, streaming safetensors load, export that transformers reloads."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import hf_logits, hf_model, left_padded_batch, save_hf  # noqa: E402 (after the torch importorskip)

from spade_jax.models.hf import (  # noqa: E402 (after the torch importorskip)
    export_hf,
    iter_safetensors,
    load_hf,
    spec_from_hf_config,
    state_dict_items_to_model,
)
from spade_jax.models.presets import PRESETS, get_preset  # noqa: E402 (after the torch importorskip)


@nnx.jit
def _forward(model, tokens, positions, valid):
    return model(tokens, positions, valid)[0]


def _ours(model, tokens, positions, valid):
    return np.asarray(_forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(valid)))


def _reload(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


# Released config.json files (old-style keys: rope_theta, rope_scaling, num_experts).
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}


@pytest.mark.parametrize("name,config", [("qwen3-0.6b", QWEN3_06B), ("qwen3-30b-a3b", QWEN3_30B_A3B)])
def test_released_configs_give_the_presets(name, config):
    spec = spec_from_hf_config(config)
    # generation_config.json adds <|endoftext|> to the eos ids; config.json alone names <|im_end|>.
    assert spec.replace(eos_token_ids=get_preset(name).eos_token_ids) == get_preset(name)


def test_yarn_long_context_config():
    spec = spec_from_hf_config(
        {**QWEN3_06B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 32768}}
    )
    assert spec.rope_scaling_dict["rope_type"] == "yarn" and spec.rope_scaling_dict["factor"] == 4.0


@pytest.mark.parametrize(
    "config,message",
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({**QWEN3_06B, "hidden_act": "gelu"}, "hidden_act"),
        ({**QWEN3_06B, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type"),
    ],
)
def test_unsupported_configs_raise_clear_errors(config, message):
    with pytest.raises(ValueError, match=message):
        spec_from_hf_config(config)


def test_presets_are_consistent():
    assert get_preset("SmolLM2-135M-Instruct").num_layers == 30
    with pytest.raises(ValueError, match="tiny"):
        get_preset("no-such-model")
    for spec in PRESETS.values():
        assert spec.num_heads % spec.num_kv_heads == 0


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    model = hf_model("qwen3_moe", seed=11)
    return model, save_hf(model, tmp_path_factory.mktemp("moe"))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_export_reloads_in_transformers_with_the_same_logits(tmp_path, moe_checkpoint, scan_layers):
    hf, path = moe_checkpoint
    ours = load_hf(path, scan_layers=scan_layers)
    out = export_hf(ours, tmp_path / "export", tokenizer=None)
    names = set(json.loads((out / "config.json").read_text()).keys())
    assert {"model_type", "num_experts", "architectures"} <= names
    stored = dict(iter_safetensors(out / "model.safetensors"))
    assert "model.layers.1.mlp.experts.5.down_proj.weight" in stored  # per-expert keys, like HF saves
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size, seed=8)
    reloaded = _reload(out)
    want = hf_logits(hf, tokens, valid)
    np.testing.assert_array_equal(hf_logits(reloaded, tokens, valid), want)
    assert np.abs(_ours(load_hf(out), tokens, positions, valid) - want)[valid].max() <= 1e-4


def test_export_splits_large_checkpoints_and_copies_tokenizer_files(tmp_path):
    hf = hf_model("qwen2", seed=12, tie_word_embeddings=True)
    ours = load_hf(save_hf(hf, tmp_path / "src"))
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer_config.json").write_text("{}")
    out = export_hf(ours, tmp_path / "out", tokenizer=tok_dir, shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]  # tied
    assert (out / "tokenizer_config.json").is_file()
    tokens, positions, valid = left_padded_batch(ours.spec.vocab_size, seed=9)
    np.testing.assert_array_equal(hf_logits(_reload(out), tokens, valid), hf_logits(hf, tokens, valid))
    assert np.abs(_ours(load_hf(out), tokens, positions, valid) - hf_logits(hf, tokens, valid))[valid].max() <= 1e-4


def test_bf16_checkpoints_load_exactly_and_export_as_bf16(tmp_path):
    hf = hf_model("llama", seed=13).to(torch.bfloat16)
    path = save_hf(hf, tmp_path / "bf16")
    ours = load_hf(path)  # float32 params from bfloat16 tensors
    want = hf.model.layers[1].self_attn.k_proj.weight.detach().float().numpy()
    got = np.asarray(ours.layers[1].attn.k[...]).transpose(1, 2, 0).reshape(want.shape)
    np.testing.assert_array_equal(got, want)
    out = export_hf(ours, tmp_path / "out", dtype=jnp.bfloat16)
    reloaded = _reload(out)
    assert reloaded.dtype == torch.bfloat16
    assert torch.equal(reloaded.model.layers[1].self_attn.k_proj.weight, hf.model.layers[1].self_attn.k_proj.weight)


def test_fused_expert_tensors_load_too(tmp_path, moe_checkpoint):
    from safetensors.torch import save_file

    hf, path = moe_checkpoint
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state  # transformers 5's in-memory layout
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file(state, fused / "model.safetensors")
    (fused / "config.json").write_text((path / "config.json").read_text())
    tokens, positions, valid = left_padded_batch(96, seed=10)
    got = _ours(load_hf(fused), tokens, positions, valid)
    assert np.abs(got - hf_logits(hf, tokens, valid))[valid].max() <= 1e-4


def test_items_mapping_streams_and_reports_mismatches(moe_checkpoint):
    _, path = moe_checkpoint
    spec = load_hf(path).spec
    items = list(iter_safetensors(path / "model.safetensors"))
    arrived = []

    def stream():
        for name, array in items:
            arrived.append(name)
            yield name, np.array(array)

    model = state_dict_items_to_model(stream(), spec)
    assert len(arrived) == len(items)
    np.testing.assert_array_equal(
        np.asarray(model.final_norm.weight[...]), dict(items)["model.norm.weight"]
    )
    with pytest.raises(ValueError, match="lacks"):
        state_dict_items_to_model([(n, a) for n, a in items if "layers.1.mlp.experts.3." not in n], spec)
    with pytest.raises(ValueError, match="no place"):
        state_dict_items_to_model(items + [("model.layers.0.mlp.shared_expert.weight", items[0][1])], spec)
    with pytest.raises(ValueError, match="shape"):
        state_dict_items_to_model(items, spec.replace(moe_intermediate_size=spec.moe_intermediate_size + 1))


def test_missing_directory_pieces_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    with pytest.raises(ValueError, match="safetensors"):
        load_hf(tmp_path)
