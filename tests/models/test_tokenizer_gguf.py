"""GGUF tokenizers built from the file's metadata without torch (models/tokenizer.py) against
transformers' own GGUF tokenizer: the embedded SmolLM2 file token for token, small written files for
the other paths (SentencePiece, pre-tokenizer splits, respelled and mislabelled tokens), the on-disk
cache, and a load with torch made unimportable."""

import json
import os
import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest
from gguf import TokenType

from spade_jax.models import tokenizer as tokenizer_lib
from spade_jax.models.tokenizer import load_gguf_tokenizer

TEXTS = [
    "",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; isn't it? I'm sure THEY'RE fine.",
    "def add(a, b):\n    return a + b\n\n\nclass Foo:\n\tdef bar(self):\n"
    "\t\tif x  ==  1:\n\t\t\tpass  # tab\tand  spaces\n",
    "a  b   c    d\n\n\nnew paragraph\r\nwindows line\n \n  \t \n",
    "1234567890 3.14159 -42 1e10 2024-12-31 x  1  22   333\t4444\n55555",
    " leading space",
    "   three leading spaces",
    "\n\nleading newlines",
    "trailing spaces   ",
    "Café naïve résumé façade Ångström",
    "日本語のテキスト、中文字符和한국어",
    "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧 ✓",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>",
    "text<|endoftext|>more<|im_end|><|im_start|> spaced <|im_end|>  <|im_start",
    "<jupyter_code>print(1)<empty_output><repo_name>x",
    "The answer is \\boxed{\\frac{1}{2}} and $\\sqrt{x^2+y^2}$, so \\boxed{42}.",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime.\nJust one."},
    ],
    [
        {"role": "user", "content": "Play Wordle."},
        {"role": "assistant", "content": "My guess: \\boxed{CRANE}"},
        {"role": "user", "content": "  C(gray) R(yellow)\tA(gray)  ünïcode 日本"},
    ],
]


@pytest.fixture(scope="module")
def gguf_path():
    from spade_jax.models.registry import embedded_gguf_path

    try:
        return embedded_gguf_path()
    except (ImportError, FileNotFoundError) as err:
        pytest.skip(f"embedded model not installed: {err}")


@pytest.fixture(scope="module")
def ours(gguf_path):
    """Built from the file with no cache: the path SPADE_JAX_NO_CACHE=1 takes."""
    return load_gguf_tokenizer(gguf_path, cache=False)


