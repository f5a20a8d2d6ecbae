"""Sweep definitions (``search_spaces/*.yaml``): load, validate against the config dataclasses
before any trial starts, and turn into an Optuna define-by-run space for Ray Tune.

Format (every key but ``name``, ``base`` and ``space`` is optional; defaults shown)::

    name: xclr-temperature        # sweep name; the sweep dir is storage/name
    storage: runs/sweeps          # relative to the working directory, like pretrain's storage
    base: ../pipelines/configs/pretrain/demo.yaml   # a pretrain config, relative to this file
    overrides: [train.epochs=6]   # dotted overrides of base, for every trial, applied before
                                  # the sampled parameters (default [])
    metric: knn_top1              # reported per epoch by pretraining: knn_top1, loss, lr,
                                  # samples_per_s, data_wait, anchors_without_positive, loss_*
    mode: max                     # max | min
    num_samples: 8                # settings the searcher suggests
    repeats: 1                    # seeds per setting (train.seed + 0..repeats-1, Tune's
                                  # Repeater): the searcher sees their mean, the tables show
                                  # mean ± sd and n; needs scheduler fifo when > 1
    max_concurrent: 1             # trials at a time; auto: as many as the cluster's CPUs and
                                  # GPUs hold when the sweep starts (resources below)
    resources: {workers: 1, cpus_per_worker: 1.0, gpus_per_worker: 0.0, mode: auto}
                                  # each trial's workers; fractions allowed; they set the
                                  # trial's scaling.* (use_gpu = gpus_per_worker > 0); mode:
                                  # in_trial (train inside the Tune trial actor, 1 worker),
                                  # worker_group (a Ray Train worker group per trial), auto
                                  # (in_trial for 1 worker)
    searcher: {name: tpe, seed: 0, startup_trials: 4}     # tpe | random | cmaes (needs the
                                                          # `cmaes` package)
    scheduler: {name: asha, grace_period: 1, reduction_factor: 2, max_epochs: null}
                                  # asha | fifo; ASHA's time unit is the reported epoch;
                                  # max_epochs null = the trials' train.epochs
    statistic: {name: mean_last, k: 3}    # a trial's score from its metric's evaluations:
                                  # mean_last (mean of the last k) | last | best (the best
                                  # epoch: rewards noise); searcher, ASHA and tables use it
    confirm: {top: 0, seeds: 3, split: test}  # top > 0: after the search, retrain the top
                                  # settings with `seeds` fresh seeds each and score them by
                                  # kNN top-1 on `split` (never used for choosing): best.yaml
                                  # and the closing line are the confirmed best, with its
                                  # interval, the settings tied with it and the winner's curse
                                  # (components/confirmation.py); `simgraph sweep FILE
                                  # --confirm` runs it on a finished sweep
    study_storage: null           # also write the study to "sqlite:///path.db" or
                                  # "journal:path.log" (Optuna's API and dashboard read it)
    mlflow: false                 # log every trial to MLflow (Ray Tune's MLflowLoggerCallback,
    mlflow_uri: null              # experiment = name); default store sqlite:///<sweep dir>/
                                  # mlflow.db; needs mlflow-skinny
    wandb: false                  # log every trial to W&B (Ray Tune's WandbLoggerCallback,
    wandb_project: simgraph       # group = name; offline: each trial dir's wandb/, no
    wandb_mode: offline           # account needed, `wandb sync` uploads); needs wandb
    space:                        # unconditional parameters, keyed by config path
      loss.name: {choice: [simclr, xclr]}
      loss.tau: {loguniform: [0.05, 0.5]}
    conditional:                  # per value of a choice parameter of space: parameters that
      loss.name:                  # exist only in that branch
        xclr: {loss.tau_s: {loguniform: [0.01, 1.0]}}

Distributions: ``{uniform: [low, high]}``, ``{loguniform: [low, high]}``, ``{int: [low, high]}``
(``{int: [low, high], log: true}`` for a log scale), ``{choice: [v1, v2, ...]}`` (strings,
numbers, booleans or null). A constant is an ``overrides`` entry (or a one-value ``choice``
inside a branch). Refused, naming the parameter path: grid entries (Optuna does not do grid
search; use ``choice``), unknown distribution names, empty or inverted ranges, log ranges
touching 0, temperatures (``tau``, ``tau_s``, ``tau_sup``, ``tau_dc``, ``temperature``) that
can be <= 0, conditional keys that are not a ``choice`` of ``space``, branch values that are
not among its choices, and a path both in ``space`` and a branch, or in two branches with
different distributions.

Validation builds real :class:`~components.config.PretrainConfig` objects for every branch
(each value of each conditional choice), with every parameter at the ends of its range (each
value of a choice): a key the branch's loss does not have, an unknown section or an
out-of-range value fails at load time, naming the sweep parameter and the allowed keys.

How a trial's config is made (:func:`trial_config`): base, then ``overrides``, then
``loss.name`` (which, when it switches the loss, starts that loss from its own defaults: the
base's other loss keys are dropped, see :func:`components.config.apply_overrides`), then the
other parameters sorted by path, then the trial's name and storage and ``resources``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from components.config import (
    TAGGED_SECTIONS,
    TEMPERATURE_KEYS,
    CoNeConfig,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    check_at_least,
    check_gpu_share,
    check_non_negative,
    check_positive,
    check_wandb,
    flatten,
    from_dict,
    load_config,
    load_yaml,
)

if TYPE_CHECKING:
    import optuna

KINDS = ("uniform", "loguniform", "int", "choice")
# What pipelines/pretrain.py reports every epoch (plus any ``loss_*`` component).
REPORTED_METRICS = ("knn_top1", "loss", "lr", "samples_per_s", "data_wait",
                    "anchors_without_positive")
# Keys of a sweep file that load_sweep's overrides may set; the sections take sub-keys.
OVERRIDABLE_KEYS = ("name", "storage", "metric", "mode", "num_samples", "repeats",
                    "max_concurrent",
                    "study_storage", "mlflow", "mlflow_uri", "wandb", "wandb_project",
                    "wandb_mode", "overrides")
OVERRIDABLE_SECTIONS = ("resources", "searcher", "scheduler", "statistic", "confirm")
# Config keys every trial gets from the sweep itself: not searchable, not in ``overrides``.
SET_BY_SWEEP = {
    "name": "the trial's run name", "storage": "the sweep dir",
    "scaling.num_workers": "resources.workers",
    "scaling.cpus_per_worker": "resources.cpus_per_worker",
    "scaling.gpus_per_worker": "resources.gpus_per_worker",
    "scaling.use_gpu": "resources.gpus_per_worker > 0",
}
# Validation builds every corner of a branch's ranges up to this many configs; beyond it,
# each parameter's ends one at a time (with the others at their low end), and all highs.
MAX_CORNERS = 256


# ---------------------------------------------------------------------------------------------
# Distributions.


@dataclasses.dataclass(frozen=True)
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
                dist = cls("choice", values=tuple(arg))
            else:
                if not isinstance(arg, list) or len(arg) != 2:
                    raise ConfigError(f"{kind}={arg!r} is not allowed: give [low, high]")
                low, high = (_number(v, integer=kind == "int") for v in arg)
                dist = cls(kind, low=low, high=high, log=log)  # type: ignore[arg-type]
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


# ---------------------------------------------------------------------------------------------
# The sweep's own settings.


@dataclasses.dataclass(frozen=True)
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
    """Optuna sampler: TPE, random, or CMA-ES (``cmaes`` package); ``startup_trials`` random
    trials before TPE / CMA-ES start modelling."""

    name: Literal["tpe", "random", "cmaes"] = "tpe"
    seed: int = 0
    startup_trials: int = 4

    def __post_init__(self) -> None:
        if self.name not in ("tpe", "random", "cmaes"):
            raise ConfigError(f"searcher.name={self.name!r} is not allowed: choose one of "
                              "tpe, random, cmaes")
        check_at_least("searcher.startup_trials", self.startup_trials, 0)


@dataclasses.dataclass(frozen=True)
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
    """The confirmation stage (:mod:`components.confirmation`): the ``top`` best settings
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SweepSettings:
    """The keys a sweep file and a loaded sweep share, declared once (defaults as in the
    module docstring's format)."""

    storage: str = "runs/sweeps"
    metric: str = "knn_top1"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 8
    repeats: int = 1
    max_concurrent: int | Literal["auto"] = 1
    resources: Resources = dataclasses.field(default_factory=Resources)
    searcher: Searcher = dataclasses.field(default_factory=Searcher)
    scheduler: Scheduler = dataclasses.field(default_factory=Scheduler)
    statistic: Statistic = dataclasses.field(default_factory=Statistic)
    confirm: Confirm = dataclasses.field(default_factory=Confirm)
    study_storage: str | None = None
    mlflow: bool = False
    mlflow_uri: str | None = None
    wandb: bool = False
    wandb_project: str = "simgraph"
    wandb_mode: str = "offline"


