"""A Qwen3-style tokenizer built offline: a small byte-level BPE (Qwen's pre-tokenizer and added tokens) with
the published Qwen3 chat template (tests/fixtures/qwen3_tokenizer, see SOURCE.md), saved as an HF directory."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tokenizer"
# Qwen2/Qwen3's pre-tokenizer split (tokenizer.json), so words and digits split as Qwen splits them.
_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
_CORPUS = [
    "You may call one or more functions to assist with the user query.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    '{"type": "function", "function": {"name": "ls", "description": "List files", "parameters": {}}}',
    "The weather in Paris is sunny. List the files in the current directory, then move report.pdf.",
    "system user assistant tool response tools function arguments name description parameters",
]


def build_qwen3_tokenizer_dir(path: Path) -> Path:
    """Writes tokenizer.json and tokenizer_config.json (Qwen3's chat template) under `path`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(_CORPUS * 4, trainer)
    raw.add_tokens(list(ADDED))
    path.mkdir(parents=True, exist_ok=True)
    raw.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": (FIXTURE / "chat_template.jinja").read_text(),
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 32768,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path
