"""Safetensors files without torch: memory-mapped reading (bfloat16 included), the files of a model
directory (sharded or not), and writing tensors fetched one at a time."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return header, 8 + size


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, memory-mapped array) for each tensor of a safetensors file, in storage order.

    Our own reader rather than `safetensors.safe_open(framework="numpy")`: that one cannot return
    bfloat16, the dtype most released checkpoints use.
    """
    path = Path(path)
    header, data_start = _safetensors_header(path)
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path.name}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = data[data_start + begin : data_start + end]
        yield name, raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def safetensors_files(path: str | Path) -> list[Path]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in dict.fromkeys(weight_map.values())]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no *.safetensors files; export or download the weights first")
    return files


def write_safetensors(path: Path, entries: list[tuple[str, tuple[int, ...], np.dtype, Callable]]):
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dt, _ in entries:
        nbytes = math.prod(shape) * dt.itemsize
        header[name] = {"dtype": _ST_NAMES[dt], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keeps tensor data 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape, dt, get in entries:
            array = np.ascontiguousarray(get(), dtype=dt)
            if array.shape != tuple(shape):
                raise AssertionError(f"{name}: produced {array.shape}, declared {shape}")
            f.write(array.tobytes())
