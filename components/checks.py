"""Scalar argument checks, one home for every layer: config dataclasses (with
``error=ConfigError``), objectives, optimisers, schedules and evaluation metrics.

Each check returns the value as a plain Python number, or raises ``error`` (``ValueError`` by
default; any subclass of it) with one message shape: ``{name}={value!r} is not allowed: it
must be ...``. A number is any real (Python or numpy, :class:`numbers.Real`); bools are
refused wherever a number is asked for (``tau=True`` is a mistake, not 1). Tensor checks of
the metrics (shapes, labels, devices) live in :mod:`components.evaluation.checks`.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import TypeGuard


def _refuse(error: type[ValueError], name: str, value: object, must: str) -> ValueError:
    return error(f"{name}={value!r} is not allowed: it must {must}")


def _real(value: object) -> TypeGuard[float]:
    """A real number (Python or numpy), not a bool; typed as float for the comparisons."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def as_float(name: str, value: object, error: type[ValueError] = ValueError) -> float:
    """``value`` as a finite float.

    Raises:
        ``error``: a bool, not an int/float, or NaN/±inf.
    """
    if not _real(value):
        raise _refuse(error, name, value, "be a finite number")
    out = float(value)
    if not math.isfinite(out):
        raise _refuse(error, name, value, "be a finite number")
    return out


def as_int(name: str, value: object, error: type[ValueError] = ValueError) -> int:
    """``value`` as an int: anything with ``__index__`` (Python and numpy integers, 0-d
    integer tensors).

    Raises:
        ``error``: a bool, or not an integer.
    """
    if isinstance(value, bool):
        raise _refuse(error, name, value, "be an integer, not a bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise _refuse(error, name, value, "be an integer") from None


def positive(name: str, value: object, error: type[ValueError] = ValueError) -> float:
    """``value`` if it is a finite number > 0 (a temperature, a learning rate)."""
    if not (_real(value) and math.isfinite(value) and value > 0):
        raise _refuse(error, name, value, "be a finite number > 0")
    return float(value)


def non_negative(name: str, value: object, error: type[ValueError] = ValueError) -> float:
    """``value`` if it is a finite number >= 0 (a weight, a margin, weight decay)."""
    if not (_real(value) and math.isfinite(value) and value >= 0):
        raise _refuse(error, name, value, "be a finite number >= 0")
    return float(value)


def in_range(name: str, value: object, low: float, high: float, *, high_open: bool = False,
             low_open: bool = False, error: type[ValueError] = ValueError) -> float:
    """``value`` if it lies in [low, high] (``low_open`` / ``high_open``: (low, … / …, high))."""
    inside = (_real(value) and (low < value if low_open else low <= value)
              and (value < high if high_open else value <= high))
    if not inside:
        raise _refuse(error, name, value, f"lie in {'(' if low_open else '['}{low}, {high}"
                                          f"{')' if high_open else ']'}")
    return float(value)  # type: ignore[arg-type]


def at_least(name: str, value: object, low: int, error: type[ValueError] = ValueError) -> int:
    """``value`` as an int >= ``low`` (a count, a size)."""
    out = as_int(name, value, error)
    if out < low:
        raise _refuse(error, name, value, f"be an integer >= {low}")
    return out


__all__ = ["as_float", "as_int", "at_least", "in_range", "non_negative", "positive"]
