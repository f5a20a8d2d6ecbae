"""Sweep definitions (``search_spaces/*.yaml``): load, validate against the config dataclasses,
and turn into an Optuna define-by-run space.

Format::

    name: xclr-temperature            # sweep dir = storage/name
    storage: runs/sweeps
    base: ../pipelines/configs/pretrain/demo.yaml   # a pretrain config, relative to this file
    overrides: [loss.name=xclr]       # applied to base for every trial, before the parameters
    metric: knn_top1                  # a metric pretraining reports every epoch
    mode: max                         # max | min
    num_samples: 16                   # trials
    max_concurrent: 1                 # trials at a time
    resources: {workers: 1, cpus_per_worker: 1.0, gpus_per_worker: 0.0}   # per trial
    searcher: {name: tpe, seed: 0, startup_trials: 4}                       # tpe | random | cmaes
    scheduler: {name: asha, grace_period: 1, reduction_factor: 2, max_epochs: null}  # or fifo
    study_storage: null               # "sqlite:///study.db" or "journal:study.log" (optional)
    space:                            # unconditional parameters, keyed by config path
      loss.tau: {loguniform: [0.05, 0.5]}
      loss.name: {choice: [simclr, xclr]}
    conditional:                      # parameters only for one value of a choice parameter
      loss.name:
        xclr: {loss.tau_s: {loguniform: [0.01, 1.0]}}

Distributions: ``{uniform: [lo, hi]}``, ``{loguniform: [lo, hi]}``, ``{int: [lo, hi]}`` (add
``log: true`` for a log scale), ``{choice: [v, ...]}``. Grid entries are refused (Optuna does
not grid-search; use ``choice``), as are empty or inverted ranges, log ranges touching 0 and
temperatures ≤ 0. Every parameter path is checked, per conditional branch, by building real
:class:`~components.config.PretrainConfig` objects at the range ends, so an unknown key or an
out-of-range value fails before any trial starts, naming the path and the allowed keys.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from components.config import (
    ConfigError,
    PretrainConfig,
    apply_overrides,
    check_at_least,
    check_positive,
    load_config,
    load_yaml,
)

KINDS = ("uniform", "loguniform", "int", "choice")
TEMPERATURES = ("tau", "tau_s", "tau_sup", "tau_dc", "temperature")
METRICS = ("knn_top1", "loss", "lr", "samples_per_s", "data_wait", "anchors_without_positive")
# Keys of the sweep file a command-line override may set.
OVERRIDABLE = ("name", "storage", "metric", "mode", "num_samples", "max_concurrent",
               "resources", "searcher", "scheduler", "study_storage", "overrides")


@dataclasses.dataclass(frozen=True)
class Distribution:
    kind: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    values: tuple[Any, ...] | None = None
    log: bool = False

    def ends(self) -> list[Any]:
        """The values validation tries: both range ends, or every choice."""
        if self.kind == "choice":
            return list(self.values or ())
        if self.kind == "int":
            return [int(self.low or 0), int(self.high or 0)]
        return [self.low, self.high]


@dataclasses.dataclass(frozen=True)
class Resources:
    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    def __post_init__(self) -> None:
        check_at_least("resources.workers", self.workers, 1)
        check_positive("resources.cpus_per_worker", self.cpus_per_worker)
        if self.gpus_per_worker < 0:
            raise ConfigError(f"resources.gpus_per_worker={self.gpus_per_worker} must be >= 0")


@dataclasses.dataclass(frozen=True)
class Searcher:
    name: Literal["tpe", "random", "cmaes"] = "tpe"
    seed: int = 0
    startup_trials: int = 4

    def __post_init__(self) -> None:
        if self.name not in ("tpe", "random", "cmaes"):
            raise ConfigError(f"searcher.name={self.name!r}: choose tpe, random or cmaes")
        check_at_least("searcher.startup_trials", self.startup_trials, 0)


@dataclasses.dataclass(frozen=True)
class Scheduler:
    name: Literal["asha", "fifo"] = "asha"
    grace_period: int = 1
    reduction_factor: int = 2
    max_epochs: int | None = None  # None = the base config's train.epochs

    def __post_init__(self) -> None:
        if self.name not in ("asha", "fifo"):
            raise ConfigError(f"scheduler.name={self.name!r}: choose asha or fifo")
        check_at_least("scheduler.grace_period", self.grace_period, 1)
        check_at_least("scheduler.reduction_factor", self.reduction_factor, 2)


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    name: str
    base_path: Path
    space: dict[str, Distribution]
    conditional: dict[str, dict[Any, dict[str, Distribution]]]
    storage: str = "runs/sweeps"
    overrides: tuple[str, ...] = ()
    metric: str = "knn_top1"
    mode: Literal["max", "min"] = "max"
    num_samples: int = 8
    max_concurrent: int = 1
    resources: Resources = dataclasses.field(default_factory=Resources)
    searcher: Searcher = dataclasses.field(default_factory=Searcher)
    scheduler: Scheduler = dataclasses.field(default_factory=Scheduler)
    study_storage: str | None = None

    def parameters(self) -> dict[str, Distribution]:
        """Every parameter (unconditional and per branch) by path."""
        out = dict(self.space)
        for branches in self.conditional.values():
            for params in branches.values():
                out.update(params)
        return out


def _distribution(path: str, spec: Any) -> Distribution:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"search space parameter {path}: give a mapping like "
                          f"{{loguniform: [0.01, 1.0]}}, got {spec!r}")
    if "grid" in spec or "grid_search" in spec:
        raise ConfigError(f"search space parameter {path}: Optuna does not do grid search; "
                          "use {choice: [...]} instead")
    kinds = [k for k in spec if k in KINDS]
    extra = [k for k in spec if k not in KINDS and k != "log"]
    if len(kinds) != 1 or extra:
        raise ConfigError(f"search space parameter {path}: {dict(spec)!r} must have exactly one "
                          f"of {', '.join(KINDS)} (and optionally log: true for int)")
    kind, arg = kinds[0], spec[kinds[0]]
    if kind == "choice":
        if not isinstance(arg, list) or not arg:
            raise ConfigError(f"search space parameter {path}: choice needs a non-empty list")
        return Distribution("choice", values=tuple(arg))
    if (not isinstance(arg, list) or len(arg) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in arg)):
        raise ConfigError(f"search space parameter {path}: {kind} needs [low, high], got {arg!r}")
    low, high = arg
    if not low < high:
        raise ConfigError(f"search space parameter {path}: empty range [{low}, {high}] "
                          "(low must be < high)")
    log = kind == "loguniform" or bool(spec.get("log", False))
    if log and low <= 0:
        raise ConfigError(f"search space parameter {path}: log range [{low}, {high}] touches 0; "
                          "a log scale needs low > 0")
    if path.rsplit(".", 1)[-1] in TEMPERATURES and low <= 0:
        raise ConfigError(f"search space parameter {path}: temperatures must be > 0, the range "
                          f"starts at {low}")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise ConfigError(f"search space parameter {path}: int range needs integers")
    return Distribution(kind, low=low, high=high, log=log)  # type: ignore[arg-type]


def _params(where: str, data: Any) -> dict[str, Distribution]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must map config paths to distributions, got {data!r}")
    return {str(p): _distribution(str(p), spec) for p, spec in data.items()}


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> SweepConfig:
    """Load and fully validate a sweep file (see the module docstring).

    Raises:
        ConfigError: naming the key or parameter path and what is allowed.
    """
    path = Path(path)
    raw = load_yaml(path)
    for o in overrides:
        key = o.split("=", 1)[0].strip().split(".", 1)[0]
        if key not in OVERRIDABLE:
            raise ConfigError(f"{path}: override {o!r}: only {', '.join(OVERRIDABLE)} may be "
                              "overridden on the command line")
    raw = apply_overrides(raw, overrides)
    allowed = {"name", "storage", "base", "overrides", "metric", "mode", "num_samples",
               "max_concurrent", "resources", "searcher", "scheduler", "study_storage",
               "space", "conditional"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]}; allowed keys: "
                          f"{', '.join(sorted(allowed))}")
    for key in ("name", "base", "space"):
        if key not in raw:
            raise ConfigError(f"{path}: the sweep needs {key!r}")
    try:
        space = _params("space", raw["space"])
        conditional: dict[str, dict[Any, dict[str, Distribution]]] = {}
        for choice_path, branches in (raw.get("conditional") or {}).items():
            parent = space.get(choice_path)
            if parent is None or parent.kind != "choice":
                raise ConfigError(f"conditional key {choice_path} must be a choice parameter "
                                  "of space")
            if not isinstance(branches, Mapping):
                raise ConfigError(f"conditional.{choice_path} must map choice values to "
                                  "parameters")
            conditional[choice_path] = {}
            for value, params in branches.items():
                if value not in (parent.values or ()):
                    raise ConfigError(f"conditional.{choice_path}: {value!r} is not one of its "
                                      f"choices {list(parent.values or ())}")
                conditional[choice_path][value] = _params(
                    f"conditional.{choice_path}.{value}", params)
        seen: dict[str, Distribution] = {}
        for branches in conditional.values():
            for params in branches.values():
                for p, d in params.items():
                    if p in space:
                        raise ConfigError(f"search space parameter {p} is both unconditional "
                                          "and in a conditional branch")
                    if p in seen and seen[p] != d:
                        raise ConfigError(f"search space parameter {p} has different "
                                          "distributions in two branches")
                    seen[p] = d
        cfg = SweepConfig(
            name=str(raw["name"]), base_path=(path.parent / str(raw["base"])).resolve(),
            space=space, conditional=conditional,
            storage=str(raw.get("storage", "runs/sweeps")),
            overrides=tuple(str(o) for o in raw.get("overrides") or ()),
            metric=str(raw.get("metric", "knn_top1")), mode=raw.get("mode", "max"),
            num_samples=int(raw.get("num_samples", 8)),
            max_concurrent=int(raw.get("max_concurrent", 1)),
            resources=Resources(**(raw.get("resources") or {})),
            searcher=Searcher(**(raw.get("searcher") or {})),
            scheduler=Scheduler(**(raw.get("scheduler") or {})),
            study_storage=raw.get("study_storage"),
        )
    except TypeError as e:  # an unknown key in resources / searcher / scheduler
        raise ConfigError(f"{path}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    _validate(cfg, path)
    return cfg


def _validate(cfg: SweepConfig, path: Path) -> None:
    if not cfg.name or "/" in cfg.name:
        raise ConfigError(f"{path}: name={cfg.name!r} must be a non-empty name without '/'")
    if cfg.mode not in ("max", "min"):
        raise ConfigError(f"{path}: mode={cfg.mode!r}: choose max or min")
    if cfg.metric not in METRICS and not cfg.metric.startswith("loss_"):
        raise ConfigError(f"{path}: metric={cfg.metric!r} is not reported by pretraining; "
                          f"choose one of {', '.join(METRICS)}")
    if cfg.num_samples < 1 or cfg.max_concurrent < 1:
        raise ConfigError(f"{path}: num_samples and max_concurrent must be >= 1")
    if cfg.study_storage and not cfg.study_storage.startswith(("sqlite:///", "journal:")):
        raise ConfigError(f"{path}: study_storage={cfg.study_storage!r}: give "
                          "sqlite:///<file> or journal:<file>")
    if not cfg.base_path.exists():
        raise ConfigError(f"{path}: base {cfg.base_path} does not exist")
    epochs = None
    for params in _branches(cfg):
        for combo in itertools.product(*[[(p, v) for v in d.ends()] for p, d in params.items()]):
            try:
                pc = trial_config(cfg, dict(combo), name="validate", storage="/tmp")
            except ConfigError as e:
                names = ", ".join(p for p, _ in combo) or "base"
                raise ConfigError(f"{path}: search space parameter(s) {names}: {e}") from None
            epochs = pc.train.epochs
            if cfg.metric == "knn_top1" and pc.knn.every_epochs == 0:
                raise ConfigError(f"{path}: metric knn_top1 needs knn.every_epochs >= 1 in the "
                                  "base config or overrides")
    s = cfg.scheduler
    if epochs is not None and s.max_epochs is not None and s.max_epochs > epochs:
        raise ConfigError(f"{path}: scheduler.max_epochs={s.max_epochs} exceeds the trials' "
                          f"train.epochs={epochs}")
    if epochs is not None and s.grace_period > (s.max_epochs or epochs):
        raise ConfigError(f"{path}: scheduler.grace_period={s.grace_period} exceeds "
                          f"max_epochs={s.max_epochs or epochs}")


def _branches(cfg: SweepConfig) -> list[dict[str, Distribution]]:
    """The parameter sets one trial can have: the unconditional space, with each choice that
    has branches fixed to each of its values plus that value's parameters."""
    combos: list[dict[str, Distribution]] = [dict(cfg.space)]
    for choice_path, branches in cfg.conditional.items():
        parent = cfg.space[choice_path]
        new = []
        for base in combos:
            for value in parent.values or ():
                d = dict(base)
                d[choice_path] = Distribution("choice", values=(value,))
                d.update(branches.get(value, {}))
                new.append(d)
        combos = new
    return combos


