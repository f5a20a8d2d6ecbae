"""A sweep's Ray Tune wiring: the trial trainable (:func:`trial_fn`, run in a Tune trial
actor), the ``Tuner`` (:func:`make_tuner`: new, or restored for ``--resume``), its searcher
(Optuna behind a concurrency limit, :func:`make_searcher`), its scheduler (ASHA or FIFO,
:func:`make_scheduler`), how many trials run at once (:func:`concurrency`) and the base
config every trial starts from (:func:`base_config`).

:func:`trial_fn` is pickled by module path into a sweep dir's Tune state: sweeps started
before it moved here name ``pipelines.sweep.trial_fn``, which ``pipelines/sweep.py`` still
exposes. Ray and Tune are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from components.io.paths import base_dir, localize, portable, resolve_path
from components.runs.hosts import metric_first
from components.sweep.layout import SweepError, sweep_dir, trials_dir
from components.sweep.study import optuna_console
from components.training.tracking import prepare_sweep_trackers, tune_callbacks

if TYPE_CHECKING:
    from components.config import PretrainConfig
    from components.runs.run_dir import PreparedRun
    from components.search_space import SweepConfig

# How long a trial (or confirmation run) waits for its run dir's lock before it fails: the
# process of the same trial's earlier start may still be going (a driver killed and resumed
# at once, a restart on another node while Ray ends the old actor); the kernel releases its
# lock when it dies.
TRIAL_LOCK_WAIT_S = 60.0
TRIAL_LOCK_WAITING = ("another simgraph pretrain, run or sweep trial is training this trial's "
                      "run dir; stop it, then resume the sweep with --resume")


# ---------------------------------------------------------------------------------------------
# One trial (runs in a Tune trial actor).


def trial_fn(params: dict[str, Any], sweep_path: str, sweep_overrides: list[str],
             cwd: str) -> None:
    """Tune function trainable: pretrain one configuration; Train resumes it if it ran before.

    The trial's run dir has one writer: this process holds its lock
    (:func:`components.runs.run_dir.writing_run`) while the trial trains, so a ``simgraph
    pretrain`` pointed at it is refused. The lock goes when the trial ends, fails, or is
    stopped — Tune stops a function trainable (ASHA, a reused actor's next trial, the sweep's
    end) by ``sys.exit`` inside its ``report``, which unwinds this ``with`` — and with the
    process when it dies.
    """
    from ray import tune  # Ray: ~1 s to import, only where a trial runs

    from components.runs.run_dir import writing_run  # the data package: where a trial runs
    from components.search_space import load_sweep, trial_config  # YAML + configs: ~0.1 s

    sweep = load_sweep(localize(sweep_path), sweep_overrides)
    trial_id = tune.get_context().get_trial_id()
    # Relative paths mean what they meant where `simgraph sweep` was started (or
    # $SIMGRAPH_BASE_DIR): Tune runs each trial in its own working directory.
    cfg = trial_config(sweep, params, name=trial_id,
                       storage=trials_dir(sweep, cwd))
    with writing_run(cfg, base=cwd, command="sweep", wait_s=TRIAL_LOCK_WAIT_S,
                     waiting=TRIAL_LOCK_WAITING) as run:
        _train_trial(sweep, run)


def _train_trial(sweep: SweepConfig, run: PreparedRun) -> None:
    """:func:`trial_fn`'s training, under the trial's run dir lock: replay a finished trial's
    results, or train it (in this actor, or with its own Train worker group)."""
    from ray import tune  # Ray: ~1 s to import, only where a trial runs

    from components.runs.recipe import make_trainer, train_in_trial  # torch, in the trial
    from components.search_space import SCORE, score_history, score_spec  # ~0.1 s

    score = score_spec(sweep)
    cfg, facts, run_dir, history = run.cfg, run.facts, run.run_dir, run.finished
    if history is not None:
        # Trained to the end before the sweep driver died, but Tune never recorded it: replay
        # its per-epoch results instead of training again.
        for row, value in zip(history, score_history(history, score), strict=True):
            tune.report(metric_first({**row, **({} if value is None else {SCORE: value})},
                                     sweep.metric))
        return
    if sweep.resources.in_trial:
        train_in_trial(cfg, run_dir, facts, sweep.metric, score=score)
        return
    from ray.tune.integration.ray_train import TuneReportCallback  # Ray Train: ~1 s to import

    class Report(TuneReportCallback):  # type: ignore[misc]
        """Tune's callback, with the sweep's metric and the epoch first in every result: Tune's
        trial table shows the first four metrics of a result (else epoch, step, anchors)."""

        def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                         checkpoint: Any) -> None:
            super().after_report(run_context, [metric_first(m, sweep.metric) for m in metrics],
                                 checkpoint)

    make_trainer(cfg, run_dir, facts, callbacks=[Report()], score=score).fit()


# ---------------------------------------------------------------------------------------------
# The driver's Tuner.


def make_tuner(sweep: SweepConfig, sweep_path: str, sweep_overrides: Sequence[str],
               resume: bool) -> Any:
    import ray.tune  # Ray Tune: ~1 s to import, only once the sweep starts

    from components.io.storage import display, list_dir  # pyarrow
    from components.sweep.tune_loggers import use_deferred_tensorboard  # imports Ray Tune

    # In-trial: the actor holds the worker's CPUs/GPUs. Otherwise it only drives its
    # TorchTrainer, whose workers reserve their own.
    trainable = ray.tune.with_resources(
        ray.tune.with_parameters(trial_fn, sweep_path=portable(sweep_path),
                                 sweep_overrides=list(sweep_overrides), cwd=str(base_dir())),
        sweep.resources.trial_resources(),
    )
    path = sweep_dir(sweep)
    prepare_sweep_trackers(sweep)
    use_deferred_tensorboard()
    if resume:
        if not ray.tune.Tuner.can_restore(path):
            raise SweepError(f"nothing to resume in {display(path)}: start the sweep without "
                             "--resume")
        return ray.tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    if list_dir(path):
        raise SweepError(f"{display(path)} already holds a sweep: add --resume to continue it, "
                         "or set name= to start another")
    searcher = make_searcher(sweep)
    scheduler = make_scheduler(sweep)
    in_trial = sweep.resources.in_trial
    return ray.tune.Tuner(
        trainable,
        # In-trial: the next trial reuses the actor (its imports, FFCV's compiled code); a
        # failed trial is re-run by Tune (it resumes from its run dir) as Ray Train would.
        tune_config=ray.tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                        num_samples=sweep.num_samples * sweep.repeats,
                                        reuse_actors=in_trial),
        run_config=ray.tune.RunConfig(
            name=sweep.name, storage_path=resolve_path(sweep.storage), verbose=1,
            callbacks=tune_callbacks(sweep, path),
            failure_config=ray.tune.FailureConfig(
                max_failures=base_config(sweep).scaling.max_failures if in_trial else 0),
        ),
    )


def make_searcher(sweep: SweepConfig) -> Any:
    """Tune's searcher: Optuna over the sweep's space (define-by-run, the sweep's sampler)
    behind Tune's concurrency limit. It optimises the trial's score (sweep.statistic of its
    metric so far), not one noisy evaluation; with repeats, Tune's Repeater trains each
    suggestion with that many seeds and hands the searcher their mean."""
    from ray.tune.search import ConcurrencyLimiter  # Ray Tune: ~1 s to import
    from ray.tune.search.optuna import OptunaSearch

    from components.search_space import SCORE, define_by_run, make_sampler  # ~0.1 s

    with optuna_console():  # OptunaSearch creates its study here: Optuna's INFO line
        optuna_search: Any = OptunaSearch(space=define_by_run(sweep), metric=SCORE,
                                          mode=sweep.mode, sampler=make_sampler(sweep))
    if sweep.repeats > 1:
        from ray.tune.search import Repeater

        optuna_search = Repeater(optuna_search, repeat=sweep.repeats, set_index=True)
    return ConcurrencyLimiter(optuna_search, max_concurrent=concurrency(sweep))


def make_scheduler(sweep: SweepConfig) -> Any:
    """Tune's scheduler: ASHA on the trial's score with the reported ``epoch`` as its time
    (``max_t`` = ``scheduler.max_epochs`` or the trials' ``train.epochs``), or FIFO."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler  # Ray Tune: ~1 s to import

    from components.search_space import SCORE  # ~0.1 s

    s = sweep.scheduler
    if s.name == "asha":
        return ASHAScheduler(time_attr="epoch", metric=SCORE, mode=sweep.mode,
                             max_t=s.max_epochs or _base_epochs(sweep),
                             grace_period=s.grace_period, reduction_factor=s.reduction_factor)
    return FIFOScheduler()


def concurrency(sweep: SweepConfig, cluster: dict[str, float] | None = None) -> int:
    """``max_concurrent``; ``auto``: as many trials as ``cluster`` (default: the running Ray
    cluster's resources now) holds, at most ``num_samples``, so no CPU idles while trials
    wait."""
    if sweep.max_concurrent != "auto":
        return int(sweep.max_concurrent)
    if cluster is None:
        import ray  # Ray: only when asked about the running cluster

        cluster = ray.cluster_resources()
    return min(sweep.resources.trials_that_fit(cluster), sweep.num_samples * sweep.repeats)


def base_config(sweep: SweepConfig) -> PretrainConfig:
    """The pretrain config a trial with no sampled values would get: what every trial shares
    (its scaling, epochs, dataset, kNN settings)."""
    from components.search_space import trial_config  # YAML + configs: ~0.1 s

    return trial_config(sweep, {}, name="probe", storage="/tmp")


def _base_epochs(sweep: SweepConfig) -> int:
    return int(base_config(sweep).train.epochs)
