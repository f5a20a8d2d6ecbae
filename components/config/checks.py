"""``ConfigError`` and the range checks every config dataclass's ``__post_init__`` uses
(:mod:`components.checks` with ``ConfigError``)."""

from __future__ import annotations

from components import checks
from components.errors import SimgraphError


class ConfigError(SimgraphError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range, or the
    file cannot be read or parsed. ``simgraph`` exits 2 on it."""

    exit_code = 2
    headline = "invalid config: "


# ---------------------------------------------------------------------------------------------
# Range checks used by the dataclasses' __post_init__: components.checks, raising ConfigError.


def check_positive(key: str, value: float) -> None:
    checks.positive(key, value, ConfigError)


def check_non_negative(key: str, value: float) -> None:
    checks.non_negative(key, value, ConfigError)


def check_in_range(key: str, value: float, low: float, high: float) -> None:
    checks.in_range(key, value, low, high, error=ConfigError)


def check_at_least(key: str, value: int, low: int) -> None:
    checks.at_least(key, value, low, ConfigError)
