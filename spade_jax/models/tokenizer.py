"""Tokenizers and chat templates: a transformers fast tokenizer from an HF directory or from GGUF
metadata, wrapped so callers see plain token-id lists, the model's own chat template and its stop ids.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}


class Tokenizer:
    """Text <-> token ids for one model, with the chat template the model was trained with."""

    def __init__(self, hf_tokenizer, *, eos_token_ids: Sequence[int] = ()):
        self.hf = hf_tokenizer
        ids = [int(i) for i in eos_token_ids]
        if hf_tokenizer.eos_token_id is not None and hf_tokenizer.eos_token_id not in ids:
            ids.append(int(hf_tokenizer.eos_token_id))
        if not ids:
            raise ValueError("tokenizer has no end-of-sequence token; pass eos_token_ids")
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        pad = hf_tokenizer.pad_token_id
        self.pad_token_id: int = int(self.eos_token_ids[0] if pad is None else pad)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def chat_template(self) -> str | None:
        return self.hf.chat_template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, adding BOS etc. exactly as the transformers tokenizer does by default."""
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """The prompt text the model's own template renders (transformers' Jinja environment)."""
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template; drop --chat or use an instruct model")
        return self.hf.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )

    def encode_chat(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> list[int]:
        """Token ids of the rendered chat; the template already holds the special tokens it wants."""
        text = self.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        return self.encode(text, add_special_tokens=False)


# ChatML, the format SmolLM2 and Qwen use; the byte tokenizer's specials spell it.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1 (bos), 2 (eos)


def byte_tokenizer(*, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
    """A 259-token byte-level tokenizer (3 ChatML specials, then the 256 bytes) for randomly
    initialised presets: any text round-trips, and every id fits a vocabulary of 259 or more.
    """
    from tokenizers import Tokenizer as RawTokenizer  # noqa: PLC0415
    from tokenizers import decoders, models, pre_tokenizers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of_char(c))
    vocab = {tok: i for i, tok in enumerate(BYTE_SPECIALS)}
    vocab.update({c: len(BYTE_SPECIALS) + i for i, c in enumerate(byte_chars)})
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(list(BYTE_SPECIALS))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BYTE_SPECIALS[1],
        eos_token=BYTE_SPECIALS[2],
        pad_token=BYTE_SPECIALS[2],
        unk_token=None,
    )
    hf.chat_template = CHATML_TEMPLATE
    return Tokenizer(hf, eos_token_ids=eos_token_ids)


def _byte_of_char(c: str) -> int:
    """GPT-2's byte -> printable character table, inverted (printable bytes map to themselves)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    code = ord(c)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def _cache_root() -> str | None:
    """Where derived artifacts go (`SPADE_JAX_CACHE`, default ~/.cache/spade_jax); None if disabled."""
    if os.environ.get("SPADE_JAX_NO_CACHE"):
        return None
    return os.environ.get("SPADE_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "spade_jax"))


def file_key(path: str) -> str:
    """Content hash of a file, so cached artifacts follow the bytes and not the path."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir(kind: str, path: str) -> str | None:
    root = _cache_root()
    return None if root is None else os.path.join(root, kind, file_key(path))


def load_hf_tokenizer(path: str, *, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
    """The tokenizer saved in an HF model directory."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {path} does not exist")
    try:
        hf = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} has no loadable tokenizer ({str(err).splitlines()[0]})") from err
    return Tokenizer(hf, eos_token_ids=eos_token_ids)


def load_gguf_tokenizer(path: str, *, eos_token_ids: Sequence[int] = (), cache: bool = True) -> Tokenizer:
    """Build the fast tokenizer (vocab, merges, pre-tokenizer, special tokens, chat template) from GGUF
    metadata with transformers' GGUF converter; optionally keep a saved copy keyed by the file's hash.
    """
    from transformers import AutoTokenizer  # noqa: PLC0415

    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    saved = cache_dir("tokenizers", path) if cache else None
    if saved and os.path.isfile(os.path.join(saved, "tokenizer.json")):
        return Tokenizer(AutoTokenizer.from_pretrained(saved), eos_token_ids=eos_token_ids)
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    if saved:
        try:
            tmp = f"{saved}.tmp{os.getpid()}"
            hf.save_pretrained(tmp)
            os.makedirs(os.path.dirname(saved), exist_ok=True)
            os.replace(tmp, saved)
        except OSError:
            pass  # a read-only home only costs speed
    return Tokenizer(hf, eos_token_ids=eos_token_ids)
