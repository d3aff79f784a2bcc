"""Builds the embedded grounding corpus from the Python standard library's own docstrings.
Standard library only, so it can run in a pristine `python -I -S` child whose modules nobody patched."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import warnings

# Chosen for topic spread (numbers, time, text, data structures, networks, files, formats, systems),
# not for programming value: each becomes the seed of a puzzle. Modules missing here are skipped.
EMBEDDED_MODULES: tuple[str, ...] = tuple("""
abc argparse array ast asyncio base64 bdb binascii bisect bz2 calendar cmath cmd codecs collections colorsys
compileall concurrent.futures configparser contextlib copy csv dataclasses datetime decimal difflib dis doctest
email.message email.utils enum filecmp fileinput fnmatch fractions ftplib functools gettext glob graphlib gzip
hashlib heapq hmac html html.parser http http.client http.cookies imaplib inspect io ipaddress itertools json
keyword linecache locale logging lzma mailbox math mimetypes numbers operator optparse pathlib pickle pickletools
pkgutil platform plistlib poplib pprint profile pstats queue quopri random re reprlib sched secrets selectors
shelve shlex shutil smtplib socketserver sqlite3 stat statistics string struct subprocess tabnanny tarfile
tempfile textwrap threading timeit tokenize trace traceback tracemalloc types typing unicodedata unittest
urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom xml.etree.ElementTree zipfile zlib zoneinfo
""".split())

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Elided:
    def __repr__(self) -> str:
        return "..."


def _clean(text: str) -> str:
    # Object reprs carry memory addresses, which would make the corpus differ per run.
    return _ADDRESS.sub("", text).strip()


def _signature(obj) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    # Defaults that are live objects (handler lists, sentinels) show run-time state, not documentation.
    parameters = [
        p.replace(default=_Elided())
        if p.default is not inspect.Parameter.empty and (repr(p.default).startswith("<") or len(repr(p.default)) > 60)
        else p
        for p in signature.parameters.values()
    ]
    return _clean(str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)))


def _own_doc(obj) -> str:
    """The object's own docstring (not one inherited from int, str, object, ...)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def _belongs(obj, module) -> bool:
    # C accelerators report their private twin (`_heapq` for heapq); re-exports belong elsewhere.
    owner = str(getattr(obj, "__module__", None) or module.__name__)
    return owner == module.__name__ or module.__name__.startswith(owner.lstrip("_"))


def _entries(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if not isinstance(names, (list, tuple)):
        names = [n for n in dir(module) if not n.startswith("_")]
    entries = []
    for name in sorted(set(names)):
        obj = getattr(module, name, None)
        if obj is None or inspect.ismodule(obj) or not _belongs(obj, module):
            continue
        if inspect.isclass(obj):
            doc = _own_doc(obj)
            lines = [f"class {name}{_signature(obj)}" + (f"\n{doc}" if doc else "")]
            for method_name, method in sorted(vars(obj).items()):
                if method_name.startswith("_") or not callable(method):
                    continue
                method_doc = _own_doc(method)
                if method_doc:
                    lines.append(
                        f"  {name}.{method_name}{_signature(method)}\n    " + method_doc.replace("\n", "\n    ")
                    )
            if doc or len(lines) > 1:
                entries.append("\n".join(lines))
        elif callable(obj):
            doc = _own_doc(obj)
            if doc:
                entries.append(f"{name}{_signature(obj)}\n{doc}")
    return [_clean(e) for e in entries]


def module_documents(module, part_chars: int) -> list[tuple[str, str]]:
    """(title, text) documents for one module; large modules are split into parts of ~part_chars."""
    intro = _clean(_own_doc(module))
    parts: list[list[str]] = [[intro] if intro else []]
    size = len(intro)
    for entry in _entries(module):
        if parts[-1] and size + len(entry) > part_chars:
            parts.append([])
            size = 0
        parts[-1].append(entry)
        size += len(entry) + 2
    if len(parts) > 1 and size < part_chars // 4:  # fold a short tail into the part before it
        parts[-2].extend(parts.pop())
    title = f"Python standard library: {module.__name__}"
    return [
        (title if len(parts) == 1 else f"{title} (part {i + 1} of {len(parts)})", "\n\n".join(p))
        for i, p in enumerate(parts)
        if p
    ]


def build(part_chars: int = 12_000, modules: tuple[str, ...] = EMBEDDED_MODULES) -> list[tuple[str, str]]:
    documents: list[tuple[str, str]] = []
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn on import
        for name in modules:
            try:
                module = importlib.import_module(name)
            except Exception:  # a module missing from this interpreter is just skipped
                continue
            if id(module) not in seen:
                seen.add(id(module))
                documents.extend(module_documents(module, part_chars))
    return documents


if __name__ == "__main__":
    json.dump(build(int(sys.argv[1]) if len(sys.argv) > 1 else 12_000), sys.stdout)