@pytest.fixture(scope="module")
def reference(gguf_path):
    pytest.importorskip("torch")  # transformers' GGUF path imports it
    import transformers

    folder, name = os.path.split(gguf_path)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_backend_and_special_tokens_equal_transformers(ours, reference):
    assert json.loads(ours.hf.backend_tokenizer.to_str()) == json.loads(reference.backend_tokenizer.to_str())
    assert (ours.hf.bos_token_id, ours.hf.eos_token_id, ours.hf.pad_token_id) == (1, 2, 2)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids",
                 "add_bos_token", "add_eos_token", "clean_up_tokenization_spaces", "chat_template"):
        assert getattr(ours.hf, attr) == getattr(reference, attr), attr
    assert ours.vocab_size == len(reference) == 49152
    assert ours.hf.added_tokens_decoder == reference.added_tokens_decoder
    assert ours.eos_token_ids == (2,) and ours.pad_token_id == 2


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_equals_transformers(ours, reference, add_special_tokens):
    for text in TEXTS:
        expected = reference(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, repr(text)
    # ChatML markers stay whole tokens; nothing is prepended.
    assert ours.encode("<|im_start|>user", add_special_tokens=True)[0] == 1


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_equals_transformers(ours, reference, skip_special_tokens):
    sequences = [reference(text)["input_ids"] for text in TEXTS]
    rng = np.random.default_rng(0)
    sequences += [rng.integers(0, 49152, size=40).tolist() for _ in range(20)]  # includes broken UTF-8
    sequences += [[1, 2, 0, 5, 16, 2], [], list(range(0, 40))]
    for ids in sequences:
        expected = reference.decode(ids, skip_special_tokens=skip_special_tokens)
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == expected, ids
    for text in TEXTS:
        if "<" not in text:
            assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(ours, reference, add_generation_prompt):
    for messages in CONVERSATIONS:
        expected = reference.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        assert text == expected
        assert ours.encode_chat(messages, add_generation_prompt=add_generation_prompt) == (
            reference(expected, add_special_tokens=False)["input_ids"]
        )
    first = ours.apply_chat_template(CONVERSATIONS[0])
    assert first.startswith("<|im_start|>system\n") and first.endswith("<|im_start|>assistant\n")


def test_cache_gives_the_same_tokenizer(ours, gguf_path, tmp_path, monkeypatch):
    monkeypatch.delenv("SPADE_JAX_NO_CACHE", raising=False)
    monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path))
    built = load_gguf_tokenizer(gguf_path)  # empty cache: from the file, then saved
    saved = tokenizer_lib.cache_dir("gguf_tokenizer", gguf_path)
    assert sorted(os.listdir(saved)) == ["settings.json", "tokenizer.json"]
    reloaded = load_gguf_tokenizer(gguf_path)  # from the saved copy
    for tok in (built, reloaded):
        assert tok.hf.backend_tokenizer.to_str() == ours.hf.backend_tokenizer.to_str()
        assert tok.chat_template == ours.chat_template
        assert (tok.hf.bos_token_id, tok.hf.eos_token_id, tok.hf.pad_token_id) == (1, 2, 2)
        for text in TEXTS:
            assert tok.encode(text) == ours.encode(text)
    monkeypatch.setenv("SPADE_JAX_NO_CACHE", "1")
    assert tokenizer_lib.cache_dir("gguf_tokenizer", gguf_path) is None


_TORCHLESS = textwrap.dedent(
    """
    import json, os, sys
    sys.modules["torch"] = None  # `import torch` (and any torch.*) now raises ImportError
    from spade_jax.models.registry import embedded_gguf_path
    from spade_jax.models.tokenizer import load_gguf_tokenizer

    texts, messages = json.loads(sys.argv[1])
    out = []
    for _ in range(2):  # an empty cache (built from the file, then saved), then a cache hit
        tok = load_gguf_tokenizer(embedded_gguf_path())
        out.append({
            "entries": sorted(os.listdir(os.environ["SPADE_JAX_CACHE"])),
            "ids": [tok.encode(t) for t in texts],
            "decoded": [tok.decode(tok.encode(t), skip_special_tokens=False) for t in texts],
            "chat": tok.apply_chat_template(messages),
            "chat_ids": tok.encode_chat(messages),
            "eos": list(tok.eos_token_ids),
        })
    assert sys.modules["torch"] is None, "something replaced the torch blocker"
    assert not [m for m in sys.modules if m.startswith("torch.")], "a torch submodule was imported"
    print(json.dumps(out))
    """
)