def _suggest(trial: Any, path: str, d: Distribution) -> Any:
    if d.kind == "choice":
        return trial.suggest_categorical(path, list(d.values or ()))
    if d.kind == "int":
        return trial.suggest_int(path, int(d.low or 0), int(d.high or 0), log=d.log)
    return trial.suggest_float(path, float(d.low or 0), float(d.high or 0), log=d.log)


class DefineByRun:
    """Optuna define-by-run space: the unconditional parameters (named by config path), then
    for each conditional choice the chosen value's parameters. A class, not a closure: Tune
    pickles the searcher (and with it this space) into the sweep's state for ``--resume``."""

    def __init__(self, cfg: SweepConfig) -> None:
        self.cfg = cfg

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        chosen = {p: _suggest(trial, p, d) for p, d in self.cfg.space.items()}
        for choice_path, branches in self.cfg.conditional.items():
            for p, d in branches.get(chosen[choice_path], {}).items():
                _suggest(trial, p, d)
        return None


def define_by_run(cfg: SweepConfig) -> Callable[[Any], dict[str, Any] | None]:
    return DefineByRun(cfg)


def optuna_distributions(cfg: SweepConfig) -> dict[str, Any]:
    """Optuna distribution objects by parameter path (for exporting a study)."""
    import optuna

    out: dict[str, Any] = {}
    for p, d in cfg.parameters().items():
        if d.kind == "choice":
            out[p] = optuna.distributions.CategoricalDistribution(list(d.values or ()))
        elif d.kind == "int":
            out[p] = optuna.distributions.IntDistribution(int(d.low or 0), int(d.high or 0),
                                                          log=d.log)
        else:
            out[p] = optuna.distributions.FloatDistribution(float(d.low or 0),
                                                            float(d.high or 0), log=d.log)
    return out


