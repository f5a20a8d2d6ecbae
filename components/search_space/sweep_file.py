"""The sweep file: its keys (:class:`SweepConfig`), loading with command-line overrides
(:func:`load_sweep`) and validation of every parameter against the base config, per branch
(the format is in :mod:`components.search_space`'s docstring)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from components.config import (
    CoNeConfig,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    check_at_least,
    check_wandb,
    from_dict,
    load_yaml,
)
from components.search_space.distributions import Distribution, _corners
from components.search_space.settings import (
    Confirm,
    Resources,
    Scheduler,
    Searcher,
    Statistic,
    _require_cmaes,
)
from components.search_space.trials import trial_data

# What pipelines/pretrain.py reports every epoch (plus any ``loss_*`` component;
# ``probe_top1`` with ``probe.every_epochs`` > 0).
REPORTED_METRICS = ("knn_top1", "loss", "lr", "samples_per_s", "data_wait",
                    "anchors_without_positive", "probe_top1")
# Top-1 accuracies on a held-out split (the online kNN's, the online linear probe's): each
# evaluation carries a binomial standard error ``<metric>_se`` and moves from epoch to epoch
# by the split's sampling noise; a larger value is better.
ACCURACY_METRICS = ("knn_top1", "probe_top1")
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
        wrong = {**dict.fromkeys(ACCURACY_METRICS, "min"), "loss": "max"}
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
        if self.searcher.name == "grid":
            self._check_grid()

    def _check_grid(self) -> None:
        """A grid is every combination of ``choice`` values, each run once."""
        if self.conditional:
            raise ConfigError("searcher.name=grid is not allowed with conditional parameters: "
                              "a grid has one set of parameters; give every parameter in space "
                              "(e.g. one sweep per loss)")
        ranges = [p for p, d in self.space.items() if d.kind != "choice"]
        if ranges:
            what = "is a range" if len(ranges) == 1 else "are ranges"
            raise ConfigError(f"searcher.name=grid needs a choice for every parameter: "
                              f"{', '.join(ranges)} {what}; list its grid values, e.g. "
                              "{choice: [0.05, 0.1, 0.2]}")
        sizes = [len(d.values or ()) for d in self.space.values()]
        points = math.prod(sizes)
        if self.num_samples != points:
            raise ConfigError(f"num_samples={self.num_samples} is not allowed with "
                              f"searcher.name=grid: the grid has {points} points "
                              f"({' x '.join(map(str, sizes))} choices); set num_samples: "
                              f"{points}")

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
        try:
            return from_dict(PretrainConfig, trial_data(self, raw, values, "trial", "validate"))
        except ConfigError as e:
            error = e
        branch = _describe_branch(fixed)
        try:  # is it the base config with the sweep's own overrides?
            from_dict(PretrainConfig, trial_data(self, raw, {}, "trial", "validate"))
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
        for metric, section in (("knn_top1", "knn"), ("probe_top1", "probe")):
            if self.metric == metric and getattr(cfg, section).every_epochs == 0:
                raise ConfigError(f"metric={metric!r} needs {section}.every_epochs >= 1 in the "
                                  f"base config or the sweep's overrides, got 0 (base "
                                  f"{self.base_path})")


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