def test_loads_with_torch_unimportable_and_an_empty_cache(ours, tmp_path):
    env = dict(os.environ, SPADE_JAX_CACHE=str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    env.pop("SPADE_JAX_NO_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", _TORCHLESS, json.dumps([TEXTS, CONVERSATIONS[1]])],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [run["entries"] for run in runs] == [["gguf_tokenizer"], ["gguf_tokenizer"]]
    for run in runs:
        assert run["ids"] == [ours.encode(t) for t in TEXTS]
        assert run["decoded"] == [ours.decode(ours.encode(t), skip_special_tokens=False) for t in TEXTS]
        assert run["chat"] == ours.apply_chat_template(CONVERSATIONS[1])
        assert run["chat_ids"] == ours.encode_chat(CONVERSATIONS[1])
        assert run["eos"] == [2]


# --- small written GGUF files, for the paths SmolLM2's file does not take ---------------------------

_CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
_SMALL_TEXTS = [
    "hello world, the  hello   world",
    " the theater is 1234 and 12 12 x  12",
    "I'm here; THEY'LL go. café 日本 ☃",
    "<|im_start|>user\n<think>ok</think><|im_end|> <|endoftext|>",
    "\n\n  \t tab\r\n",
    "",
]


def _writer(path: str) -> gguf.GGUFWriter:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    return writer


def _close(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_byte_level(path: str, pre: str) -> None:
    """A byte-level vocabulary: the 256 byte characters, a few merges, ChatML control tokens, a
    user-defined <think>, a plain-text token to respell, and a control token that is not a real one."""
    chars = tokenizer_lib._byte_chars()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "e l", "h el", "l o", "hel lo",
              "Ġ h", "Ġh el", "Ġhel lo", "Ġ Ġ", "ĠĠ Ġ", "1 2", "Ġ 1", "' m", "e r"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<｜fake▁control｜>"]
    types = [TokenType.CONTROL] * 3 + [TokenType.USER_DEFINED] * 2 + [TokenType.CONTROL]
    tokens += chars
    types += [TokenType.NORMAL] * len(chars)
    for merge in merges:
        tokens.append(merge.replace(" ", ""))
        types.append(TokenType.NORMAL)
    tokens.append("日")  # stored in plain text, not in the byte alphabet: respelled as its 3 bytes
    types.append(TokenType.NORMAL)
    writer = _writer(path)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(_CHATML)
    _close(writer)


def _write_sentencepiece(path: str, *, with_merges: bool, model: str = "llama", arch: str = "llama") -> None:
    """A SentencePiece vocabulary (<unk>, <s>, </s>, 256 byte tokens, scored pieces), merges either
    stored or left to be derived from the scores."""
    pieces = ["▁", "e", "h", "l", "o", "w", "r", "d", "t", "i", "n", "a", "s", "▁h", "ll", "▁w", "or",
              "▁t", "he", "▁the", "el", "hel", "▁hel", "lo", "▁hello", "▁wor", "ld", "▁world", "▁▁", "▁▁▁",
              "é", "日"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(n) for n in range(len(pieces))]
    for extra, kind in (("<|im_start|>", TokenType.CONTROL), ("<|im_end|>", TokenType.CONTROL),
                        ("<think>", TokenType.USER_DEFINED)):
        tokens.append(extra)
        types.append(kind)
        scores.append(0.0)
    writer = gguf.GGUFWriter(path, arch) if arch != "llama" else _writer(path)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if with_merges:
        writer.add_token_merges(["▁ h", "l l", "▁ w", "o r", "▁ t", "h e", "▁t he", "e l", "h el", "▁ hel",
                                 "l o", "▁hel lo", "▁w or", "l d", "▁wor ld", "▁ ▁", "▁▁ ▁"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(_CHATML)
    _close(writer)


def _assert_same_as_transformers(path: str) -> None:
    pytest.importorskip("torch")
    import transformers

    folder, name = os.path.split(path)
    reference = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ours = load_gguf_tokenizer(path, cache=False)
    assert json.loads(ours.hf.backend_tokenizer.to_str()) == json.loads(reference.backend_tokenizer.to_str())
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "add_bos_token"):
        assert getattr(ours.hf, attr) == getattr(reference, attr), attr
    for text in _SMALL_TEXTS:
        for add in (True, False):
            ids = reference(text, add_special_tokens=add)["input_ids"]
            assert ours.encode(text, add_special_tokens=add) == ids, (text, add)
            for skip in (True, False):
                expected = reference.decode(ids, skip_special_tokens=skip)
                assert ours.decode(ids, skip_special_tokens=skip) == expected
    messages = CONVERSATIONS[2]
    assert ours.apply_chat_template(messages) == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2", "gpt-4o", "tekken"])
def test_byte_level_files_equal_transformers(tmp_path, pre):
    path = str(tmp_path / "byte.gguf")
    _write_byte_level(path, pre)
    _assert_same_as_transformers(path)


def test_byte_level_respells_and_skips_mislabelled_control(tmp_path):
    path = str(tmp_path / "byte.gguf")
    _write_byte_level(path, "smollm")
    tok = load_gguf_tokenizer(path, cache=False)
    vocab = tok.hf.get_vocab()
    chars = tokenizer_lib._byte_chars()
    respelled = "".join(chars[b] for b in "日".encode("utf-8"))
    assert respelled in vocab and "日" not in vocab
    assert tok.decode([vocab[respelled]]) == "日"
    assert tok.encode("<think>", add_special_tokens=False) == [vocab["<think>"]]
    assert len(tok.encode("<｜fake▁control｜>", add_special_tokens=False)) > 1
    assert tok.decode(tok.encode("<|im_end|> <think>"), skip_special_tokens=True) == " <think>"
    assert tok.eos_token_ids == (2,) and tok.pad_token_id == 0


@pytest.mark.parametrize("with_merges", [True, False])
def test_sentencepiece_files_equal_transformers(tmp_path, with_merges):
    path = str(tmp_path / "spm.gguf")
    _write_sentencepiece(path, with_merges=with_merges)
    _assert_same_as_transformers(path)


def test_sentencepiece_adds_bos_and_leading_space(tmp_path):
    path = str(tmp_path / "spm.gguf")
    _write_sentencepiece(path, with_merges=False)
    tok = load_gguf_tokenizer(path, cache=False)
    ids = tok.encode("hello world")
    pieces = tok.hf.convert_ids_to_tokens(ids)
    assert pieces[0] == "<s>" and pieces[1].startswith("▁h") and pieces[-1] == "▁world"
    assert tok.decode(ids) == "hello world"
    assert tok.decode(ids, skip_special_tokens=False) == "<s> hello world"
    assert tok.encode("日\x07", add_special_tokens=False)[-1] == 3 + 0x07  # byte fallback


@pytest.mark.parametrize(("model", "arch"), [("t5", "llama"), ("llama", "gemma2"), ("bert", "llama")])
def test_unsupported_tokenizer_model_is_one_clear_error(tmp_path, model, arch):
    path = str(tmp_path / "other.gguf")
    _write_sentencepiece(path, with_merges=True, model=model, arch=arch)
    with pytest.raises(ValueError, match=f"unsupported GGUF tokenizer model '{model}'") as err:
        load_gguf_tokenizer(path, cache=False)
    assert "\n" not in str(err.value)


def test_damaged_or_stale_cache_is_rebuilt(tmp_path, monkeypatch):
    path = str(tmp_path / "spm.gguf")
    _write_sentencepiece(path, with_merges=True)
    monkeypatch.delenv("SPADE_JAX_NO_CACHE", raising=False)
    monkeypatch.setenv("SPADE_JAX_CACHE", str(tmp_path / "cache"))
    expected = load_gguf_tokenizer(path, cache=False).encode("hello world <think>")
    assert load_gguf_tokenizer(path).encode("hello world <think>") == expected
    saved = tokenizer_lib.cache_dir("gguf_tokenizer", path)
    with open(os.path.join(saved, "tokenizer.json"), "w") as f:
        f.write("{not json")
    assert load_gguf_tokenizer(path).encode("hello world <think>") == expected
    with open(os.path.join(saved, "settings.json")) as f:
        settings = json.load(f)
    with open(os.path.join(saved, "settings.json"), "w") as f:
        json.dump(dict(settings, format=-1), f)
    assert load_gguf_tokenizer(path).encode("hello world <think>") == expected
    with open(os.path.join(saved, "settings.json")) as f:
        assert json.load(f)["format"] == settings["format"]


def test_full_disk_while_caching_the_tokenizer_warns_once_and_keeps_no_partial_copy(tmp_path, capsys):
    class FullDisk:  # tokenizers reports ENOSPC as a bare Exception, after a partial write
        def save(self, file):
            with open(file, "w") as f:
                f.write("{")
            raise Exception("No space left on device (os error 28)")

    (tmp_path / "gguf_tokenizer").mkdir()
    saved = str(tmp_path / "gguf_tokenizer" / "key")
    tokenizer_lib._save_tokenizer(saved, FullDisk(), {"format": 1})
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: could not cache the tokenizer in {saved} ")
    assert "No space left on device" in err[0]
    assert os.listdir(tmp_path / "gguf_tokenizer") == []  # neither the copy nor its temp folder
