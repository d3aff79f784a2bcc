"""GGUF loading: our block decoders against the gguf package's, the llama.cpp Q/K un-permute against
transformers' GGUF loader, and a tiny Llama written to GGUF whose logits match transformers'."""

import os

import gguf
import numpy as np
import pytest
import torch
import transformers

from spade_jax.models import gguf as ours
from spade_jax.models.hf import state_dict_items_to_model
from spade_jax.models.presets import get_preset
from spade_jax.models.registry import embedded_gguf_path

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def _encode(values: np.ndarray, type_name: str) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values.astype(np.float32)
    if type_name == "F16":
        return values.astype(np.float16)
    return gguf.quants.quantize(values.astype(np.float32), qtype)


def _write(path, tensors: dict, arch="llama", metadata=None):
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (metadata or {}).items():
        getattr(writer, f"add_{key}")(value)
    for name, (values, type_name) in tensors.items():
        data = _encode(values, type_name)
        raw = None if type_name in ("F32", "F16") else gguf.GGMLQuantizationType[type_name]
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("type_name", QTYPES)
def test_dequantize_equals_gguf_package(tmp_path, type_name):
    rng = np.random.default_rng(QTYPES.index(type_name))
    values = (rng.normal(size=(6, 96)) * rng.uniform(0.01, 3.0, size=(6, 1))).astype(np.float32)
    values[0, :32] = 0.0  # an all-zero block (scale 0)
    values[1, 5] = 40.0  # an outlier block
    path = tmp_path / f"{type_name}.gguf"
    _write(path, {"w": (values, type_name)})
    tensor = ours.open_gguf(path).tensors["w"]
    assert tensor.tensor_type.name == type_name
    got = ours.dequantize_tensor(tensor)
    expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    assert got.dtype == np.float32 and got.shape == (6, 96)
    np.testing.assert_array_equal(got, np.asarray(expected, np.float32).reshape(6, 96))
    # And the codes mean what they say: the decoded values approximate the originals.
    tol = {"F32": 0, "F16": 2e-2, "BF16": 2e-1, "Q8_0": 0.3, "Q5_0": 2.0, "Q5_1": 2.0}.get(type_name, 4.0)
    assert np.abs(got - values).max() <= tol


