"""Tokenizers and chat templates: a transformers fast tokenizer from an HF directory or from GGUF
metadata, wrapped so callers see plain token-id lists, the model's own chat template and its stop ids.

GGUF tokenizers are built here from the file's metadata with `gguf` and `tokenizers` only: transformers'
own GGUF path imports torch, which the runtime install does not have.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from spade_jax.cache import cache_root, warn_not_cached

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}


def _gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: printable bytes stand for themselves,
    the others for chr(256), chr(257), ... in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


# Byte-level BPE's (GPT-2's) stand-in character of each byte -> that byte; iterates in byte order.
BYTE_OF_CHAR: Mapping[str, int] = MappingProxyType(_gpt2_byte_of_char())


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
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=BYTE_OF_CHAR.__getitem__)
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


def file_key(path: str) -> str:
    """Content hash of a file, so cached artifacts follow the bytes and not the path."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir(kind: str, path: str) -> str | None:
    root = cache_root()
    return None if root is None else os.path.join(root, kind, file_key(path))


def load_hf_tokenizer(path: str, *, eos_token_ids: Sequence[int] = ()) -> Tokenizer:
    """The tokenizer saved in an HF model directory."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {path} does not exist")
    try:
        hf = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} has no loadable tokenizer ({str(err).splitlines()[0]})") from err
    return Tokenizer(hf, eos_token_ids=eos_token_ids)


def load_gguf_tokenizer(path: str, *, eos_token_ids: Sequence[int] = (), cache: bool = True) -> Tokenizer:
    """The fast tokenizer (vocab, merges, pre-tokenizer, special tokens, chat template) a GGUF file's
    metadata describes, built without torch; token for token what transformers' GGUF loader gives.

    With `cache`, the built tokenizer is kept under the cache root keyed by the file's hash (opening
    the GGUF costs seconds, the saved copy a fraction of one); a missing, stale or unreadable copy is
    rebuilt from the file, so the result is the same with or without it.
    """
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    saved = cache_dir(_GGUF_TOKENIZER_CACHE, path) if cache else None
    built = _read_saved_tokenizer(saved) if saved else None
    if built is None:
        built = _build_gguf_tokenizer(_read_gguf_tokenizer_metadata(path))
        if saved:
            _save_tokenizer(saved, *built)
    return Tokenizer(_wrap_gguf_tokenizer(*built), eos_token_ids=eos_token_ids)


# Bump when what _build_gguf_tokenizer makes changes, so older cached copies are not reused.
_GGUF_TOKENIZER_FORMAT = 1
_GGUF_TOKENIZER_CACHE = "gguf_tokenizer"

# llama.cpp's token types (tokenizer.ggml.token_type).
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4

# Pre-tokenizer splits by `tokenizer.ggml.pre`, the same table transformers' GGUF loader uses. A name
# not listed keeps ByteLevel's own GPT-2 regex. That includes "smollm": llama.cpp and SmolLM2's original
# tokenizer.json also cut every digit apart first, which (its vocabulary has no multi-digit token) only
# changes a run of 2+ whitespace characters right before a digit: "x  1" is x,Ġ,Ġ,1 here, x,ĠĠ,1 there.
# We follow transformers, the reference this project is tested against.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_TEKKEN_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano", "dbrx", "smaug-bpe"),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}

# Architectures whose SentencePiece vocabulary needs more than the plain Llama recipe.
_UNSUPPORTED_SENTENCEPIECE_ARCHS = ("gemma", "gemma2", "gemma3", "phi3")


def _read_gguf_tokenizer_metadata(path: str) -> dict[str, Any]:
    """The tokenizer keys of a GGUF file's metadata (llama.cpp's names), as plain Python values."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    meta = {}
    for key in ("general.architecture", "tokenizer.chat_template"):
        field = reader.get_field(key)
        if field is not None:
            meta[key] = field.contents()
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml."):
            meta[key] = field.contents()
    return meta


