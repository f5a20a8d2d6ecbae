"""The sweep's space for Optuna through Ray Tune: the define-by-run function, the
distributions by path (to rebuild a study) and the seeded sampler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.search_space.settings import _require_cmaes

if TYPE_CHECKING:
    import optuna

    from components.search_space.sweep_file import SweepConfig


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


def make_sampler(cfg: SweepConfig) -> optuna.samplers.BaseSampler:
    """The Optuna sampler the sweep's ``searcher`` names, seeded.

    Raises:
        ConfigError: CMA-ES without the ``cmaes`` package installed.
    """
    import optuna

    s = cfg.searcher
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "grid":  # SweepConfig checked: every parameter a choice, no branches
        from components.search_space.grid_sampler import AskTellGridSampler

        return AskTellGridSampler({p: list(d.values or ()) for p, d in cfg.space.items()},
                                  seed=s.seed)
    if s.name == "cmaes":
        _require_cmaes()
        return optuna.samplers.CmaEsSampler(seed=s.seed, n_startup_trials=s.startup_trials)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.startup_trials)