SETTINGS = tuple(f.name for f in dataclasses.fields(_SweepSettings))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SweepFile(_SweepSettings):
    """The sweep YAML as written: :func:`components.config.from_dict` checks its keys and
    types (naming dotted keys such as ``searcher.seed``); ``space`` and ``conditional`` are
    parsed into distributions by :func:`load_sweep`."""

    name: str
    base: str
    space: dict[str, Any]
    overrides: list[str] = dataclasses.field(default_factory=list)
    conditional: dict[str, Any] = dataclasses.field(default_factory=dict)


# In the docstring's order: what the sweep is, then how it runs.
FILE_KEYS = ("name", "base", "space", "conditional", "overrides", *SETTINGS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig(_SweepSettings):
    """A loaded sweep (see the module docstring): the file's settings, ``base`` resolved to a
    path, ``space`` / ``conditional`` parsed. Construction checks the structure;
    :meth:`validate` checks every parameter path against the base config, per branch."""

    name: str
    base_path: Path
    space: dict[str, Distribution]
    conditional: dict[str, dict[Any, dict[str, Distribution]]] = dataclasses.field(
        default_factory=dict)
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"name={self.name!r} is not allowed: give a sweep name without "
                              "'/' (the sweep dir is storage/name)")
        if not self.storage:
            raise ConfigError("storage='' is not allowed: give the folder of sweep dirs")
        if self.mode not in ("max", "min"):
            raise ConfigError(f"mode={self.mode!r} is not allowed: choose one of max, min")
        if self.metric not in REPORTED_METRICS and not self.metric.startswith("loss_"):
            raise ConfigError(f"metric={self.metric!r} is not reported by pretraining: choose "
                              f"one of {', '.join(REPORTED_METRICS)} or a loss_* component")
        wrong = {"knn_top1": "min", "loss": "max"}
        if wrong.get("loss" if self.metric.startswith("loss_") else self.metric) == self.mode:
            raise ConfigError(f"mode={self.mode!r} is not allowed with metric={self.metric!r}: "
                              f"it would pick the worst trial; use "
                              f"mode={'max' if self.mode == 'min' else 'min'}")
        check_at_least("num_samples", self.num_samples, 1)
        check_at_least("repeats", self.repeats, 1)
        if self.repeats > 1 and self.scheduler.name == "asha":
            raise ConfigError(
                f"repeats={self.repeats} with scheduler.name='asha' is not allowed: ASHA would "
                "stop some seeds of a setting early and the searcher would average unequal "
                "runs; use scheduler: {name: fifo} with repeats")
        if self.max_concurrent != "auto":
            check_at_least("max_concurrent", self.max_concurrent, 1)
        s = self.study_storage
        if s is not None and not (s.startswith("sqlite:///") and len(s) > len("sqlite:///")
                                  or s.startswith("journal:") and len(s) > len("journal:")):
            raise ConfigError(f"study_storage={s!r} is not allowed: give sqlite:///<file.db>, "
                              "journal:<file.log> or null")
        if self.mlflow and self.mlflow_uri is None and "://" in self.storage:
            raise ConfigError(f"mlflow: true with storage={self.storage!r} needs mlflow_uri (a "
                              "tracking server, or sqlite:///<local path>): the default SQLite "
                              "store lives in a local sweep dir")
        check_wandb("", self.wandb_project, self.wandb_mode)
        self._check_overrides()
        self._check_parameters()

    def _check_overrides(self) -> None:
        params = self.parameters()
        for o in self.overrides:
            if not isinstance(o, str) or "=" not in o:
                raise ConfigError(f"overrides entry {o!r} is not allowed: give key.path=value")
            key = o.split("=", 1)[0].strip()
            if key in SET_BY_SWEEP:
                raise ConfigError(f"overrides entry {o!r} is not allowed: {key} is set by the "
                                  f"sweep ({SET_BY_SWEEP[key]})")
            if key in params:
                raise ConfigError(f"overrides entry {o!r} is not allowed: {key} is also a "
                                  "search space parameter; fix it or search it, not both")

    def _check_parameters(self) -> None:
        if not self.space:
            raise ConfigError("space is empty: give at least one parameter to search")
        choices = [p for p, d in self.space.items() if d.kind == "choice"]
        seen: dict[str, tuple[str, Distribution]] = {}
        for c, branches in self.conditional.items():
            parent = self.space.get(c)
            if parent is None or parent.kind != "choice":
                raise ConfigError(
                    f"conditional key {c} is not allowed: branches hang off a choice parameter "
                    f"of space (its choice parameters: {', '.join(choices) or 'none'})")
            for value, params in branches.items():
                if not parent.contains(value):
                    raise ConfigError(
                        f"conditional.{c}: branch {value!r} is not allowed: it is not one of "
                        f"{c}'s choices {list(parent.values or ())}")
                for p, d in params.items():
                    where = f"conditional.{c}.{value}"
                    if p in self.space:
                        raise ConfigError(f"search space parameter {p} is not allowed both in "
                                          f"space and in {where}: keep one")
                    if p in seen and seen[p][1] != d:
                        raise ConfigError(f"search space parameter {p} has different "
                                          f"distributions in {seen[p][0]} and {where}: give "
                                          "both branches the same one")
                    seen.setdefault(p, (where, d))
        for p in self.parameters():
            parts = p.split(".")
            if not all(parts) or any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x)
                                     for x in parts):
                raise ConfigError(f"search space parameter {p!r} is not allowed: give a dotted "
                                  "config path such as loss.tau")
            if p in SET_BY_SWEEP:
                raise ConfigError(f"search space parameter {p} is not allowed: it is set by "
                                  f"the sweep ({SET_BY_SWEEP[p]})")

    def parameters(self) -> dict[str, Distribution]:
        """Every parameter (unconditional and of every branch) by path."""
        out = dict(self.space)
        for branches in self.conditional.values():
            for params in branches.values():
                out.update(params)
        return out

    def branches(self) -> list[tuple[dict[str, Any], dict[str, Distribution]]]:
        """The parameter sets one trial can have: for every combination of values of the
        conditional choices, ``(those values, the other parameters)``. Without conditional
        parameters: one branch, ``({}, space)``."""
        out: list[tuple[dict[str, Any], dict[str, Distribution]]] = [({}, {})]
        for c, branches in self.conditional.items():
            out = [({**fixed, c: v}, {**params, **branches.get(v, {})})
                   for fixed, params in out for v in self.space[c].ends()]
        return [(fixed, {**{p: d for p, d in self.space.items() if p not in fixed}, **params})
                for fixed, params in out]

    def validate(self) -> None:
        """Check every parameter path and range end against the base config, per branch, and
        the scheduler against the trials' epochs. Raises :class:`ConfigError`."""
        if not self.base_path.is_file():
            raise ConfigError(f"base={str(self.base_path)!r} is not allowed: no such file")
        if self.searcher.name == "cmaes":
            _require_cmaes()
        raw = load_yaml(self.base_path)
        epochs: list[int] = []
        for fixed, params in self.branches():
            for combo in _corners(params):
                values = {**fixed, **combo}
                cfg = self._build(raw, values, fixed)
                self._check_built(cfg, values, fixed)
                epochs.append(cfg.train.epochs)
        s = self.scheduler
        if s.name == "asha":
            if s.max_epochs is not None and s.max_epochs > min(epochs):
                raise ConfigError(f"scheduler.max_epochs={s.max_epochs} is not allowed: it "
                                  f"must be <= the trials' train.epochs={min(epochs)}")
            if s.grace_period > (s.max_epochs or min(epochs)):
                raise ConfigError(f"scheduler.grace_period={s.grace_period} is not allowed: it "
                                  f"must be <= max_epochs={s.max_epochs or min(epochs)}")

    def _build(self, raw: Mapping[str, Any], values: Mapping[str, Any],
               fixed: Mapping[str, Any]) -> PretrainConfig:
        """One trial's config at ``values``; a ConfigError names the sweep parameter(s)."""
        overrides = _all_overrides(self, values, name="trial", storage="validate")
        try:
            return from_dict(PretrainConfig, apply_overrides(raw, overrides))
        except ConfigError as e:
            error = e
        branch = _describe_branch(fixed)
        try:  # is it the base config with the sweep's own overrides?
            from_dict(PretrainConfig, apply_overrides(
                raw, _all_overrides(self, {}, name="trial", storage="validate")))
        except ConfigError as e:
            raise ConfigError(f"base {self.base_path} with the sweep's overrides "
                              f"{list(self.overrides)}: {e}") from None
        named = _named_in(str(error), values) or list(values)
        # Context: the culprits' values, then the choices this corner made.
        dists = self.parameters()
        shown = [*named, *(p for p in values if p not in named and p not in fixed
                           and dists[p].kind == "choice")]
        what = "parameter" if len(named) == 1 else "parameters"
        raise ConfigError(f"search space {what} {', '.join(named)}: {error} (with "
                          f"{_settings(values, shown)}{branch}; base {self.base_path})") from None

    def _check_built(self, cfg: PretrainConfig, values: Mapping[str, Any],
                     fixed: Mapping[str, Any]) -> None:
        """Cross-field checks the config dataclasses leave to the sweep."""
        loss = cfg.loss
        if isinstance(loss, CoNeConfig) and loss.top_n > loss.bank_size:
            keys = [p for p in ("loss.top_n", "loss.bank_size") if p in values]
            what = (f"search space parameter {' / '.join(keys)}" if keys
                    else f"base {self.base_path} with the sweep's overrides")
            settings = f"with {_settings(values, keys)}" if keys else "as given"
            raise ConfigError(f"{what}: loss.top_n={loss.top_n} is not allowed above "
                              f"loss.bank_size={loss.bank_size}: the top-N neighbours come from "
                              f"the bank ({settings}{_describe_branch(fixed)})")
        if self.metric == "knn_top1" and cfg.knn.every_epochs == 0:
            raise ConfigError("metric='knn_top1' needs knn.every_epochs >= 1 in the base config "
                              f"or the sweep's overrides, got 0 (base {self.base_path})")


