"""The embedded SmolLM2-135M-Instruct GGUF against transformers' GGUF-loaded PyTorch model: every
weight (Q/K un-permuted) and the greedy chat reply, token for token."""

import os

import numpy as np
import pytest
import torch
import transformers

from spade_jax.models import gguf as gguf_lib
from spade_jax.models.registry import EMBEDDED_GGUF, embedded_gguf_path, load_model
from spade_jax.sampling import Sampler, SamplingConfig

pytestmark = pytest.mark.slow

QUESTION = "Write a Python function that adds two numbers."


@pytest.fixture(scope="module")
def reference():
    folder = os.path.dirname(embedded_gguf_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=EMBEDDED_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=EMBEDDED_GGUF, dtype=torch.float32
    ).eval()
    return model, tokenizer


def test_weights_equal_transformers_gguf_loader(reference):
    ref_sd = {k: v.numpy() for k, v in reference[0].state_dict().items()}
    gf = gguf_lib.open_gguf(embedded_gguf_path())
    names = set()
    for name, value in gguf_lib.gguf_hf_items(gf):
        np.testing.assert_array_equal(value, ref_sd[name], err_msg=name)
        names.add(name)
    assert len(names) == 272
    # transformers ties lm_head to the embedding; everything else it holds came from the file.
    assert set(ref_sd) - names <= {"lm_head.weight"}


def test_greedy_chat_reply_equals_transformers(reference):
    ref_model, ref_tok = reference
    messages = [{"role": "user", "content": QUESTION}]
    expected_prompt = ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    model, tokenizer, _ = load_model("smollm2-135m-instruct")
    assert tokenizer.apply_chat_template(messages) == expected_prompt
    prompt = tokenizer.encode_chat(messages)
    assert prompt == ref_tok(expected_prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = ref_model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False, max_new_tokens=24, pad_token_id=ref_tok.pad_token_id,
        )
    expected = out[0, len(prompt):].tolist()
    result = Sampler(model, tokenizer).generate([prompt], SamplingConfig(max_new_tokens=24, temperature=0))
    assert result.tokens[0] == expected
    assert result.texts[0] == ref_tok.decode(expected, skip_special_tokens=True)
    assert result.texts[0].startswith("```python")
