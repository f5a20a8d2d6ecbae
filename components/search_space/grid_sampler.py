"""Optuna's GridSampler as Ray Tune's ask-and-tell searcher can drive it (imported only when a
sweep's ``searcher.name`` is ``grid``: it imports Optuna)."""

from __future__ import annotations

from collections.abc import Sequence

import optuna


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its stop. ``GridSampler.after_trial`` calls ``study.stop()`` once
    the grid is used up, which raises outside ``study.optimize`` — Tune's ``OptunaSearch``
    tells each result with ``study.tell``, so the last grid point's result would fail the
    sweep. The sweep's ``num_samples`` (checked to equal the grid size) ends it instead."""

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: optuna.trial.TrialState, values: Sequence[float] | None) -> None:
        return None