def _yaml_value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def trial_overrides(cfg: SweepConfig, params: Mapping[str, Any]) -> list[str]:
    """Dotted overrides for one trial: the sweep's, then ``loss.name`` (it resets the loss
    section), then the other parameters sorted by path."""
    out = list(cfg.overrides)
    if "loss.name" in params:
        out.append(f"loss.name={_yaml_value(params['loss.name'])}")
    out += [f"{p}={_yaml_value(v)}" for p, v in sorted(params.items()) if p != "loss.name"]
    return out


def trial_config(cfg: SweepConfig, params: Mapping[str, Any], name: str,
                 storage: str) -> PretrainConfig:
    """The pretrain config of one trial (base + overrides + parameters + resources)."""
    r = cfg.resources
    scaling = [f"scaling.num_workers={r.workers}", f"scaling.cpus_per_worker={r.cpus_per_worker}",
               f"scaling.use_gpu={'true' if r.gpus_per_worker > 0 else 'false'}"]
    if r.gpus_per_worker > 0:
        scaling.append(f"scaling.gpus_per_worker={r.gpus_per_worker}")
    return load_config(cfg.base_path, PretrainConfig,
                       # quoted: a trial id such as 79005078 must stay a string
                       [*trial_overrides(cfg, params), *scaling, f"name={json.dumps(name)}",
                        f"storage={json.dumps(storage)}"])


def make_sampler(cfg: SweepConfig) -> Any:
    import optuna

    s = cfg.searcher
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ConfigError("searcher.name=cmaes needs the `cmaes` package (pip install "
                              "cmaes); or use tpe / random") from None
        return optuna.samplers.CmaEsSampler(seed=s.seed, n_startup_trials=s.startup_trials)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.startup_trials)