def _describe_branch(fixed: Mapping[str, Any]) -> str:
    return "".join(f", in the branch {c}={v!r}" for c, v in fixed.items())


def _settings(values: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={values[k]!r}" for k in keys)


def _named_in(message: str, values: Mapping[str, Any]) -> list[str]:
    """The parameters whose path (or a leading part of it, for an unknown section) the
    config error names as a whole dotted key."""
    out = []
    for p in values:
        parts = p.split(".")
        for i in range(len(parts), 0, -1):
            key = re.escape(".".join(parts[:i]))
            if re.search(rf"(?<![\w.]){key}(?![\w.])", message):
                out.append(p)
                break
    return out


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


def _require_cmaes() -> None:
    try:
        import cmaes  # noqa: F401
    except ImportError:
        raise ConfigError("searcher.name='cmaes' needs the Python package `cmaes`, which is "
                          "not installed: pip install cmaes, or choose searcher.name tpe or "
                          "random") from None


# ---------------------------------------------------------------------------------------------
# Loading.


def _check_sweep_override(item: str) -> None:
    key = item.split("=", 1)[0].strip()
    top, _, rest = key.partition(".")
    if top in OVERRIDABLE_SECTIONS or (top in OVERRIDABLE_KEYS and not rest):
        return
    allowed = ", ".join([*OVERRIDABLE_KEYS, *(f"{s}.*" for s in OVERRIDABLE_SECTIONS)])
    raise ConfigError(f"override {item!r} is not allowed: a sweep's command line may set "
                      f"{allowed} (edit the file for base, space and conditional)")


def _parse_params(where: str, data: Any) -> dict[str, Distribution]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}={data!r} is not allowed: map config paths to "
                          "distributions, e.g. {loss.tau: {loguniform: [0.05, 0.5]}}")
    out = {}
    for p, spec in data.items():
        if not isinstance(p, str):
            raise ConfigError(f"{where}: parameter {p!r} is not allowed: give a dotted config "
                              "path such as loss.tau")
        out[p] = Distribution.parse(p, spec)
    return out


