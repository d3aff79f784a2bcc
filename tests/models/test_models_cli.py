"""`python -m spade_jax.models`: generate prints only the completion; user mistakes exit 2 with one
line; export writes a directory transformers loads with the same logits."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

from spade_jax.models.__main__ import main
from spade_jax.models.registry import load_model
from spade_jax.sampling import Sampler, SamplingConfig


def test_generate_prints_only_the_completion():
    model, tokenizer, _ = load_model("tiny")
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Say hi"}])
    expected = Sampler(model, tokenizer).generate([prompt], SamplingConfig(max_new_tokens=12, temperature=0))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-m", "spade_jax.models", "generate", "--model", "tiny", "--prompt", "Say hi",
         "--chat", "--max-new-tokens", "12", "--temperature", "0"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == expected.texts[0] + "\n"


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "no-such-model", "--prompt", "x"], "unknown model"),
    (["generate", "--model", "/nonexistent/m.gguf", "--prompt", "x"], "does not exist"),
    (["generate", "--model", "/nonexistent/dir/", "--prompt", "x"], "does not exist"),
    (["generate", "--model", "tiny", "--prompt", "x", "--mesh", "data=3,tensor=5"], "devices"),
    (["generate", "--model", "tiny", "--prompt", "x", "--top-p", "0"], "top_p"),
    (["export", "--model", "no-such-model", "--out", "/tmp/never"], "unknown model"),
])
def test_user_mistakes_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: ")


def test_export_writes_an_hf_directory_transformers_loads(tmp_path, capsys):
    out = tmp_path / "tiny_hf"
    assert main(["export", "--model", "tiny", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name
    ours, tokenizer, _ = load_model("tiny")
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.array([tokenizer.encode("export me")])
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    got, _ = ours(ids, np.arange(ids.shape[1])[None])
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4)
    assert load_model(str(out)).tokenizer.encode("export me") == ids[0].tolist()
