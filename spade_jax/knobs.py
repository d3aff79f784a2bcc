"""Declaring a config knob's checks: the one-line ConfigError and the range checks every config
section's __post_init__ uses. A leaf module, so any section may import it without a cycle."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A user-caused config problem; its message is one line naming the key and the fix."""


def choice(value: str, allowed: tuple[str, ...], key: str) -> None:
    """Raises ConfigError unless value is one of allowed."""
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def positive(value, key: str, *, allow_zero: bool = False) -> None:
    """Raises ConfigError unless value is finite and > 0 (>= 0 with allow_zero)."""
    if not finite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value!r} must be {'>= 0' if allow_zero else '> 0'}")


def in_range(value, low, high, key: str) -> None:
    """Raises ConfigError unless low <= value <= high (NaN never is)."""
    if not low <= value <= high:
        raise ConfigError(f"{key}={value!r} must lie in [{low}, {high}]")


def finite(value) -> bool:
    """False for a float NaN or infinity; True for anything else."""
    return not isinstance(value, float) or math.isfinite(value)