def _parse_conditional(data: Mapping[str, Any]) -> dict[str, dict[Any, dict[str, Distribution]]]:
    out: dict[str, dict[Any, dict[str, Distribution]]] = {}
    for c, branches in data.items():
        if not isinstance(branches, Mapping):
            raise ConfigError(f"conditional.{c}={branches!r} is not allowed: map each value of "
                              f"the choice {c} to its parameters")
        out[str(c)] = {v: _parse_params(f"conditional.{c}.{v}", params or {})
                       for v, params in branches.items()}
    return out


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> SweepConfig:
    """Load a sweep file, apply ``overrides`` of its own keys (``num_samples=4``,
    ``searcher.seed=1``, ``overrides=[train.epochs=2]``; see ``OVERRIDABLE_KEYS``) and validate
    everything, including each parameter path against the base config, per branch.

    Raises:
        ConfigError: prefixed with ``path``, naming the key or parameter and what is allowed.
    """
    path = Path(path)
    data = load_yaml(path)  # its errors name the file already
    try:
        for item in overrides:
            _check_sweep_override(item)
        raw = apply_overrides(data, overrides)
        unknown = [k for k in raw if k not in FILE_KEYS]
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]}; allowed keys: {', '.join(FILE_KEYS)}")
        for key in ("name", "base", "space"):
            if key not in raw:
                raise ConfigError(f"the sweep needs {key!r}")
        for key in ("overrides", "conditional", "resources", "searcher", "scheduler",
                    "statistic", "confirm"):
            if raw.get(key) is None:
                raw.pop(key, None)
        if raw.get("study_storage") == "":
            raw["study_storage"] = None
        spec = from_dict(_SweepFile, raw)
        cfg = SweepConfig(
            name=spec.name, base_path=(path.parent / spec.base).resolve(),
            space=_parse_params("space", spec.space),
            conditional=_parse_conditional(spec.conditional),
            overrides=tuple(spec.overrides), **{k: getattr(spec, k) for k in SETTINGS},
        )
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg


