"""Values and files every run-directory writer shares: JSON-safe copies of metrics and configs,
numbers for tables, and JSON-lines files that survive a torn last line."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plain(value: Any) -> Any:
    """JSON/YAML-safe copy: dataclasses to dicts, tuples to lists, array scalars to numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    # numpy / jax arrays: scalars via .item(), small arrays as lists; anything else as text.
    if getattr(value, "ndim", 0) and callable(getattr(value, "tolist", None)):
        return plain(value.tolist())
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return plain(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def number(value: Any) -> float | None:
    """The value as a float when it is a real scalar (bools and NaN included), else None."""
    value = plain(value)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def fmt(value: Any) -> str:
    """A metric as table or progress-bar text: integers whole, other numbers to 4 significant digits."""
    as_number = number(value)
    if as_number is None:
        return "-" if value is None else str(value)
    if as_number != as_number:
        return "nan"
    if float(as_number).is_integer() and abs(as_number) < 1e9:
        return str(int(as_number))
    return f"{as_number:.4g}"


def json_line(record: Mapping[str, Any]) -> str:
    # NaN/inf are not JSON; store them as null so every reader can parse the file.
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(plain(record)), ensure_ascii=False) + "\n"


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return []
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
