"""Sampler tests: greedy parity with transformers' generate, batching/padding invariance, logprobs
against a full forward pass, stops and buckets (top-k/top-p against transformers: test_choice)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from spade_jax.models.registry import load_model
from spade_jax.models.tokenizer import byte_tokenizer
from spade_jax.sampling import Sampler, SamplingConfig, sequence_logprobs

PROMPTS = ["Hello there", "A", "The quick brown fox jumps over the lazy dog, twice.", "xyz 123"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama saved by transformers (weights scaled up so greedy choices are not ties)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.25,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    byte_tokenizer().hf.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return load_model(hf_dir)


@pytest.fixture(scope="module")
def sampler(loaded):
    return Sampler(loaded.model, loaded.tokenizer)


def _hf_greedy(hf_model, ids, n):
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, max_new_tokens=n, eos_token_id=2, pad_token_id=2,
        )
    return out[0, len(ids):].tolist()


def test_greedy_matches_transformers_generate_batched(hf_model, loaded, sampler):
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS]
    result = sampler.generate(prompts, SamplingConfig(max_new_tokens=20, temperature=0.0))
    for ids, tokens, reason in zip(prompts, result.tokens, result.finish_reasons):
        expected = _hf_greedy(hf_model, ids, 20)
        assert tokens == expected
        assert reason == ("eos" if expected[-1] == 2 else "length")


def test_batched_rows_equal_each_prompt_alone(loaded, sampler):
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS]
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    batched = sampler.generate(prompts, greedy)
    for row, ids in enumerate(prompts):
        alone = sampler.generate([ids], greedy)
        assert alone.tokens[0] == batched.tokens[row]
        np.testing.assert_allclose(alone.logprobs[0], batched.logprobs[row], atol=1e-5)
    config = SamplingConfig(max_new_tokens=12, temperature=0.8, top_k=50)
    together = sampler.generate(prompts, config, key=7)
    for row, ids in enumerate(prompts):
        alone = sampler.generate([ids], config, key=7)
        # A row's randomness depends on (key, row, step): move the prompt to the same row index.
        padded = [prompts[0]] * row + [ids]
        same_row = sampler.generate(padded, config, key=7)
        assert same_row.tokens[row] == together.tokens[row]
        np.testing.assert_allclose(same_row.logprobs[row], together.logprobs[row], atol=1e-5)
        if row == 0:
            assert alone.tokens[0] == together.tokens[0]


@pytest.mark.parametrize("kwargs", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9),
                                    dict(temperature=1.3, top_k=5), dict(temperature=0.0)])
def test_logprobs_equal_full_forward_log_softmax(loaded, sampler, kwargs):
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS[:3]]
    result = sampler.generate(prompts, SamplingConfig(max_new_tokens=16, **kwargs), key=3)
    for ids, tokens, logprobs in zip(prompts, result.tokens, result.logprobs):
        assert len(tokens) == len(logprobs) > 0
        np.testing.assert_allclose(logprobs, sequence_logprobs(loaded.model, ids, tokens), atol=2e-5)


def test_sampling_logprobs_are_temperature_scaled_distribution(loaded, sampler, hf_model):
    ids = loaded.tokenizer.encode(PROMPTS[0])
    temperature = 0.5
    result = sampler.generate([ids], SamplingConfig(max_new_tokens=6, temperature=temperature), key=1)
    seq = ids + result.tokens[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([seq])).logits[0].double().numpy()
    for t, tok in enumerate(result.tokens[0]):
        row = logits[len(ids) - 1 + t] / temperature
        expected = row[tok] - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert abs(result.sampling_logprobs[0][t] - expected) < 1e-4


def test_top_k_one_equals_greedy(loaded, sampler):
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS]
    greedy = sampler.generate(prompts, SamplingConfig(max_new_tokens=10, temperature=0.0))
    top1 = sampler.generate(prompts, SamplingConfig(max_new_tokens=10, temperature=1.0, top_k=1), key=5)
    assert greedy.tokens == top1.tokens


def test_stop_strings_cut_after_first_match(loaded, sampler):
    ids = loaded.tokenizer.encode(PROMPTS[2])
    free = sampler.generate([ids], SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    text = loaded.tokenizer.decode(free.tokens[0])
    stop = text[5:7]
    assert stop and text.find(stop) >= 0
    cut = sampler.generate([ids], SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True,
                                                 stop_strings=(stop, "\x00never")))
    assert cut.finish_reasons == ["stop"]
    assert cut.texts[0] == text[: text.find(stop) + len(stop)]
    assert cut.tokens[0] == free.tokens[0][: len(cut.tokens[0])]
    assert stop in loaded.tokenizer.decode(cut.tokens[0])
    assert stop not in loaded.tokenizer.decode(cut.tokens[0][:-1])
    assert len(cut.logprobs[0]) == len(cut.tokens[0])


def test_a_token_holding_a_stop_string_ends_its_row_on_device(loaded, sampler):
    # Every id whose own text holds the stop string (found here through the transformers tokenizer)
    # stops a row on device; the result is the host cut's, whatever the rows around it do.
    hf = loaded.tokenizer.hf
    holding = tuple(i for i in range(loaded.model.spec.vocab_size) if "}" in hf.decode([i]))
    assert holding and sampler._ids_holding(("}",)) == holding
    ids = [loaded.tokenizer.encode(p) for p in PROMPTS]
    free = sampler.generate(ids, SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    stop = loaded.tokenizer.decode(free.tokens[2])[4]
    cut = sampler.generate(ids, SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True,
                                               stop_strings=(stop,)))
    for row, tokens in enumerate(free.tokens):
        text = loaded.tokenizer.decode(tokens)
        end = next((n for n in range(1, len(tokens) + 1) if stop in loaded.tokenizer.decode(tokens[:n])), None)
        assert cut.tokens[row] == tokens[:end]
        assert cut.finish_reasons[row] == ("stop" if end else "length")
        assert cut.texts[row] == (text[: text.find(stop) + 1] if end else text)
        # the second call extends the kept cache, the first prefilled: float32 sums in another order
        # (1.5e-6 apart on an AMD EPYC), as the prefix tests' 1e-5
        np.testing.assert_allclose(cut.logprobs[row], free.logprobs[row][: len(cut.tokens[row])], atol=1e-5)


def test_eos_and_stop_token_ids_end_rows(loaded, sampler):
    ids = loaded.tokenizer.encode(PROMPTS[0])
    free = sampler.generate([ids], SamplingConfig(max_new_tokens=12, temperature=0.0, ignore_eos=True))
    target = free.tokens[0][3]
    first = free.tokens[0].index(target)
    stopped = sampler.generate([ids], SamplingConfig(max_new_tokens=12, temperature=0.0,
                                                     stop_token_ids=(target,)))
    assert stopped.tokens[0] == free.tokens[0][: first + 1]
    assert stopped.finish_reasons == ["stop"]
    as_eos = Sampler(loaded.model, loaded.tokenizer, eos_token_ids=(target,))
    ended = as_eos.generate([ids], SamplingConfig(max_new_tokens=12, temperature=0.0))
    assert ended.tokens[0] == free.tokens[0][: first + 1] and ended.finish_reasons == ["eos"]
    capped = sampler.generate([ids], SamplingConfig(max_new_tokens=3, temperature=0.0, ignore_eos=True))
    assert capped.tokens[0] == free.tokens[0][:3] and capped.finish_reasons == ["length"]


def test_buckets_bound_compiles(loaded):
    fresh = Sampler(loaded.model, loaded.tokenizer)
    config = SamplingConfig(max_new_tokens=8, temperature=0.0)
    # Warm-up: one program pair per (batch bucket, cache size, mode), and the packed prefill.
    fresh.generate([[5, 6, 7], [5]], config.replace(pack_prompts=False))
    fresh.generate([list(range(3, 3 + 15)), [5] * 11], config)
    fresh.generate([[5, 6]], config)
    fresh.generate([[5, 6]], config.replace(temperature=0.5, top_k=3))
    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for n in (9, 17, 25, 31):  # new prompt lengths, all inside the 32-token bucket
            fresh.generate([list(range(3, 3 + n)), [5] * (n // 2 + 1)], config.replace(pack_prompts=False))
        # Packed, a prefill compiles once per packed-length bucket: 26 and 31 tokens share the 32 one.
        fresh.generate([list(range(3, 3 + 20)), [5] * 11], config)
        # Budgets, temperatures, top-k values and stop ids are traced: still nothing to compile.
        fresh.generate([[5, 6]], config.replace(max_new_tokens=5))
        fresh.generate([[5, 6]], config.replace(temperature=0.9, top_k=7, stop_token_ids=(9,)))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiles == []


def test_packed_prefill_equals_padded(loaded, sampler):
    """Ragged prompts packed into one sequence (the default) give the padded prefill's results, greedy
    and sampled, with a batch-bucket padding row (3 prompts in a batch of 4)."""
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS[:2]] + [list(range(40, 90))]
    for kwargs in (dict(temperature=0.0, ignore_eos=True), dict(temperature=0.9, top_p=0.95)):
        config = SamplingConfig(max_new_tokens=10, reuse_prefix=False, **kwargs)
        packed = sampler.generate(prompts, config, key=5)
        fed_packed = sampler.last_fed_tokens
        padded = sampler.generate(prompts, config.replace(pack_prompts=False), key=5)
        assert fed_packed == 64 and sampler.last_fed_tokens == 4 * 64  # packed bucket; 4 rows x prompt bucket
        assert packed.tokens == padded.tokens
        for a, b in zip(packed.logprobs, padded.logprobs):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_generate_rejects_bad_input(sampler):
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([[]], SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="context"):
        sampler.generate([[5] * 500], SamplingConfig(max_new_tokens=100))
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)


def test_auto_cache_dtype_is_float32_on_cpu_and_the_compute_dtype_on_an_accelerator(monkeypatch):
    auto = SamplingConfig()
    assert auto.kv_cache_dtype(jnp.bfloat16) == "float32"  # this test runs on XLA:CPU
    assert SamplingConfig(cache_dtype="bfloat16").kv_cache_dtype(jnp.float32) == "bfloat16"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert auto.kv_cache_dtype(jnp.bfloat16) == "bfloat16"
    assert auto.kv_cache_dtype(jnp.float32) == "float32"
    assert SamplingConfig(cache_dtype="float32").kv_cache_dtype(jnp.bfloat16) == "float32"
    with pytest.raises(ValueError, match="cache_dtype must be auto"):
        SamplingConfig(cache_dtype="int8")


def test_sampler_under_8_device_mesh_matches_single_device(tmp_path):
    script = tmp_path / "mesh_check.py"
    script.write_text(
        "import json, sys\n"
        "from spade_jax.mesh import make_mesh, parse_mesh_arg\n"
        "from spade_jax.models.registry import load_model\n"
        "from spade_jax.sampling import Sampler, SamplingConfig\n"
        "mesh = make_mesh(parse_mesh_arg('data=2,fsdp=2,tensor=2'))\n"
        "cfg = SamplingConfig(max_new_tokens=10, temperature=0.9, top_k=40)\n"
        "prompts = [[1, 5, 9], [7] * 11, [3, 4], [8, 8, 8, 8, 9]]\n"
        "out = {}\n"
        "for name, m in (('plain', None), ('mesh', mesh)):\n"
        "  model, tok, _ = load_model('tiny', mesh=m)\n"
        "  r = Sampler(model, tok, mesh=m).generate(prompts, cfg, key=4)\n"
        "  out[name] = [r.tokens, r.logprobs]\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          cwd=os.getcwd(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plain"][0] == out["mesh"][0]
    np.testing.assert_allclose(
        np.concatenate([np.asarray(x) for x in out["plain"][1]]),
        np.concatenate([np.asarray(x) for x in out["mesh"][1]]), atol=1e-4,
    )


def test_counts_total_the_rows_the_model_computed(loaded):
    sampler = Sampler(loaded.model, loaded.tokenizer)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    config = SamplingConfig(max_new_tokens=8, ignore_eos=True, prompt_buckets=(16,), batch_buckets=(4,),
                            reuse_prefix=False, pack_prompts=False)
    sampler.generate(prompts, config, 0)
    sampler.generate(prompts[:1], config, 1)
    # two calls, each padded to 4 rows: 4 x 16 prompt slots prefilled and 4 rows x 8 steps decoded per call
    assert sampler.pop_counts() == {"calls": 2, "prompt_tokens": 12, "reused_tokens": 0, "prefill_rows": 128,
                                    "decode_rows": 64, "generated_tokens": 32}
    assert sampler.pop_counts()["calls"] == 0  # popping starts over
