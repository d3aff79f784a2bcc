"""Frozen dataclass configs: load from YAML, override with dotted `key=value`, validate with clear errors.

Sections are dataclasses declared next to the code they configure; `Config` composes them into one tree.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "experiments" / "configs"


class ConfigError(ValueError):
  """A user-caused config problem; its message is one line naming the key and the fix."""


def choice(value: str, allowed: tuple[str, ...], key: str) -> None:
  """Raises ConfigError unless value is one of allowed."""
  if value not in allowed:
    raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def positive(value, key: str, *, allow_zero: bool = False) -> None:
  if value < 0 or (value == 0 and not allow_zero):
    raise ConfigError(f"{key}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def in_range(value, low, high, key: str) -> None:
  if not low <= value <= high:
    raise ConfigError(f"{key}={value!r} must lie in [{low}, {high}]")


# ---------------------------------------------------------------------------------------------
# Building dataclasses from plain data


def _coerce(value: Any, annotation: Any, key: str) -> Any:
  """Converts YAML/CLI data to the declared type, or raises ConfigError naming the key."""
  origin = typing.get_origin(annotation)
  args = typing.get_args(annotation)
  if annotation is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _coerce(value, arg, key)
      except ConfigError as err:
        errors.append(str(err))
    raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
  if dataclasses.is_dataclass(annotation):
    if isinstance(value, annotation):
      return value
    if not isinstance(value, dict):
      raise ConfigError(f"{key} must be a mapping of its fields, got {value!r}")
    return from_dict(annotation, value, prefix=f"{key}.")
  if origin is tuple:
    if isinstance(value, str):
      value = [v for v in value.split(",") if v] if value else []
    if not isinstance(value, (list, tuple)):
      raise ConfigError(f"{key} must be a list, got {value!r}")
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if args and len(args) != len(value):
      raise ConfigError(f"{key} must have {len(args)} items, got {len(value)}")
    return tuple(
        _coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value)))
    )
  if origin is dict or annotation is dict:
    if not isinstance(value, dict):
      raise ConfigError(f"{key} must be a mapping, got {value!r}")
    return dict(value)
  if annotation is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
      return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{key} must be true or false, got {value!r}")
  if annotation is int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
      raise ConfigError(f"{key} must be an integer, got {value!r}")
    try:
      return int(value)
    except ValueError:
      raise ConfigError(f"{key} must be an integer, got {value!r}") from None
  if annotation is float:
    if isinstance(value, bool):
      raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
      return float(value)
    except (TypeError, ValueError):
      raise ConfigError(f"{key} must be a number, got {value!r}") from None
  if annotation is str:
    if isinstance(value, (dict, list)):
      raise ConfigError(f"{key} must be a string, got {value!r}")
    return str(value)
  return value


def _unknown_key(key: str, allowed: list[str]) -> ConfigError:
  close = difflib.get_close_matches(key.rsplit(".", 1)[-1], allowed, n=1)
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return ConfigError(f"unknown config key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}")


def from_dict(cls, data: dict, prefix: str = ""):
  """Builds dataclass `cls` from nested plain data; unknown keys raise ConfigError."""
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls) if f.init]
  kwargs = {}
  for key, value in (data or {}).items():
    if key not in names:
      raise _unknown_key(prefix + key, names)
    kwargs[key] = _coerce(value, hints[key], prefix + key)
  try:
    return cls(**kwargs)
  except ConfigError:
    raise
  except (ValueError, TypeError) as err:
    raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {err}") from None


def to_dict(config) -> dict:
  """Plain nested data (tuples as lists) for YAML."""

  def plain(v):
    if dataclasses.is_dataclass(v):
      return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
      return [plain(x) for x in v]
    if isinstance(v, dict):
      return {k: plain(x) for k, x in v.items()}
    return v

  return plain(config)


def parse_overrides(pairs: list[str]) -> dict:
  """['rl.lr=1e-5', 'iterations=3'] -> nested dict; values are parsed as YAML scalars."""
  nested: dict = {}
  for pair in pairs:
    if "=" not in pair:
      raise ConfigError(f"override {pair!r} must look like key=value (e.g. rl.lr=1e-5)")
    key, raw = pair.split("=", 1)
    key = key.strip()
    if not key:
      raise ConfigError(f"override {pair!r} has an empty key")
    try:
      value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
      value = raw
    node = nested
    parts = key.split(".")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise ConfigError(f"override {pair!r} conflicts with an earlier override of {part!r}")
    node[parts[-1]] = value
  return nested


def merge(base: dict, update: dict) -> dict:
  out = dict(base)
  for key, value in update.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      out[key] = merge(out[key], value)
    else:
      out[key] = value
  return out


def read_yaml(name_or_path: str) -> dict:
  """Reads a config by name (experiments/configs/NAME.yaml) or path, following `base:` chains."""
  path = Path(name_or_path)
  if not path.suffix:
    path = CONFIG_DIR / f"{name_or_path}.yaml"
  if not path.is_file():
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(f"config {name_or_path!r} not found; use a path or one of: {', '.join(names)}")
  try:
    data = yaml.safe_load(path.read_text()) or {}
  except yaml.YAMLError as err:
    first = str(err).splitlines()[0]
    raise ConfigError(f"config {path} is not valid YAML: {first}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"config {path} must be a mapping at the top level")
  base = data.pop("base", None)
  if base:
    parent = base if Path(base).suffix else base
    if Path(parent).suffix and not Path(parent).is_absolute():
      parent = str(path.parent / parent)
    data = merge(read_yaml(parent), data)
  return data
