"""Sweep definitions (``search_spaces/*.yaml``): load, validate against the config dataclasses
before any trial starts, and turn into an Optuna define-by-run space for Ray Tune.

Format (every key but ``name``, ``base`` and ``space`` is optional; defaults shown)::

    name: xclr-temperature        # sweep name; the sweep dir is storage/name
    storage: runs/sweeps          # relative to the working directory, like pretrain's storage
    base: ../pipelines/configs/pretrain/demo.yaml   # a pretrain config, relative to this file
    overrides: [train.epochs=6]   # dotted overrides of base, for every trial, applied before
                                  # the sampled parameters (default [])
    metric: knn_top1              # reported per epoch by pretraining: knn_top1, probe_top1
                                  # (needs probe.every_epochs >= 1), loss, lr, samples_per_s,
                                  # data_wait, anchors_without_positive, loss_*
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
                                                          # `cmaes` package) | grid (every
                                  # combination of the space's choices once, in a seeded
                                  # order: all parameters choices, no conditional, num_samples
                                  # = the number of grid points)
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
                                  # (components/sweep/confirmation.py); `simgraph sweep FILE
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
base's other loss keys are dropped, see :func:`components.config.set_values`), then the
other parameters sorted by path, then the trial's name and storage and ``resources`` — the
sampled values as Python values on the config data, checked by the config dataclasses.

The package, by concern: :mod:`.distributions` (a parameter's distribution),
:mod:`.settings` (resources and their arithmetic, searcher, scheduler, trial score,
confirmation), :mod:`.sweep_file` (the file's keys, loading, validation per branch),
:mod:`.identity` (what a resume must match), :mod:`.optuna_adapter` (the define-by-run space
and sampler), :mod:`.trials` (one trial's config). Every public name is importable from
``components.search_space`` (Tune's pickled searcher state of sweeps started before the split
names classes there).
"""

from __future__ import annotations

from components.search_space.distributions import KINDS, MAX_CORNERS, Distribution
from components.search_space.identity import SWEEP_RECORD, identity_changes, sweep_identity
from components.search_space.optuna_adapter import (
    DefineByRun,
    define_by_run,
    make_sampler,
    optuna_distributions,
)
from components.search_space.settings import (
    SCORE,
    STATISTICS,
    Confirm,
    Resources,
    Scheduler,
    Searcher,
    Statistic,
    score_history,
    score_spec,
)
from components.search_space.sweep_file import (
    ACCURACY_METRICS,
    FILE_KEYS,
    OVERRIDABLE_KEYS,
    OVERRIDABLE_SECTIONS,
    REPORTED_METRICS,
    SET_BY_SWEEP,
    SETTINGS,
    SweepConfig,
    load_sweep,
)
from components.search_space.trials import (
    REPEAT_INDEX,
    plain_value,
    setting_of,
    trial_config,
    trial_data,
    trial_values,
)

__all__ = [
    "ACCURACY_METRICS", "FILE_KEYS", "KINDS", "MAX_CORNERS", "OVERRIDABLE_KEYS",
    "OVERRIDABLE_SECTIONS",
    "REPEAT_INDEX", "REPORTED_METRICS", "SCORE", "SETTINGS", "SET_BY_SWEEP", "STATISTICS",
    "SWEEP_RECORD", "Confirm", "DefineByRun", "Distribution", "Resources", "Scheduler",
    "Searcher", "Statistic", "SweepConfig", "define_by_run", "identity_changes", "load_sweep",
    "make_sampler", "optuna_distributions", "plain_value", "score_history", "score_spec",
    "setting_of", "sweep_identity", "trial_config", "trial_data", "trial_values",
]
