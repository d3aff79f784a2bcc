"""Grounding corpus: loaders (JSONL, folder, parquet), truncation, the embedded stdlib corpus."""

import builtins
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from spade_jax.curriculum.corpus import (
    CorpusConfig,
    Document,
    GroundingCorpus,
    embedded_corpus,
    from_folder,
    from_jsonl,
    from_parquet,
    load_corpus,
    truncate_text,
)


def test_truncate_text_prefers_line_breaks():
    text = "a" * 90 + "\n" + "b" * 50
    assert truncate_text(text, 200) == text
    assert truncate_text(text, 100) == "a" * 90
    assert truncate_text("x" * 300, 100) == "x" * 100  # no break: hard cut


def test_jsonl_loader(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"title": "Tides", "text": "The moon pulls the sea." * 3}, {"body": "no title here"}, {"text": "short"}]
    path.write_text("\n".join(json.dumps(r) for r in rows[:1]) + "\n\n" + json.dumps({"text": "untitled text"}) + "\n")
    corpus = from_jsonl(path, max_chars=30)
    assert isinstance(corpus, GroundingCorpus) and len(corpus) == 2
    assert corpus[0] == Document("Tides", truncate_text("The moon pulls the sea." * 3, 30))
    assert corpus[1].title == "docs #3"
    assert len(from_jsonl(path, min_chars=20)) == 1
    path.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="text_key"):
        from_jsonl(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="docs.jsonl:1"):
        from_jsonl(path)
    with pytest.raises(ValueError, match="does not exist"):
        from_jsonl(tmp_path / "missing.jsonl")


def test_folder_loader(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bees make honey")
    (tmp_path / "sub" / "a.md").write_text("ants build hills")
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    corpus = from_folder(tmp_path)
    assert [d.title for d in corpus.documents] == ["b.txt", "sub/a.md"]
    assert corpus.sample(np.random.default_rng(0)).text in ("bees make honey", "ants build hills")
    with pytest.raises(ValueError, match="no documents"):
        from_folder(tmp_path, patterns=("*.rst",))


def test_parquet_without_pyarrow_says_how_to_fix(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        from_parquet(tmp_path / "x.parquet")


def test_parquet_loader(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"text": ["rivers flow", None, "stars shine"], "title": ["r", "n", None]})
    pq.write_table(table, tmp_path / "d.parquet")
    corpus = from_parquet(tmp_path / "d.parquet")
    assert [(d.title, d.text) for d in corpus.documents] == [("r", "rivers flow"), ("d #2", "stars shine")]


def test_load_corpus_kinds(tmp_path):
    assert load_corpus(CorpusConfig(kind="none")) is None
    (tmp_path / "a.txt").write_text("a document about clocks")
    assert len(load_corpus(CorpusConfig(kind="folder", path=str(tmp_path), min_chars=0))) == 1
    with pytest.raises(ValueError, match="corpus.path"):
        CorpusConfig(kind="jsonl")
    with pytest.raises(ValueError, match="unknown"):
        CorpusConfig(kind="web")


def test_embedded_corpus_size_length_and_diversity():
    corpus = load_corpus(CorpusConfig())
    assert len(corpus) >= 100
    lengths = np.array([len(d.text) for d in corpus.documents])
    assert lengths.min() >= 200 and np.median(lengths) >= 2000 and lengths.max() <= 24_000
    modules = {d.title.split(": ", 1)[1].split(" (part")[0] for d in corpus.documents}
    assert len(modules) >= 100
    assert {"math", "statistics", "calendar", "heapq", "graphlib", "datetime", "difflib"} <= modules
    math_doc = next(d for d in corpus.documents if d.title.endswith(": math"))
    assert "gcd" in math_doc.text and "factorial" in math_doc.text
    assert all(" at 0x" not in d.text for d in corpus.documents)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    assert [corpus.sample(rng_a).title for _ in range(5)] == [corpus.sample(rng_b).title for _ in range(5)]
    assert len({corpus.sample(rng_a).title for _ in range(50)}) > 20
    assert all(len(d.text) <= 1000 for d in embedded_corpus(max_chars=1000))


def test_embedded_corpus_is_identical_across_processes():
    def digest(documents):
        return hashlib.sha256("\0".join(d.title + "\0" + d.text for d in documents).encode()).hexdigest()

    code = (
        "import hashlib; from spade_jax.curriculum.corpus import embedded_corpus; "
        "print(hashlib.sha256('\\0'.join(d.title + '\\0' + d.text for d in embedded_corpus().documents)"
        ".encode()).hexdigest())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert other.stdout.strip() == digest(embedded_corpus().documents)
