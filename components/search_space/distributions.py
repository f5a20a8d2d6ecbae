"""A sweep parameter's distribution (:class:`Distribution`: its YAML form, checks and Optuna
suggestion) and the corners of a set of ranges that validation builds configs at."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from components.config import TEMPERATURE_KEYS, ConfigError

if TYPE_CHECKING:
    import optuna

KINDS = ("uniform", "loguniform", "int", "choice")
# Validation builds every corner of a branch's ranges up to this many configs; beyond it,
# each parameter's ends one at a time (with the others at their low end), and all highs.
MAX_CORNERS = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class Distribution:
    """One parameter's distribution. ``uniform``/``loguniform`` sample floats in [low, high],
    ``int`` integers (log-scaled when ``log``), ``choice`` one of ``values``.

    Constructing one checks it; :meth:`parse` reads the YAML form and names the path in errors.
    """

    kind: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    values: tuple[Any, ...] | None = None
    log: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"distribution {self.kind!r} is not allowed: choose one of "
                              f"{', '.join(KINDS)} (Optuna does not do grid search; use choice)")
        if self.kind == "choice":
            self._check_choice()
            return
        if self.values is not None:
            raise ConfigError(f"{self.kind} takes [low, high], not values={self.values!r}")
        if self.kind == "loguniform":
            object.__setattr__(self, "log", True)
        elif self.kind == "uniform" and self.log:
            raise ConfigError("uniform with log=true is not allowed: use loguniform")
        for end, v in (("low", self.low), ("high", self.high)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{self.kind} {end}={v!r} is not allowed: give a finite number")
        low, high = float(self.low or 0), float(self.high or 0)
        given = f"[{self.low}, {self.high}]"
        if self.kind == "int" and not (low.is_integer() and high.is_integer()):
            raise ConfigError(f"int range {given} is not allowed: give integer ends")
        if not low < high:
            raise ConfigError(f"{self.kind} range {given} is empty or inverted: low must be "
                              "< high")
        if self.log and low <= 0:
            raise ConfigError(f"log range {given} touching 0 is not allowed: a log scale "
                              "needs low > 0")

    def _check_choice(self) -> None:
        if self.low is not None or self.high is not None or self.log:
            raise ConfigError("choice takes values only, not low/high/log")
        if not isinstance(self.values, tuple) or len(self.values) < 1:
            raise ConfigError(f"choice values={self.values!r} is not allowed: give at least "
                              "one value")
        seen: list[Any] = []
        for v in self.values:
            if v is not None and not isinstance(v, str | int | float | bool):
                raise ConfigError(f"choice value {v!r} is not allowed: Optuna chooses among "
                                  "strings, numbers, booleans and null")
            if any(v == s and type(v) is type(s) for s in seen):
                raise ConfigError(f"choice value {v!r} is listed twice")
            seen.append(v)

    @classmethod
    def parse(cls, path: str, spec: Any) -> Distribution:
        """Read ``{uniform: [lo, hi]}`` etc.; errors start ``search space parameter <path>:``."""
        where = f"search space parameter {path}"
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}={spec!r} is not allowed: give a distribution such as "
                              "{loguniform: [0.05, 0.5]} or {choice: [a, b]}; a constant goes "
                              "in overrides")
        if "grid" in spec or "grid_search" in spec:
            raise ConfigError(f"{where}: {dict(spec)!r}: Optuna does not do grid search; use "
                              "{choice: [...]}")
        kinds = [k for k in spec if k in KINDS]
        unknown = [k for k in spec if k not in KINDS and k != "log"]
        if unknown or len(kinds) != 1:
            bad = unknown[0] if unknown else ", ".join(map(str, kinds)) or "nothing"
            raise ConfigError(f"{where}: distribution {bad!r} is not allowed: give exactly one "
                              f"of {', '.join(KINDS)} (int also takes log: true)")
        kind = kinds[0]
        arg = spec[kind]
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ConfigError(f"{where}: log={log!r} is not allowed: true or false")
        if log and kind not in ("int", "loguniform"):
            raise ConfigError(f"{where}: log: true is not allowed with {kind}; use loguniform "
                              "for floats, {int: [lo, hi], log: true} for integers")
        try:
            if kind == "choice":
                if not isinstance(arg, list):
                    raise ConfigError(f"choice={arg!r} is not allowed: give a list of values")
                dist = cls(kind="choice", values=tuple(arg))
            else:
                if not isinstance(arg, list) or len(arg) != 2:
                    raise ConfigError(f"{kind}={arg!r} is not allowed: give [low, high]")
                low, high = (_number(v, integer=kind == "int") for v in arg)
                dist = cls(kind=kind, low=low, high=high, log=log)  # type: ignore[arg-type]
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        leaf = path.rsplit(".", 1)[-1]
        if leaf in TEMPERATURE_KEYS:
            lowest = dist.low if dist.kind != "choice" else min(
                (v for v in dist.ends() if isinstance(v, int | float)), default=None)
            if lowest is not None and lowest <= 0:
                raise ConfigError(f"{where}: a temperature must be > 0, the range reaches "
                                  f"{lowest}")
        return dist

    def ends(self) -> list[Any]:
        """What validation tries: both ends of a range, or every value of a choice."""
        if self.kind == "choice":
            return list(self.values or ())
        if self.kind == "int":
            return [int(self.low or 0), int(self.high or 0)]
        return [self.low, self.high]

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one this distribution can produce."""
        if self.kind == "choice":
            return any(value == v and type(value) is type(v) for v in self.values or ())
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not float(value).is_integer():
            return False
        return float(self.low or 0) <= value <= float(self.high or 0)

    def suggest(self, trial: optuna.trial.BaseTrial, path: str) -> Any:
        """Sample this distribution as Optuna parameter ``path``."""
        if self.kind == "choice":
            return trial.suggest_categorical(path, list(self.values or ()))
        if self.kind == "int":
            return trial.suggest_int(path, int(self.low or 0), int(self.high or 0), log=self.log)
        return trial.suggest_float(path, float(self.low or 0), float(self.high or 0),
                                   log=self.log)

    def to_optuna(self) -> optuna.distributions.BaseDistribution:
        """The equivalent Optuna distribution object."""
        import optuna

        if self.kind == "choice":
            return optuna.distributions.CategoricalDistribution(list(self.values or ()))
        if self.kind == "int":
            return optuna.distributions.IntDistribution(int(self.low or 0), int(self.high or 0),
                                                        log=self.log)
        return optuna.distributions.FloatDistribution(float(self.low or 0),
                                                      float(self.high or 0), log=self.log)


def _number(value: Any, integer: bool) -> Any:
    """A range end as float (uniform, loguniform) or int (int, when integral); anything else
    is returned as is for :class:`Distribution` to refuse."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if integer:
        return int(value) if float(value).is_integer() else value
    return float(value)


def _corners(params: Mapping[str, Distribution]) -> Iterator[dict[str, Any]]:
    """Every combination of range ends (choices: values), or, past MAX_CORNERS, each
    parameter's ends one at a time with the others at their first end, then all last ends."""
    ends = {p: d.ends() for p, d in params.items()}
    if math.prod(len(v) for v in ends.values()) <= MAX_CORNERS:
        for combo in itertools.product(*ends.values()):
            yield dict(zip(ends, combo, strict=True))
        return
    first = {p: v[0] for p, v in ends.items()}
    for p, vs in ends.items():
        for v in vs:
            yield {**first, p: v}
    yield {p: v[-1] for p, v in ends.items()}
