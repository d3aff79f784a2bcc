"""Grounding corpus: the documents that seed the designer's prompts so its environments stay diverse.
Loaders for JSONL, folders of text files and parquet, plus an offline default built from stdlib docs."""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import subprocess
import sys
from typing import Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from spade_jax.curriculum import stdlib_docs

# About 6k tokens of English prose (SPADE truncates grounding documents to ~6k tokens).
DEFAULT_MAX_CHARS = 24_000


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    kind: str = "embedded"  # embedded | jsonl | folder | parquet | none (SPADE's no-corpus ablation)
    path: str = ""  # file (jsonl, parquet) or directory (folder); unused for embedded and none
    text_key: str = "text"  # JSONL/parquet field that holds the document text
    title_key: str = "title"  # JSONL/parquet field for the title (optional in the data)
    max_chars: int = DEFAULT_MAX_CHARS  # documents are cut to this many characters (~6k tokens)
    min_chars: int = 200  # shorter documents are dropped as too thin to ground an environment

    def __post_init__(self):
        if self.kind not in ("embedded", "jsonl", "folder", "parquet", "none"):
            raise ValueError(f"corpus.kind={self.kind!r} is unknown; choose embedded, jsonl, folder, parquet or none")
        if self.kind in ("jsonl", "folder", "parquet") and not self.path:
            raise ValueError(f"corpus.kind={self.kind} needs corpus.path=<file or directory>")
        if self.max_chars < 1 or self.min_chars < 0:
            raise ValueError("corpus.max_chars must be >= 1 and corpus.min_chars >= 0")


@dataclasses.dataclass(frozen=True)
class Document:
    title: str
    text: str

    def truncated(self, max_chars: int) -> "Document":
        return Document(self.title, truncate_text(self.text, max_chars))


def truncate_text(text: str, max_chars: int) -> str:
    """Cut to at most max_chars, at the last paragraph or line break when one is in the final fifth."""
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    for sep in ("\n\n", "\n", " "):
        at = cut.rfind(sep)
        if at >= int(max_chars * 0.8):
            return cut[:at].rstrip()
    return cut


@runtime_checkable
class GroundingCorpus(Protocol):
    def __len__(self) -> int: ...

    def sample(self, rng: np.random.Generator) -> Document: ...


class ListCorpus:
    """A corpus held in memory; `sample` draws uniformly and truncates to max_chars."""

    def __init__(self, documents: Sequence[Document], max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = 0,
                 source: str = "memory"):
        self.documents = [d for d in documents if len(d.text.strip()) >= max(min_chars, 1)]
        self.max_chars = max_chars
        self.source = source
        if not self.documents:
            raise ValueError(f"grounding corpus {source} has no documents with at least {max(min_chars, 1)} characters")

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, index: int) -> Document:
        return self.documents[index].truncated(self.max_chars)

    def sample(self, rng: np.random.Generator) -> Document:
        return self[int(rng.integers(len(self.documents)))]

    def __repr__(self) -> str:
        return f"ListCorpus({len(self)} documents from {self.source}, max_chars={self.max_chars})"


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------


def _doc_from_row(row: dict, text_key: str, title_key: str, fallback_title: str, where: str) -> Document:
    if text_key not in row:
        raise ValueError(f"{where} has no {text_key!r} field (set corpus.text_key to the field holding the text)")
    title = row.get(title_key)
    return Document(str(title) if title is not None else fallback_title, str(row[text_key]))


def from_jsonl(path: str | pathlib.Path, text_key: str = "text", title_key: str = "title",
               max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = 0) -> ListCorpus:
    """One JSON object per line, with the text under `text_key` (and optionally a title)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"corpus file {path} does not exist (set corpus.path to a .jsonl file)")
    documents = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{number} is not valid JSON ({e.msg}); the corpus needs one object per line"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number} is not a JSON object; the corpus needs one object per line")
            documents.append(_doc_from_row(row, text_key, title_key, f"{path.stem} #{number}", f"{path}:{number}"))
    return ListCorpus(documents, max_chars, min_chars, source=str(path))


def from_folder(directory: str | pathlib.Path, patterns: Iterable[str] = ("*.txt", "*.md", "*.rst"),
                max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = 0) -> ListCorpus:
    """Every matching text file under `directory` (recursively, sorted) is one document titled by its path."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise ValueError(f"corpus folder {directory} does not exist (set corpus.path to a directory of text files)")
    files = sorted({p for pattern in patterns for p in directory.rglob(pattern) if p.is_file()})
    documents = [
        Document(str(p.relative_to(directory)), p.read_text(encoding="utf-8", errors="replace")) for p in files
    ]
    return ListCorpus(documents, max_chars, min_chars, source=str(directory))


def from_parquet(path: str | pathlib.Path, text_key: str = "text", title_key: str = "title",
                 max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = 0) -> ListCorpus:
    """A parquet file with a text column (and optionally a title column); needs pyarrow."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading a parquet corpus needs pyarrow: pip install pyarrow") from None
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"corpus file {path} does not exist (set corpus.path to a .parquet file)")
    schema_names = pq.read_schema(path).names
    if text_key not in schema_names:
        raise ValueError(f"{path} has no {text_key!r} column (columns: {schema_names}); set corpus.text_key")
    columns = [text_key] + ([title_key] if title_key in schema_names else [])
    table = pq.read_table(path, columns=columns).to_pydict()
    titles = table.get(title_key) or [None] * len(table[text_key])
    documents = [
        Document(str(t) if t is not None else f"{path.stem} #{i}", str(x))
        for i, (t, x) in enumerate(zip(titles, table[text_key]))
        if x is not None
    ]
    return ListCorpus(documents, max_chars, min_chars, source=str(path))


def load_corpus(cfg: CorpusConfig) -> ListCorpus | None:
    """The corpus the config names; None for kind="none" (designer prompts then carry no document)."""
    if cfg.kind == "none":
        return None
    if cfg.kind == "embedded":
        return embedded_corpus(cfg.max_chars, cfg.min_chars)
    if cfg.kind == "jsonl":
        return from_jsonl(cfg.path, cfg.text_key, cfg.title_key, cfg.max_chars, cfg.min_chars)
    if cfg.kind == "folder":
        return from_folder(cfg.path, max_chars=cfg.max_chars, min_chars=cfg.min_chars)
    return from_parquet(cfg.path, cfg.text_key, cfg.title_key, cfg.max_chars, cfg.min_chars)


# ---------------------------------------------------------------------------------------------
# Embedded default: the Python standard library's own documentation
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _embedded_documents(part_chars: int) -> tuple[Document, ...]:
    # Built in a pristine child interpreter (-I -S: no site-packages, no environment) because the
    # training process patches stdlib modules (logging handlers, threading.excepthook, ...) and the
    # corpus must not depend on what happens to be imported or patched here.
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", stdlib_docs.__file__, str(part_chars)],
            capture_output=True, text=True, timeout=60, check=True,
        )
        pairs = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        pairs = stdlib_docs.build(part_chars)  # no usable child interpreter: build here
    return tuple(Document(title, text) for title, text in pairs)


def embedded_corpus(max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = 200, part_chars: int = 12_000) -> ListCorpus:
    """Offline default corpus: documentation of ~140 standard-library modules, built in memory.

    Large modules are split into parts of about `part_chars` characters so one document does not
    drown in a single topic. Deterministic for a given Python build; nothing is written to disk.
    """
    return ListCorpus(_embedded_documents(part_chars), max_chars, min_chars, source="python-stdlib-docs")
