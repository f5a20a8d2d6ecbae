"""components.checks: the one home of scalar argument checks (values, message, error type)."""

from __future__ import annotations

import numpy as np
import pytest

from components import checks
from components.config import ConfigError


def test_values_pass_through_as_plain_numbers() -> None:
    assert checks.positive("tau", 1) == 1.0 and isinstance(checks.positive("tau", 1), float)
    assert checks.non_negative("w", 0) == 0.0
    assert checks.in_range("p", 1.0, 0.0, 1.0) == 1.0
    assert checks.at_least("k", np.int64(3), 1) == 3
    assert checks.as_float("x", -2) == -2.0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: checks.positive("tau", 0), "tau=0 is not allowed: it must be a finite number > 0"),
        (lambda: checks.positive("tau", True), "tau=True is not allowed"),
        (lambda: checks.positive("tau", float("inf")), "a finite number > 0"),
        (lambda: checks.non_negative("w", -1e-9), "w=-1e-09 is not allowed: it must be a finite "
                                                   "number >= 0"),
        (lambda: checks.in_range("m", 1.0, 0.0, 1.0, high_open=True),
         r"m=1.0 is not allowed: it must lie in \[0.0, 1.0\)"),
        (lambda: checks.at_least("k", 2.5, 1), "k=2.5 is not allowed: it must be an integer$"),
        (lambda: checks.at_least("k", 0, 1), "k=0 is not allowed: it must be an integer >= 1"),
        (lambda: checks.as_int("k", False), "an integer, not a bool"),
        (lambda: checks.as_float("x", float("nan")), "x=nan is not allowed: it must be a finite"),
    ],
)
def test_refusals_name_the_value_and_what_is_allowed(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_the_error_type_is_the_callers() -> None:
    with pytest.raises(ConfigError, match="optim.lr=-1"):
        checks.positive("optim.lr", -1, ConfigError)