def test_unknown_ggml_type_is_a_clear_error():
    with pytest.raises(ValueError, match="no built-in decoder"):
        ours.dequantize_blocks(np.zeros((1, 210), np.uint8), "Q6_K")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ours.open_gguf(tmp_path / "none.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        ours.open_gguf(bad)


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert-time reorder of Q/K rows (reference for writing a GGUF like llama.cpp)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# The tiny Llama's GGUF header (2 layers, width 64, 4 query and 2 KV heads, 96 tokens).
_TINY_LLAMA_METADATA = dict(block_count=2, context_length=256, embedding_length=64, feed_forward_length=96,
                            head_count=4, head_count_kv=2, rope_freq_base=10000.0, layer_norm_rms_eps=1e-5,
                            vocab_size=96, rope_dimension_count=16)


def test_tiny_llama_gguf_logits_match_transformers(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    tensors = {"token_embd.weight": (sd["model.embed_tokens.weight"], "Q8_0"),
               "output_norm.weight": (sd["model.norm.weight"], "F32"),
               "output.weight": (sd["lm_head.weight"], "Q4_1")}
    for i in range(2):
        for g, h in names.items():
            w = sd[f"model.layers.{i}.{h}.weight"]
            if g == "attn_q":
                w = _llama_cpp_permute(w, 4)
            if g == "attn_k":
                w = _llama_cpp_permute(w, 2)
            kind = "F32" if w.ndim == 1 else ("Q4_0" if g.startswith("ffn") else "Q8_0")
            tensors[f"blk.{i}.{g}.weight"] = (w, kind)
    path = tmp_path / "tiny.gguf"
    _write(path, tensors, metadata=_TINY_LLAMA_METADATA)

    # Reference: transformers' own GGUF loader (dequantize + reverse permute + Llama forward).
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    gf = ours.open_gguf(path)
    spec = ours.spec_from_gguf(gf)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (2, 4, 2, 16)
    assert not spec.tie_embeddings and spec.rms_eps == 1e-5
    items = dict(ours.gguf_hf_items(gf, spec))
    ref_sd = ref.state_dict()
    for name, value in items.items():
        np.testing.assert_array_equal(value, ref_sd[name].numpy(), err_msg=name)
    model = state_dict_items_to_model(items.items(), spec)
    ids = np.array([[3, 17, 42, 5, 88, 11, 60, 2]])
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got, _ = model(ids, np.arange(ids.shape[1])[None])
    np.testing.assert_allclose(np.asarray(got), expected, atol=2e-4)


def test_smollm2_metadata_gives_the_preset_spec_and_template():
    gf = ours.open_gguf(embedded_gguf_path())
    assert ours.spec_from_gguf(gf) == get_preset("smollm2-135m-instruct")
    assert ours.chat_template(gf).startswith("{% for message in messages %}")
    types = {t.tensor_type.name for t in gf.tensors.values()}
    assert types == {"Q4_1", "Q8_0", "F32"} and len(gf.tensors) == 272


def _tiny_f32_llama(path):
    """A 2-layer llama GGUF with random F32 weights (enough for the loader's cache path)."""
    rng = np.random.default_rng(0)
    shapes = {"attn_norm": (64,), "ffn_norm": (64,), "attn_q": (64, 64), "attn_k": (32, 64),
              "attn_v": (32, 64), "attn_output": (64, 64), "ffn_gate": (96, 64), "ffn_up": (96, 64),
              "ffn_down": (64, 96)}
    tensors = {"token_embd.weight": (96, 64), "output_norm.weight": (64,), "output.weight": (96, 64)}
    tensors |= {f"blk.{i}.{name}.weight": shape for i in range(2) for name, shape in shapes.items()}
    _write(path, {k: (rng.standard_normal(s).astype(np.float32), "F32") for k, s in tensors.items()},
           metadata=_TINY_LLAMA_METADATA)


def _assert_same_items(got, expected):
    got, expected = dict(got), dict(expected)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_full_disk_while_caching_decoded_weights_warns_once_and_leaves_no_partial_copy(
        tmp_path, monkeypatch, capsys):
    import safetensors.numpy
    from safetensors import SafetensorError

    from spade_jax.models import registry

    path = str(tmp_path / "tiny.gguf")
    _tiny_f32_llama(path)
    _, expected = registry._gguf_items(path, cache=False)
    expected = dict(expected)
    monkeypatch.delenv("SPADE_JAX_NO_CACHE", raising=False)
    monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))

    def disk_fills_up(arrays, filename, metadata=None):  # what safetensors raises on ENOSPC
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_fills_up)
    spec, items = registry._gguf_items(path, cache=True)
    _assert_same_items(items, expected)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: could not cache the decoded weights of tiny.gguf in ")
    assert "No space left on device" in err[0]
    saved = registry.cache_dir("gguf", path)
    assert os.listdir(saved) == []  # the half-written file is gone


def test_damaged_cached_weights_are_decoded_again(tmp_path, monkeypatch):
    from spade_jax.models import registry

    path = str(tmp_path / "tiny.gguf")
    _tiny_f32_llama(path)
    monkeypatch.delenv("SPADE_JAX_NO_CACHE", raising=False)
    monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
    spec, expected = registry._gguf_items(path, cache=True)  # decoded, then kept
    expected = dict(expected)
    saved = registry.cache_dir("gguf", path)
    assert sorted(os.listdir(saved)) == ["model.safetensors", "spec.json"]
    _assert_same_items(registry._gguf_items(path, cache=True)[1], expected)  # from the copy
    weights = os.path.join(saved, "model.safetensors")
    with open(weights, "r+b") as f:  # a crash or a full disk cut the copy short
        f.truncate(os.path.getsize(weights) // 2)
    again_spec, again = registry._gguf_items(path, cache=True)
    assert again_spec == spec
    _assert_same_items(again, expected)
    _assert_same_items(registry._gguf_items(path, cache=True)[1], expected)  # rewritten whole
    with open(os.path.join(saved, "spec.json"), "w") as f:
        f.write("{not json")
    _assert_same_items(registry._gguf_items(path, cache=True)[1], expected)
