"""``ConfigError`` and the range checks every config dataclass's ``__post_init__`` uses."""

from __future__ import annotations

import math

from components.errors import SimgraphError


class ConfigError(SimgraphError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range, or the
    file cannot be read or parsed. ``simgraph`` exits 2 on it."""

    exit_code = 2
    headline = "invalid config: "


# ---------------------------------------------------------------------------------------------
# Range checks used by the dataclasses' __post_init__.


def check_positive(key: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number > 0")


def check_non_negative(key: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number >= 0")


def check_in_range(key: str, value: float, low: float, high: float) -> None:
    if not (isinstance(value, int | float) and low <= value <= high):
        raise ConfigError(f"{key}={value!r} is not allowed: it must lie in [{low}, {high}]")


def check_at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key}={value!r} is not allowed: it must be an integer >= {low}")
