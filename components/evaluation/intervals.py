"""How sure a reported number is: bootstrap intervals over the evaluation images.

Every accuracy simgraph reports is a mean over images (kNN or probe hits) or a statistic of
per-image values (SINCERE's median margin). Resampling the images with replacement
(``scipy.stats.bootstrap``, percentile method) gives an interval for it; two runs scored on
the *same* images are compared **paired**: the statistic of run A minus that of run B on each
resample, so what the images share cancels (a run against itself is exactly 0, [0, 0]).

Percentile intervals: BCa needs a jackknife over every image (too slow at tens of thousands
of images) and fails on a constant sample (all hits). For a proportion p over n images the
interval is close to the binomial one, ``p ± 1.96·sqrt(p(1 - p)/n)`` (tested).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0  # fixed: the same run evaluated twice reports the same interval


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """A statistic with its bootstrap ``confidence`` interval and standard error."""

    value: float
    low: float
    high: float
    se: float  # the bootstrap distribution's standard deviation

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _statistic(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` over the last axis, as scipy's vectorised bootstrap calls it."""
    return lambda *xs, axis=-1: fn(*xs, axis=axis)


def _bootstrap(data: Sequence[np.ndarray], fn: Callable[..., Any], value: float,
               paired: bool) -> Interval:
    from scipy.stats import bootstrap

    n = len(data[0])
    if n == 0:
        nan = float("nan")
        return Interval(value=nan, low=nan, high=nan, se=nan)
    if n == 1 or all(np.all(d == d[0]) for d in data):  # no spread: nothing to resample
        return Interval(value=value, low=value, high=value, se=0.0)
    res = bootstrap(tuple(data), _statistic(fn), paired=paired, vectorized=True,
                    n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method="percentile",
                    random_state=np.random.default_rng(SEED))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Interval(value=value, low=low, high=high, se=float(res.standard_error))


def mean_interval(values: np.ndarray | Any) -> Interval:
    """The mean of ``values`` [n] (e.g. per-image hits as 0/1) with its interval."""
    x = np.asarray(values, dtype=np.float64).ravel()
    value = float(x.mean()) if x.size else float("nan")
    return _bootstrap([x], lambda a, axis: a.mean(axis=axis), value, paired=False)


def paired_mean_difference(a: np.ndarray | Any, b: np.ndarray | Any) -> Interval:
    """``mean(a) - mean(b)`` for two runs' per-image values on the same images, paired.

    Raises:
        ValueError: ``a`` and ``b`` differ in length (not the same images).
    """
    x, y = (np.asarray(v, dtype=np.float64).ravel() for v in (a, b))
    if x.shape != y.shape:
        raise ValueError(f"a paired difference needs the same images: {x.size} vs {y.size} "
                         "values")
    d = x - y
    value = float(d.mean()) if d.size else float("nan")
    return _bootstrap([d], lambda v, axis: v.mean(axis=axis), value, paired=False)


def margin_interval(target: np.ndarray | Any, noise: np.ndarray | Any) -> Interval:
    """SINCERE's margin ``median(target) - median(noise)`` over the same images, resampled
    as pairs (both values of an image stay together)."""
    t, n = (np.asarray(v, dtype=np.float64).ravel() for v in (target, noise))
    value = float(np.median(t) - np.median(n)) if t.size else float("nan")
    return _bootstrap([t, n], lambda a, b, axis: (np.median(a, axis=axis)
                                                 - np.median(b, axis=axis)), value, paired=True)


def paired_margin_difference(a: tuple[Any, Any], b: tuple[Any, Any]) -> Interval:
    """Margin of run A minus margin of run B (each ``(target, noise)`` per image, the same
    images), resampled jointly.

    Raises:
        ValueError: the runs were not scored on the same number of images.
    """
    arrays = [np.asarray(v, dtype=np.float64).ravel() for v in (*a, *b)]
    if len({x.size for x in arrays}) != 1:
        raise ValueError("a paired difference needs the same images: "
                         f"{[x.size for x in arrays]} values")
    ta, na, tb, nb = arrays

    def diff(ta: Any, na: Any, tb: Any, nb: Any, axis: int) -> Any:
        return (np.median(ta, axis=axis) - np.median(na, axis=axis)
                - np.median(tb, axis=axis) + np.median(nb, axis=axis))

    value = float(diff(ta, na, tb, nb, axis=-1)) if ta.size else float("nan")
    return _bootstrap(arrays, diff, value, paired=True)


def binomial_interval(p: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The normal-approximation binomial interval ``p ± z·sqrt(p(1 - p)/n)`` (a reference
    for tests and a quick check)."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    half = z * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


def fmt(iv: Interval | dict[str, float] | None, scale: float = 100.0, digits: int = 1) -> str:
    """``value [low, high]`` (percent points by default), or ``—``."""
    if iv is None:
        return "—"
    d = iv.as_dict() if isinstance(iv, Interval) else iv
    if any(math.isnan(d[k]) for k in ("value", "low", "high")):
        return "—"
    f = f"{{:.{digits}f}}"
    return (f"{f.format(scale * d['value'])} [{f.format(scale * d['low'])}, "
            f"{f.format(scale * d['high'])}]")
