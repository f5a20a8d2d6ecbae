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


def check_gpu_share(workers_key: str, workers: int, gpus_key: str, gpus: float) -> None:
    """GPUs per worker that the recipe can use: each rank trains on one device, so more than
    one GPU per worker would sit idle; a fraction is fine for one worker (sweep trials share
    a GPU), but several workers with fractions land on one GPU, which NCCL refuses
    ("Duplicate GPU detected"). ``gpus`` 0 (or unused) is not checked here."""
    if gpus > 1:
        raise ConfigError(
            f"{gpus_key}={gpus!r} is not allowed: a worker trains on one GPU; for more GPUs "
            f"raise {workers_key} (one worker per GPU) and keep {gpus_key}=1")
    if workers > 1 and gpus < 1:
        raise ConfigError(
            f"{gpus_key}={gpus!r} with {workers_key}={workers} is not allowed: fractional GPUs "
            f"would put two ranks on one GPU, which NCCL refuses (\"Duplicate GPU "
            f"detected\"); use {gpus_key}=1 for multi-worker runs (fractions are fine "
            "with one worker, e.g. sweep trials sharing a GPU)")