def _build_gguf_tokenizer(meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(a `tokenizers.Tokenizer` with the file's added tokens, the settings its wrapper needs)."""
    kind = meta.get("tokenizer.ggml.model")
    arch = meta.get("general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("the GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    if kind == "gpt2":
        raw, byte_alphabet = _byte_level_bpe(meta), frozenset(_byte_chars())
        add_bos_default = False
    elif kind == "llama" and arch not in _UNSUPPORTED_SENTENCEPIECE_ARCHS:
        raw, byte_alphabet = _sentencepiece_bpe(meta), None
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says not to
    else:
        raise ValueError(
            f"unsupported GGUF tokenizer model {kind!r} (architecture {arch!r}); "
            "supported: 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    _add_marked_tokens(raw, meta, byte_alphabet)

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    settings = {
        "format": _GGUF_TOKENIZER_FORMAT,
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return raw, settings


def _merges(meta: dict[str, Any], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The file's merges ("left right"), or, for a SentencePiece vocabulary stored without them, the
    merges its scores imply: every split of a token into two tokens, ranked by the whole token's score.
    """
    stored = meta.get("tokenizer.ggml.merges")
    if stored:
        return [tuple(merge.split(" ", 1)) for merge in stored]
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        return []
    ranked = []  # (score, len(left), len(right), -order, left, right): sorted highest first
    for token, score in dict(zip(meta["tokenizer.ggml.tokens"], scores)).items():
        pairs = [
            (token[:cut], token[cut:]) for cut in range(1, len(token))
            if token[:cut] in vocab and token[cut:] in vocab
        ]
        pairs.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        for left, right in pairs:
            ranked.append((float(score), len(left), len(right), -len(ranked), left, right))
    ranked.sort(reverse=True)
    return [(left, right) for *_, left, right in ranked]


def _byte_level_bpe(meta: dict[str, Any]):
    """GPT-2 style byte-level BPE: each byte is one printable character; no unknown token."""
    from tokenizers import Regex, Tokenizer as RawTokenizer, decoders, models, pre_tokenizers

    chars = _byte_chars()
    alphabet = frozenset(chars)
    vocab = {}
    for index, token in enumerate(meta["tokenizer.ggml.tokens"]):
        # A token written in plain text instead of the byte alphabet is respelled byte by byte.
        spelled = token if set(token) <= alphabet else "".join(chars[b] for b in token.encode("utf-8"))
        vocab[spelled] = index
    raw = RawTokenizer(models.BPE(
        vocab=vocab, merges=_merges(meta, vocab), dropout=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False,
    ))
    split = _PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raw.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raw.decoder = decoders.ByteLevel()
    return raw


def _sentencepiece_bpe(meta: dict[str, Any]):
    """Llama-style SentencePiece BPE: "▁" for spaces, a leading one added, unknown bytes as <0xNN>."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers

    vocab = {token: index for index, token in enumerate(meta["tokenizer.ggml.tokens"])}
    raw = RawTokenizer(models.BPE(
        vocab=vocab, merges=_merges(meta, vocab), fuse_unk=True, byte_fallback=True, dropout=None,
    ))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    raw.decoder = decoders.Sequence(steps)
    return raw


def _add_marked_tokens(raw, meta: dict[str, Any], byte_alphabet: frozenset[str] | None) -> None:
    """Control tokens (like <|im_end|>) become special added tokens, user-defined ones (like <think>)
    plain added tokens, so text containing them is matched whole instead of cut into pieces.

    In a byte-level vocabulary a control token spelled outside the byte alphabet is a converter's
    mislabel, not a real token: it is left out, as transformers does.
    """
    from tokenizers import AddedToken

    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or ()
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, types)
        if kind == _TOKEN_CONTROL and (byte_alphabet is None or set(token) <= byte_alphabet)
    ]
    if control:
        raw.add_special_tokens(control)
    vocab = raw.get_vocab(with_added_tokens=False)
    user = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, types)
        if kind == _TOKEN_USER_DEFINED and token in vocab
    ]
    if user:
        raw.add_tokens(user)


def _wrap_gguf_tokenizer(raw, settings: dict[str, Any]):
    """The transformers fast tokenizer around `raw` (it adds BOS/EOS per the settings)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=settings["bos_token"],
        eos_token=settings["eos_token"],
        unk_token=settings["unk_token"],
        pad_token=settings["pad_token"],
        add_bos_token=settings["add_bos_token"],
        add_eos_token=settings["add_eos_token"],
    )
    if settings["chat_template"]:
        hf.chat_template = settings["chat_template"]
    return hf


def _read_saved_tokenizer(saved: str):
    """(tokenizer, settings) from the cache, or None when absent, from another format or unreadable."""
    from tokenizers import Tokenizer as RawTokenizer

    try:
        with open(os.path.join(saved, "settings.json"), encoding="utf-8") as f:
            settings = json.load(f)
        if settings.get("format") != _GGUF_TOKENIZER_FORMAT:
            return None
        return RawTokenizer.from_file(os.path.join(saved, "tokenizer.json")), settings
    except Exception:  # a damaged cache entry is rebuilt from the GGUF file
        return None


def _save_tokenizer(saved: str, raw, settings: dict[str, Any]) -> None:
    tmp = f"{saved}.tmp{os.getpid()}"
    try:
        os.makedirs(tmp, exist_ok=True)
        raw.save(os.path.join(tmp, "tokenizer.json"))
        with open(os.path.join(tmp, "settings.json"), "w", encoding="utf-8") as f:
            json.dump(settings, f)
        if os.path.isdir(saved):
            shutil.rmtree(saved, ignore_errors=True)  # a stale format; replaced below
        os.replace(tmp, saved)
    except Exception as err:  # noqa: BLE001 (tokenizers reports a full disk as a bare Exception)
        warn_not_cached("the tokenizer", saved, err)  # a read-only or full cache only costs speed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _byte_chars() -> list[str]:
    """GPT-2's printable character for each byte value, indexed by the byte."""
    return list(BYTE_OF_CHAR)
