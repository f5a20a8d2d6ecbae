"""A sweep's own settings, each a checked dataclass: each trial's resources and where it
trains (:class:`Resources`, with the arithmetic of what a trial holds and how many fit), the
searcher, the scheduler, the trial score (:class:`Statistic`, :func:`score_history`) and the
confirmation stage (:class:`Confirm`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from components.config import (
    ConfigError,
    check_at_least,
    check_gpu_share,
    check_non_negative,
    check_positive,
)

if TYPE_CHECKING:
    from components.search_space.sweep_file import SweepConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resources:
    """Each trial's workers (fractions of a CPU/GPU allowed) and where they train.

    ``mode``: ``in_trial`` trains inside the Tune trial actor (one worker only: no Ray Train
    controller, worker group or process group per trial — most of a short trial's fixed cost;
    the actor holds the worker's CPUs/GPUs and is reused by the next trial); ``worker_group``
    gives every trial its own Ray Train worker group; ``auto`` is ``in_trial`` for one worker,
    else ``worker_group``.
    """

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    mode: Literal["auto", "in_trial", "worker_group"] = "auto"

    def __post_init__(self) -> None:
        check_at_least("resources.workers", self.workers, 1)
        check_positive("resources.cpus_per_worker", self.cpus_per_worker)
        check_non_negative("resources.gpus_per_worker", self.gpus_per_worker)
        if self.gpus_per_worker > 0:
            check_gpu_share("resources.workers", self.workers, "resources.gpus_per_worker",
                            self.gpus_per_worker)
        if self.mode not in ("auto", "in_trial", "worker_group"):
            raise ConfigError(f"resources.mode={self.mode!r} is not allowed: choose one of "
                              "auto, in_trial, worker_group")
        if self.mode == "in_trial" and self.workers != 1:
            raise ConfigError(f"resources.mode=in_trial needs resources.workers=1 (got "
                              f"{self.workers}): a trial actor is one process; use "
                              "mode=worker_group (or auto) for multi-worker trials")

    @property
    def in_trial(self) -> bool:
        """Whether each trial trains inside its Tune trial actor."""
        return self.mode == "in_trial" or (self.mode == "auto" and self.workers == 1)

    def trial_resources(self) -> dict[str, float]:
        """What each Tune trial actor reserves: the worker's CPUs/GPUs when it trains in the
        trial, else a quarter CPU to drive its Ray Train worker group (which reserves its own)."""
        if not self.in_trial:
            return {"CPU": 0.25}
        out = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker > 0:
            out["GPU"] = float(self.gpus_per_worker)
        return out

    def per_trial(self) -> dict[str, float]:
        """Everything one running trial holds: its actor, plus its worker group if any."""
        actor = self.trial_resources()
        if self.in_trial:
            return actor
        return {"CPU": actor["CPU"] + self.workers * self.cpus_per_worker,
                "GPU": self.workers * self.gpus_per_worker}

    def trials_that_fit(self, cluster: dict[str, float]) -> int:
        """How many trials ``cluster`` (``ray.cluster_resources()``) runs at once (≥ 1)."""
        fits = [int(cluster.get(k, 0.0) / v + 1e-9) for k, v in self.per_trial().items() if v > 0]
        return max(1, min(fits, default=1))


@dataclasses.dataclass(frozen=True)
class Searcher:
    """Optuna sampler: TPE, random, CMA-ES (``cmaes`` package) or grid (every combination of
    the space's ``choice`` values once, in an order drawn with ``seed``: Optuna's
    ``GridSampler``); ``startup_trials`` random trials before TPE / CMA-ES start modelling."""

    name: Literal["tpe", "random", "cmaes", "grid"] = "tpe"
    seed: int = 0
    startup_trials: int = 4

    def __post_init__(self) -> None:
        if self.name not in ("tpe", "random", "cmaes", "grid"):
            raise ConfigError(f"searcher.name={self.name!r} is not allowed: choose one of "
                              "tpe, random, cmaes, grid")
        check_at_least("searcher.startup_trials", self.startup_trials, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scheduler:
    """Trial scheduler: ASHA (early stopping on the reported ``epoch``) or FIFO (none).
    ``max_epochs`` is ASHA's max_t; ``None`` = the trials' ``train.epochs``."""

    name: Literal["asha", "fifo"] = "asha"
    grace_period: int = 1
    reduction_factor: int = 2
    max_epochs: int | None = None

    def __post_init__(self) -> None:
        if self.name not in ("asha", "fifo"):
            raise ConfigError(f"scheduler.name={self.name!r} is not allowed: choose one of "
                              "asha, fifo")
        check_at_least("scheduler.grace_period", self.grace_period, 1)
        check_at_least("scheduler.reduction_factor", self.reduction_factor, 2)
        if self.max_epochs is not None:
            check_at_least("scheduler.max_epochs", self.max_epochs, 1)
            if self.grace_period > self.max_epochs:
                raise ConfigError(f"scheduler.grace_period={self.grace_period} is not allowed: "
                                  f"it must be <= scheduler.max_epochs={self.max_epochs}")


@dataclasses.dataclass(frozen=True)
class Statistic:
    """What a trial's score is, from its per-epoch ``metric`` values: ``mean_last`` (the mean
    of the last ``k`` evaluations: the default, since one evaluation on a small val split
    moves by several points from epoch to epoch), ``last`` (the final evaluation) or ``best``
    (the best epoch's value — the maximum of noisy draws rewards noise, and a run cannot be
    stopped at a best epoch it only knows afterwards). The searcher, ASHA and the tables use
    the score (``sweep_score`` in each trial's results)."""

    name: Literal["mean_last", "last", "best"] = "mean_last"
    k: int = 3

    def __post_init__(self) -> None:
        if self.name not in STATISTICS:
            raise ConfigError(f"statistic.name={self.name!r} is not allowed: choose one of "
                              f"{', '.join(STATISTICS)}")
        check_at_least("statistic.k", self.k, 1)

    def describe(self, metric: str) -> str:
        return {"mean_last": f"mean of the last {self.k} {metric} evaluations",
                "last": f"the last {metric} evaluation",
                "best": f"the best epoch's {metric}"}[self.name]

    def score(self, values: Sequence[float], mode: str) -> float | None:
        """The score of a trial whose evaluations so far are ``values`` (non-finite ones
        dropped; ``None`` when there is none)."""
        finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
        if not finite:
            return None
        if self.name == "last":
            return finite[-1]
        if self.name == "best":
            return max(finite) if mode == "max" else min(finite)
        tail = finite[-self.k:]
        return sum(tail) / len(tail)


@dataclasses.dataclass(frozen=True)
class Confirm:
    """The confirmation stage (:mod:`components.sweep.confirmation`): the ``top`` best settings
    retrained with ``seeds`` fresh seeds each, scored by kNN top-1 on ``split``; ``top: 0``
    (the default) skips it."""

    top: int = 0
    seeds: int = 3
    split: Literal["test", "val"] = "test"

    def __post_init__(self) -> None:
        check_at_least("confirm.top", self.top, 0)
        check_at_least("confirm.seeds", self.seeds, 1)
        if self.split not in ("test", "val"):
            raise ConfigError(f"confirm.split={self.split!r} is not allowed: choose test (never "
                              "used for choosing) or val")


STATISTICS = ("mean_last", "last", "best")
SCORE = "sweep_score"  # the column every trial reports: the statistic of its metric so far


def score_spec(sweep: SweepConfig) -> dict[str, Any]:
    """What a trial needs to compute its score (plain values: shipped to Ray workers)."""
    return {"metric": sweep.metric, "mode": sweep.mode, "name": sweep.statistic.name,
            "k": sweep.statistic.k}


def score_history(history: Sequence[Mapping[str, Any]], spec: Mapping[str, Any]
                  ) -> list[float | None]:
    """The score after each epoch of ``history`` (per-epoch rows), from the rows holding the
    metric so far (``None`` before the first evaluation)."""
    stat = Statistic(spec["name"], spec["k"])
    seen: list[float] = []
    out: list[float | None] = []
    for row in history:
        if spec["metric"] in row:
            seen.append(row[spec["metric"]])
        out.append(stat.score(seen, spec["mode"]))
    return out


def _require_cmaes() -> None:
    try:
        import cmaes  # noqa: F401
    except ImportError:
        raise ConfigError("searcher.name='cmaes' needs the Python package `cmaes`, which is "
                          "not installed: pip install cmaes, or choose searcher.name tpe or "
                          "random") from None


# ---------------------------------------------------------------------------------------------
# Loading.