# ---------------------------------------------------------------------------------------------
# What a resumed sweep must match.

SWEEP_RECORD = "sweep_started.json"  # in the sweep dir, written when the sweep starts


def sweep_identity(path: str | Path, sweep: SweepConfig,
                   overrides: Sequence[str]) -> dict[str, Any]:
    """What defines the experiment a sweep runs: its file and base config as parsed (comments
    and layout do not count; the same files moved elsewhere do not either) and the
    command-line overrides. Stored as :data:`SWEEP_RECORD` when the sweep starts."""
    return {"sweep_file": str(Path(path).resolve()), "sweep": load_yaml(path),
            "base_file": str(sweep.base_path), "base": load_yaml(sweep.base_path),
            "overrides": list(overrides)}


def identity_changes(started: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed between two :func:`sweep_identity` values, in words (empty: nothing)."""
    out = []
    for part, what in (("sweep", "sweep file"), ("base", "base config")):
        a, b = flatten(started.get(part) or {}), flatten(now.get(part) or {})
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)
                      # the confirmation stage runs after the search: not part of it
                      and not (part == "sweep" and k.split(".")[0] == "confirm"))
        if keys:
            more = f" and {len(keys) - 6} more" if len(keys) > 6 else ""
            out.append(f"{what} {now[part + '_file']}: {', '.join(keys[:6])}{more}")
    if list(started.get("overrides") or []) != list(now.get("overrides") or []):
        out.append(f"command-line overrides: {started.get('overrides')} then, "
                   f"{now.get('overrides')} now")
    return out


# ---------------------------------------------------------------------------------------------
# Optuna and trials.


class DefineByRun:
    """Optuna define-by-run space: the parameters of ``space`` (named by config path), then,
    for each conditional choice, the parameters of the chosen value's branch. Returns None
    (Ray's OptunaSearch contract: constants or None). A class, not a closure, so that Tune can
    pickle the searcher into the sweep's state for resuming."""

    def __init__(self, cfg: SweepConfig) -> None:
        self.cfg = cfg

    def __call__(self, trial: optuna.trial.BaseTrial) -> dict[str, Any] | None:
        chosen = {p: d.suggest(trial, p) for p, d in self.cfg.space.items()}
        for c, branches in self.cfg.conditional.items():
            for p, d in branches.get(chosen[c], {}).items():
                d.suggest(trial, p)
        return None


def define_by_run(cfg: SweepConfig) -> Callable[[optuna.trial.BaseTrial], dict[str, Any] | None]:
    """The sweep's space as an Optuna define-by-run function (for ``OptunaSearch(space=...)``)."""
    return DefineByRun(cfg)


def optuna_distributions(cfg: SweepConfig) -> dict[str, optuna.distributions.BaseDistribution]:
    """Optuna distribution objects of every parameter, by path (to rebuild a study)."""
    return {p: d.to_optuna() for p, d in cfg.parameters().items()}


def _plain_string(text: str) -> bool:
    try:
        return bool(text) and text == text.strip() and yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


def format_value(value: Any) -> str:
    """``value`` as override text that ``yaml.safe_load`` reads back as the same value and type
    (floats via repr, always with a '.' so YAML 1.1 does not read ``1e-05`` as a string)."""
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        value = value.item()
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:
            text = f"{mantissa}.0e{exponent}"
    elif isinstance(value, str):
        text = value if _plain_string(value) else json.dumps(value)
    else:
        raise ConfigError(f"value {value!r} is not allowed in an override: give a string, "
                          "number, boolean or null")
    back = yaml.safe_load(text)
    if back != value or type(back) is not type(value):
        raise ConfigError(f"value {value!r} does not survive YAML as {text!r}")
    return text


def trial_overrides(cfg: SweepConfig, params: Mapping[str, Any]) -> list[str]:
    """The dotted overrides of one trial: the sweep's ``overrides``, then ``loss.name`` (it
    resets the loss section when it switches the loss), then the other parameters by path."""
    first = sorted(p for p in params if p in {f"{s}.name" for s in TAGGED_SECTIONS})
    rest = sorted(p for p in params if p not in first)
    return [*cfg.overrides, *(f"{p}={format_value(params[p])}" for p in [*first, *rest])]


def _all_overrides(cfg: SweepConfig, params: Mapping[str, Any], name: str,
                   storage: str) -> list[str]:
    r = cfg.resources
    scaling = [f"scaling.num_workers={r.workers}",
               f"scaling.cpus_per_worker={format_value(float(r.cpus_per_worker))}",
               f"scaling.use_gpu={format_value(r.gpus_per_worker > 0)}"]
    if r.gpus_per_worker > 0:  # scaling.gpus_per_worker must be > 0; unused without GPUs
        scaling.append(f"scaling.gpus_per_worker={format_value(float(r.gpus_per_worker))}")
    return [*trial_overrides(cfg, params), f"name={format_value(name)}",
            f"storage={format_value(storage)}", *scaling]


REPEAT_INDEX = "__trial_index__"  # Tune's Repeater puts a setting's repeat number here


def setting_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's parameters without Tune's repeat index: what its setting is."""
    return {k: v for k, v in params.items() if k != REPEAT_INDEX}


def trial_config(cfg: SweepConfig, params: Mapping[str, Any], name: str,
                 storage: str) -> PretrainConfig:
    """The pretrain config of one trial: base + :func:`trial_overrides` + ``name`` +
    ``storage`` + the sweep's ``resources`` as ``scaling.*``; the ``r``-th repeat of a
    setting (``repeats``) trains with ``train.seed + r``."""
    out = load_config(cfg.base_path, PretrainConfig,
                      _all_overrides(cfg, setting_of(params), name=name, storage=storage))
    index = int(params.get(REPEAT_INDEX, 0) or 0)
    if index:
        out = dataclasses.replace(out, train=dataclasses.replace(
            out.train, seed=out.train.seed + index))
    return out


def make_sampler(cfg: SweepConfig) -> optuna.samplers.BaseSampler:
    """The Optuna sampler the sweep's ``searcher`` names, seeded.

    Raises:
        ConfigError: CMA-ES without the ``cmaes`` package installed.
    """
    import optuna

    s = cfg.searcher
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "cmaes":
        _require_cmaes()
        return optuna.samplers.CmaEsSampler(seed=s.seed, n_startup_trials=s.startup_trials)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.startup_trials)
