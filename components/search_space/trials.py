"""One trial's pretrain config from its sampled parameters, typed all the way: base config,
then the sweep's ``overrides`` (text, as the user wrote them), then the sampled values and what
the sweep sets (name, storage, ``resources`` as ``scaling.*``) as Python values
(:func:`components.config.set_values`), then :func:`components.config.from_dict` checks them
against the config dataclasses. No value goes through YAML text on the way."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from components.config import (
    TAGGED_SECTIONS,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    from_dict,
    load_yaml,
    set_values,
)

if TYPE_CHECKING:
    from components.search_space.sweep_file import SweepConfig

REPEAT_INDEX = "__trial_index__"  # Tune's Repeater puts a setting's repeat number here


def setting_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's parameters without Tune's repeat index: what its setting is."""
    return {k: v for k, v in params.items() if k != REPEAT_INDEX}


def plain_value(path: str, value: Any) -> Any:
    """``value`` as the plain Python scalar a config field takes: numpy scalars (Tune and
    Optuna may hand them out) become ``int`` / ``float`` / ``bool`` / ``str``.

    Raises:
        ConfigError: anything but a string, number, boolean or null.
    """
    if hasattr(value, "item") and type(value) not in (str, int, float, bool):
        value = value.item()  # numpy.str_ is a str, numpy.float64 a float: still converted
    if value is not None and not isinstance(value, str | int | float | bool):
        raise ConfigError(f"search space parameter {path}: value {value!r} is not allowed: "
                          "give a string, number, boolean or null")
    return value


def trial_values(cfg: SweepConfig, params: Mapping[str, Any], name: str,
                 storage: str) -> dict[str, Any]:
    """``{config path: value}`` of one trial, in the order they are applied: ``loss.name``
    first (switching the loss starts it from its own defaults), the other parameters sorted by
    path, then the run's ``name`` and ``storage`` and the sweep's ``resources`` as
    ``scaling.*`` (``use_gpu`` = ``gpus_per_worker > 0``)."""
    first = sorted(p for p in params if p in {f"{s}.name" for s in TAGGED_SECTIONS})
    rest = sorted(p for p in params if p not in first)
    out = {p: plain_value(p, params[p]) for p in [*first, *rest]}
    r = cfg.resources
    out.update({"name": name, "storage": storage, "scaling.num_workers": r.workers,
                "scaling.cpus_per_worker": float(r.cpus_per_worker),
                "scaling.use_gpu": r.gpus_per_worker > 0})
    if r.gpus_per_worker > 0:  # scaling.gpus_per_worker must be > 0; unused without GPUs
        out["scaling.gpus_per_worker"] = float(r.gpus_per_worker)
    return out


def trial_data(cfg: SweepConfig, base: Mapping[str, Any], params: Mapping[str, Any],
               name: str, storage: str) -> dict[str, Any]:
    """The config data of one trial: ``base`` (the parsed base config), the sweep's
    ``overrides``, then :func:`trial_values`; ready for ``from_dict(PretrainConfig, ...)``."""
    return set_values(apply_overrides(base, cfg.overrides),
                      trial_values(cfg, params, name=name, storage=storage))


def trial_config(cfg: SweepConfig, params: Mapping[str, Any], name: str,
                 storage: str) -> PretrainConfig:
    """The pretrain config of one trial (:func:`trial_data` of the base config); the ``r``-th
    repeat of a setting (``repeats``, Tune's :data:`REPEAT_INDEX`) trains with
    ``train.seed + r``.

    Raises:
        ConfigError: prefixed with the base config's path.
    """
    try:
        out = from_dict(PretrainConfig, trial_data(cfg, load_yaml(cfg.base_path),
                                                   setting_of(params), name, storage))
    except ConfigError as e:
        raise ConfigError(f"{cfg.base_path}: {e}") from None
    index = int(params.get(REPEAT_INDEX, 0) or 0)
    if index:
        out = dataclasses.replace(out, train=dataclasses.replace(
            out.train, seed=out.train.seed + index))
    return out
