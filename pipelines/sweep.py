"""``simgraph sweep SPACE.yaml [--resume] [key=value ...]``: Ray Tune + Optuna over pretraining.

Top to bottom:

1. Load the search space (``components/search_space/``): every parameter path is checked
   against the config dataclasses, per conditional branch, before any trial starts.
2. Tune, wired as Ray 2.60 needs it (docs/ray-notes.md): each trial is a function trainable.
   A one-worker trial (``resources.mode`` auto / in_trial) trains inside its trial actor
   (``components.runs.recipe.train_in_trial``; the actor is reused by the next trial, a failed
   trial is retried by Tune up to ``scaling.max_failures``); otherwise the trial builds its own
   Train V2 ``TorchTrainer`` (``components/runs/recipe.py``) with Tune's ``TuneReportCallback``.
   ``OptunaSearch`` with the space as a define-by-run function
   (conditional parameters per loss), behind a ``ConcurrencyLimiter``; ASHA on the reported
   ``epoch`` (Tune's own iteration counter restarts after a restore) or FIFO. Each trial's
   run dir (checkpoints, metrics.csv) is ``<sweep dir>/trials/<trial id>``.
3. ``--resume``: ``Tuner.restore(resume_errored=True)``: finished trials are kept, unfinished and
   errored ones re-run their trainable, which resumes from the newest complete checkpoint in
   its run dir (Ray Train's snapshot, same run name, or the in-trial host's own), and the
   searcher's state comes back. Restoring unpickles Tune's state from the sweep dir, so it is
   checked first (``components/sweep/state.py``: a local dir's owners and modes, a URI's
   signed ``state_digest.json`` written when each sweep run ends); ``--trust-sweep-dir``
   skips that.
4. Results in the sweep dir: ``trials.csv`` / ``trials.md`` (every trial, failed ones marked
   failed with their error, never with a value), ``best.yaml`` (a runnable pretrain config),
   plots (metric vs each numeric parameter and best per loss, settings with error bars; Optuna's
   views, parameter importances only where the data supports them), and the Optuna study in
   ``study_storage`` when configured.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from components.config import to_dict
from components.io.files import atomic_open, write_text
from components.io.paths import base_dir, portable
from components.runs.hosts import metric_first
from components.sweep.layout import SweepError, sweep_dir  # noqa: F401  (the command's API)
from components.sweep.plots import (  # noqa: F401  (the command's API: tests use them)
    SeBasis,
    best_per_loss_figure,
    numeric_params,
    param_figure,
    plot_confirmed,
    prefetch_plotting,
    setting_points,
    setting_se,
    settings,
)
from components.sweep.study import (  # noqa: F401  (the command's API: tests use them)
    STUDY_OWNER,
    _optuna_console,
    check_study_storage,
    export_study,
    importance_support,
    param_importances,
    plot_results,
    study_owner,
)

if TYPE_CHECKING:
    from components.runs.run_dir import PreparedRun


TRIALS_JSON = "trials.json"  # the trial rows (typed parameters): what --confirm reads back
CONFIRM_DIR = "confirm"  # <sweep dir>/confirm/<rank>-seed<j>: the confirmation runs
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
    from ray import tune

    from components.io.paths import localize
    from components.io.storage import join
    from components.runs.run_dir import writing_run
    from components.search_space import load_sweep, trial_config

    sweep = load_sweep(localize(sweep_path), sweep_overrides)
    trial_id = tune.get_context().get_trial_id()
    # Relative paths mean what they meant where `simgraph sweep` was started (or
    # $SIMGRAPH_BASE_DIR): Tune runs each trial in its own working directory.
    cfg = trial_config(sweep, params, name=trial_id,
                       storage=join(sweep_dir(sweep, cwd), "trials"))
    with writing_run(cfg, base=cwd, command="sweep", wait_s=TRIAL_LOCK_WAIT_S,
                     waiting=TRIAL_LOCK_WAITING) as run:
        _train_trial(sweep, run)


def _train_trial(sweep: Any, run: PreparedRun) -> None:
    """:func:`trial_fn`'s training, under the trial's run dir lock: replay a finished trial's
    results, or train it (in this actor, or with its own Train worker group)."""
    from ray import tune

    from components.runs.recipe import make_trainer, train_in_trial
    from components.search_space import SCORE, score_history, score_spec

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
# The driver.


def make_tuner(sweep: Any, sweep_path: str, sweep_overrides: Sequence[str],
               resume: bool) -> Any:
    import ray.tune

    from components.io.paths import resolve_path
    from components.io.storage import display, list_dir
    from components.sweep.tune_loggers import use_deferred_tensorboard
    from components.training.tracking import prepare_sweep_trackers, tune_callbacks

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
                max_failures=_base_config(sweep).scaling.max_failures if in_trial else 0),
        ),
    )


def make_searcher(sweep: Any) -> Any:
    """Tune's searcher: Optuna over the sweep's space (define-by-run, the sweep's sampler)
    behind Tune's concurrency limit. It optimises the trial's score (sweep.statistic of its
    metric so far), not one noisy evaluation; with repeats, Tune's Repeater trains each
    suggestion with that many seeds and hands the searcher their mean."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from components.search_space import SCORE, define_by_run, make_sampler

    with _optuna_console():  # OptunaSearch creates its study here: Optuna's INFO line
        optuna_search: Any = OptunaSearch(space=define_by_run(sweep), metric=SCORE,
                                          mode=sweep.mode, sampler=make_sampler(sweep))
    if sweep.repeats > 1:
        from ray.tune.search import Repeater

        optuna_search = Repeater(optuna_search, repeat=sweep.repeats, set_index=True)
    return ConcurrencyLimiter(optuna_search, max_concurrent=concurrency(sweep))


def make_scheduler(sweep: Any) -> Any:
    """Tune's scheduler: ASHA on the trial's score with the reported ``epoch`` as its time
    (``max_t`` = ``scheduler.max_epochs`` or the trials' ``train.epochs``), or FIFO."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from components.search_space import SCORE

    s = sweep.scheduler
    if s.name == "asha":
        return ASHAScheduler(time_attr="epoch", metric=SCORE, mode=sweep.mode,
                             max_t=s.max_epochs or _base_epochs(sweep),
                             grace_period=s.grace_period, reduction_factor=s.reduction_factor)
    return FIFOScheduler()


def concurrency(sweep: Any, cluster: dict[str, float] | None = None) -> int:
    """``max_concurrent``; ``auto``: as many trials as ``cluster`` (default: the running Ray
    cluster's resources now) holds, at most ``num_samples``, so no CPU idles while trials
    wait."""
    if sweep.max_concurrent != "auto":
        return int(sweep.max_concurrent)
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()
    return min(sweep.resources.trials_that_fit(cluster), sweep.num_samples * sweep.repeats)


def _base_config(sweep: Any) -> Any:
    from components.search_space import trial_config

    return trial_config(sweep, {}, name="probe", storage="/tmp")


def start_notes(sweep: Any) -> list[str]:
    """What a user should know before the sweep spends its time: how trials are scored (the
    default changed from the best epoch's value), and whether the evaluation split is too
    small for the differences a sweep looks for."""
    notes = [f"[simgraph] trials are scored by the {sweep.statistic.describe(sweep.metric)} "
             f"(statistic: {sweep.statistic.name}"
             + (f", k: {sweep.statistic.k}" if sweep.statistic.name == "mean_last" else "")
             + "); before 2026-11-25 the best epoch's value was used: set statistic.name=best "
             "for that"]
    if sweep.metric != "knn_top1":
        return notes
    from components.data.reader import DatasetError
    from components.data.staging import dataset_info
    from components.io.paths import resolve_path
    from components.io.storage import StorageError

    base = _base_config(sweep)
    try:
        n = dataset_info(resolve_path(base.data.dataset)).splits.get(base.knn.query_split, 0)
    except (DatasetError, StorageError):
        return notes  # the trials will say what is wrong with the dataset
    if n and 0.5 / math.sqrt(n) > 0.02:
        se = 100 * 0.5 / math.sqrt(n)
        notes.append(
            f"[simgraph] warning: the kNN is scored on {n} {base.knn.query_split} images: one "
            f"image is {100 / n:.1f} points and an accuracy near 50 % has a standard error "
            f"of ±{se:.1f} points, so trials closer than ~{2 * se:.0f} points cannot be told "
            "apart; a larger split (preprocess split.val) or statistic.k > 1 helps")
    return notes


def _base_epochs(sweep: Any) -> int:
    return int(_base_config(sweep).train.epochs)


def check_sweep_dataset(sweep: Any) -> None:
    """Before Ray and Tune start: the base config's dataset has a ``manifest.json`` where every
    trial will look for it (a relative path means the base dir, e.g. the folder the sweep was
    started from), so a wrong path is one line here instead of the same failure per trial.

    Raises:
        SweepError: no manifest there.
    """
    from components.data.shards import MANIFEST
    from components.io import storage
    from components.io.paths import resolve_path
    from components.search_space import trial_config

    given = trial_config(sweep, {}, name="preflight", storage=sweep.storage).data.dataset
    where = resolve_path(given)
    try:
        found = storage.exists(storage.join(where, MANIFEST))
    except storage.StorageError as e:
        raise SweepError(f"cannot check the base config's data.dataset={given!r}: {e}") from None
    if not found:
        raise SweepError(
            f"the base config {sweep.base_path} names data.dataset={given!r}, but "
            f"{storage.display(where)} has no {MANIFEST}; no trial was started: build it "
            "(simgraph preprocess), or give its path (absolute, or relative to the folder the "
            "sweep runs from)")


def run(sweep_path: str, overrides: Sequence[str] = (), resume: bool = False,
        echo: bool = True, trust: bool = False, confirm_only: bool = False
        ) -> list[dict[str, Any]]:
    """Run (or resume) a sweep, then its confirmation stage when ``confirm.top`` > 0; returns
    one row per trial (see :func:`trial_rows`). ``trust``: resume without checking who could
    have written Tune's state in the sweep dir (:func:`check_sweep_state`). ``confirm_only``:
    only the confirmation stage, on a finished sweep (:func:`confirm_finished`).

    One writer per sweep dir: all of it runs holding the sweep dir's lock
    (``<storage>/.<name>.lock``, :func:`components.io.storage.writer_lock`), so a second sweep of
    the same name — started together, or a ``--resume`` / ``--confirm`` beside a live one —
    is refused in one line naming the first (host, pid, since); a killed sweep's lock is taken
    over, saying so.

    Raises:
        SweepError: another process holds the sweep dir, or what the sweep raises.
    """
    from components.io import storage
    from components.search_space import load_sweep

    sweep = load_sweep(sweep_path, overrides)
    if not confirm_only:
        check_sweep_dataset(sweep)  # a read: a missing dataset leaves nothing, not even a lock
    where = sweep_dir(sweep)
    with storage.writer_lock(where, "the sweep dir", error=SweepError,
                             refusal="another simgraph sweep is writing it; wait for it, stop "
                                     "it, or choose another name="):
        return _run(sweep, sweep_path, overrides, resume, echo, trust, confirm_only)


def _run(sweep: Any, sweep_path: str, overrides: Sequence[str], resume: bool, echo: bool,
         trust: bool, confirm_only: bool) -> list[dict[str, Any]]:
    """:func:`run` under the sweep dir's lock, on the ``sweep`` it loaded (and whose dataset
    it checked) from ``sweep_path`` and ``overrides``."""
    from components.io.storage import display, join
    from components.runtime.session import ray_session
    from components.search_space import sweep_identity

    if confirm_only:
        return confirm_finished(sweep_path, overrides, echo=echo)
    # Tune snapshots the experiment at most every 10 s by default ("auto"); a trial that starts
    # and ends between two snapshots is unknown to a resumed sweep, which re-suggests its
    # parameters under a new id and trains them again. One-worker trials can take seconds.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    identity = sweep_identity(sweep_path, sweep, overrides)
    if resume:
        check_resume(sweep, identity)
        if not trust:
            check_sweep_state(sweep)
    check_study_storage(sweep)
    if echo:
        for line in start_notes(sweep):
            print(line, flush=True)
    # Trials with their own Train worker group need the dashboard's State API on a local Ray:
    # Ray Train frees a stopped trial's placement group only once it sees its controller dead.
    with ray_session(None, needs_dashboard=not sweep.resources.in_trial):
        tuner = make_tuner(sweep, sweep_path, overrides, resume)
        if not resume:  # the sweep dir is new (make_tuner refused an old one)
            record_start(sweep, identity)
        prefetch_plotting()
        try:
            results = tuner.fit()
        finally:
            record_sweep_state(sweep)
    rows = trial_rows(results, sweep)
    write_results(sweep, rows)
    record_sweep_state(sweep)  # again: the results' *.json are files a restore copies
    if echo:
        print(markdown(rows, sweep))
        best = best_row(rows, sweep)
        if best is not None:
            from components.sweep.confirmation import format_value

            params = sorted(best["params"].items())
            settings = " ".join(f"{k}={format_value(v)}" for k, v in params)
            then = ("the confirmation below decides best.yaml" if sweep.confirm.top > 0 else
                    f"its pretrain config: {display(join(sweep_dir(sweep), 'best.yaml'))}")
            print(f"best {'setting' if sweep.repeats > 1 else 'trial'} ({best['trial']}): "
                  f"{sweep.statistic.describe(sweep.metric)} {_setting_score(best)} "
                  f"({settings}); {then}")
        print(f"sweep dir: {display(sweep_dir(sweep))} (trials.md, plots: *.png)")
    if sweep.confirm.top > 0:
        confirm(sweep, rows, sweep_path, overrides, echo=echo)
    return rows


# ---------------------------------------------------------------------------------------------
# The confirmation stage (components/sweep/confirmation.py).


def confirm_fn(params: dict[str, Any], seed_index: int, name: str, sweep_path: str,
               sweep_overrides: list[str], cwd: str) -> Any:
    """One confirmation run, in a Ray task holding one trial's resources: train ``params``
    with the ``seed_index``-th fresh seed (or resume it, or find it finished: the run dir
    name is fixed), then its per-image kNN hits on ``confirm.split``."""
    import dataclasses

    from components.io.paths import localize
    from components.io.storage import join
    from components.runs.hosts import InProcess
    from components.runs.recipe import PretrainRecipe, loop_config, make_trainer
    from components.runs.run_dir import writing_run
    from components.runs.scoring import split_knn_hits
    from components.search_space import load_sweep, trial_config
    from components.sweep.confirmation import SEED_OFFSET

    sweep = load_sweep(localize(sweep_path), sweep_overrides)
    cfg = trial_config(sweep, params, name=name,
                       storage=join(sweep_dir(sweep, cwd), CONFIRM_DIR))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, seed=cfg.train.seed + SEED_OFFSET + seed_index))
    # One writer, as a trial's: this task holds the run dir's lock while it trains and scores.
    with writing_run(cfg, base=cwd, command="sweep", wait_s=TRIAL_LOCK_WAIT_S,
                     waiting=TRIAL_LOCK_WAITING) as run:
        if run.finished is None:
            if sweep.resources.in_trial:
                PretrainRecipe(loop_config(run.cfg, run.run_dir, run.facts),
                               host=InProcess(run.run_dir, run.cfg.checkpoint.keep)).run()
            else:
                make_trainer(run.cfg, run.run_dir, run.facts).fit()
        return split_knn_hits(run.run_dir, sweep.confirm.split)


def confirm(sweep: Any, rows: Sequence[dict[str, Any]], sweep_path: str,
            overrides: Sequence[str], echo: bool = True) -> Any:
    """Retrain the ``confirm.top`` best settings of ``rows`` with ``confirm.seeds`` fresh seeds
    each (Ray tasks, as many at once as the cluster holds), score them on ``confirm.split``,
    and write the confirmed answer (:func:`write_confirmation`); returns the
    :class:`~components.sweep.confirmation.Confirmation` (``None``: no finished setting).

    Raises:
        SweepError: a confirmation run failed (re-running ``--confirm`` resumes the runs).
    """
    import ray

    from components.errors import describe
    from components.runtime.session import ray_session
    from components.sweep.confirmation import candidates, closing_line, run_name, summarise

    chosen = candidates(rows, sweep.confirm.top)
    if not chosen:
        if echo:
            print("confirmation: no finished setting to confirm")
        return None
    seeds = sweep.confirm.seeds
    if echo:
        print(f"confirmation: retraining the {len(chosen)} best setting(s) with {seeds} fresh "
              f"seed(s) each, scored by kNN top-1 on the {sweep.confirm.split} split", flush=True)
    res = sweep.resources.trial_resources()
    with ray_session(None, needs_dashboard=not sweep.resources.in_trial):
        task = ray.remote(confirm_fn).options(num_cpus=res["CPU"], num_gpus=res.get("GPU", 0),
                                              max_retries=0)
        refs = {(c.rank, j): task.remote(c.params, j, run_name(c, j), portable(sweep_path),
                                         list(overrides), str(base_dir()))
                for c in chosen for j in range(seeds)}
        hits: dict[int, list[Any]] = {}
        for (rank, j), ref in refs.items():
            try:
                hits.setdefault(rank, []).append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - Ray wraps the run's error
                raise SweepError(
                    f"confirmation run {CONFIRM_DIR}/{run_name(chosen[rank - 1], j)} failed: "
                    f"{describe(e)}; re-run with --confirm to resume the confirmation") from None
    from components.evaluation.knn import KnnRule

    conf = summarise(hits, chosen, sweep.confirm.split,
                     curse_comparable=sweep.metric == "knn_top1",
                     rule=KnnRule.of(_base_config(sweep).knn).name())  # split_knn_hits' rule
    write_confirmation(sweep, rows, conf)
    record_sweep_state(sweep)
    if echo:
        from components.io.storage import display, join
        from components.sweep.confirmation import table

        print(table(conf, sweep.metric))
        print(closing_line(conf, seeds) + "; its pretrain config: "
              + display(join(sweep_dir(sweep), "best.yaml")))
    return conf


def write_confirmation(sweep: Any, rows: Sequence[dict[str, Any]], conf: Any) -> None:
    """``confirm.md`` / ``.csv`` / ``.json``, the confirmation appended to ``trials.md``, and
    ``best.yaml`` from the confirmed best (published to a URI sweep dir when complete)."""
    from components.io.storage import LocalMirror, redacted
    from components.search_space import trial_config
    from components.sweep.confirmation import closing_line, table
    from components.sweep.confirmation import rows as confirm_rows

    seeds = sweep.confirm.seeds
    text = (f"## Confirmation: the {len(conf.settings)} best settings, {seeds} fresh seed(s) "
            f"each, kNN top-1 on the {conf.split} split ({conf.images} images)\n\n"
            + table(conf, sweep.metric) + "\n\n" + closing_line(conf, seeds) + ".\n\n"
            "Intervals: 95 % percentile bootstrap over the images of the seed-averaged hits; "
            "\"vs best\": paired over the same images; tied: that interval holds 0.\n")
    with LocalMirror(sweep_dir(sweep)) as mirror:
        out = mirror.local
        write_text(out / "confirm.md", text)
        body = confirm_rows(conf)
        write_text(out / "confirm.json", json.dumps(body, indent=1) + "\n")
        keys = sorted({k for r in body for k in r["params"]})
        cols = [k for k in body[0] if k != "params"]
        with atomic_open(out / "confirm.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*cols, *keys])
            for r in body:
                w.writerow([*(r[c] for c in cols), *(r["params"].get(k) for k in keys)])
        write_text(out / "trials.md", markdown(rows, sweep) + "\n\n" + text)
        b = conf.best
        cfg = trial_config(sweep, b.candidate.params, name=f"{sweep.name}-best",
                           storage=sweep.storage)
        write_text(out / "best.yaml",
                   f"# confirmed best of sweep {sweep.name} (sweep rank {b.candidate.rank}): "
                   f"{conf.split} kNN top-1 {100 * b.score.value:.1f} % "
                   f"[{100 * b.score.low:.1f}, {100 * b.score.high:.1f}] over {seeds} fresh "
                   f"seed(s); sweep score {b.candidate.sweep_score:.4g}\n"
                   + yaml.safe_dump(redacted(to_dict(cfg)), sort_keys=False))
        plot_confirmed(sweep, rows, conf, out)


def confirm_finished(sweep_path: str, overrides: Sequence[str],
                     echo: bool = True) -> list[dict[str, Any]]:
    """``simgraph sweep FILE --confirm``: the confirmation stage of a finished sweep, from its
    ``trials.json``; the sweep file and base config must be the ones it ran with (the
    ``confirm`` section may differ). Returns the sweep's trial rows.

    Raises:
        SweepError: ``confirm.top`` is 0, the sweep has no ``trials.json`` (not finished), or
            its files changed since it started.
    """
    from components.io import storage
    from components.search_space import load_sweep, sweep_identity

    sweep = load_sweep(sweep_path, overrides)
    if sweep.confirm.top < 1:
        raise SweepError("--confirm needs confirm.top >= 1: set confirm: {top: 3} in the sweep "
                         "file, or add confirm.top=3 to the command")
    check_resume(sweep, sweep_identity(sweep_path, sweep, overrides), flag="--confirm")
    path = storage.join(sweep_dir(sweep), TRIALS_JSON)
    if not storage.exists(path):
        raise SweepError(f"{storage.display(sweep_dir(sweep))} has no {TRIALS_JSON}: the sweep "
                         "has not finished (resume it first with --resume), or it ran with a "
                         "simgraph from before 2026-11-25 (re-run it)")
    rows = json.loads(storage.read_text(path))
    confirm(sweep, rows, sweep_path, overrides, echo=echo)
    return list(rows)


def check_sweep_state(sweep: Any) -> None:
    """Before ``--resume`` unpickles Tune's state from the sweep dir: refuse files someone else
    could have written (a local dir: owners and modes; a URI: the record
    :func:`record_sweep_state` signed) — :mod:`components.sweep.state`.

    Raises:
        SweepError: naming the file, why, and what to do (``--trust-sweep-dir`` among it).
    """
    from components.io.storage import StorageError
    from components.sweep.state import UntrustedSweepState, check

    try:
        check(sweep_dir(sweep))
    except (UntrustedSweepState, StorageError, OSError) as e:
        raise SweepError(str(e)) from None


def record_sweep_state(sweep: Any) -> None:
    """After a sweep run (finished or not): sign the sha256 of Tune's state files into a URI
    sweep dir (:func:`components.sweep.state.record`), which a later ``--resume`` checks. A
    local sweep dir needs none (its files' owners and modes are checked); a failure to write
    it is a warning, never the sweep's error."""
    from components.io.storage import StorageError, display
    from components.runtime import console
    from components.sweep.state import DIGEST_FILE, TRUST_FLAG, is_remote, record

    path = sweep_dir(sweep)
    try:
        if is_remote(path):
            record(path)
    except (StorageError, OSError) as e:
        console.say(f"[simgraph] warning: could not record {DIGEST_FILE} in {display(path)} "
                    f"({e}): a --resume will need {TRUST_FLAG}")


def record_start(sweep: Any, identity: dict[str, Any]) -> None:
    """Write :data:`~components.search_space.SWEEP_RECORD` into the new sweep dir."""
    import json

    from components.io import storage
    from components.search_space import SWEEP_RECORD

    path = sweep_dir(sweep)
    storage.makedirs(path)
    storage.write_text(storage.join(path, SWEEP_RECORD),  # never a URI's credentials
                       json.dumps(storage.redacted(identity), indent=1))


def check_resume(sweep: Any, identity: dict[str, Any], flag: str = "--resume") -> None:
    """Refuse ``--resume`` when the sweep file, its base config or the command-line overrides
    changed since the sweep started: Tune would restore the old searcher's trials while new
    trials are built from the new files — two experiments in one sweep.

    Raises:
        SweepError: naming what changed and the two ways out.
    """
    import json

    from components.io import storage
    from components.runtime import console
    from components.search_space import SWEEP_RECORD, identity_changes

    path = storage.join(sweep_dir(sweep), SWEEP_RECORD)
    if not storage.exists(path):
        if storage.exists(sweep_dir(sweep)):
            console.say(f"[simgraph] warning: {storage.display(sweep_dir(sweep))} has no "
                        f"{SWEEP_RECORD} (a sweep from an older simgraph): its files cannot be "
                        "checked against the ones given now")
        return
    changed = identity_changes(storage.redacted(json.loads(storage.read_text(path))),
                               storage.redacted(identity))  # other credentials: the same
    if changed:
        what = ("resuming would mix two experiments" if flag == "--resume" else
                "confirming would retrain settings of another experiment")
        raise SweepError(
            f"{flag}: {'; '.join(changed)} changed since sweep {sweep.name!r} started; "
            f"{what}. Restore those files (and overrides), or start a new sweep with "
            "name=<another name>")


def trial_rows(results: Any, sweep: Any) -> list[dict[str, Any]]:
    """One row per trial: id, status, parameters (its setting), repeat index, epochs run,
    last and best metric, score, and its setting's ``setting_mean`` / ``setting_sd`` /
    ``setting_n`` over the setting's finished repeats (``repeats``). Sorted best setting
    first (then best trial); a failed trial carries its error and no metric values."""
    from components.search_space import REPEAT_INDEX, setting_of

    rows: list[dict[str, Any]] = []
    for r in results:
        cfg = setting_of(r.config or {})
        repeat = int((r.config or {}).get(REPEAT_INDEX, 0) or 0)
        df = r.metrics_dataframe
        history = [] if df is None or sweep.metric not in df else list(df[sweep.metric])
        epochs = int(df["epoch"].max()) if df is not None and "epoch" in df else 0
        failed = r.error is not None
        best = score = None
        if history and not failed:
            finite = [v for v in history if isinstance(v, int | float) and math.isfinite(v)]
            if finite:
                best = max(finite) if sweep.mode == "max" else min(finite)
            score = sweep.statistic.score(history, sweep.mode)
        curve = ([(int(e), float(v)) for e, v in zip(df["epoch"], df[sweep.metric], strict=True)
                  if isinstance(v, int | float) and math.isfinite(v)]
                 if history and "epoch" in df else [])
        rows.append({
            "trial": (r.metrics or {}).get("trial_id") or Path(r.path).name,
            "status": "failed" if failed else "finished",
            "error": _short(r.error) if failed else "",
            "epochs": epochs,
            sweep.metric: None if failed or not history else history[-1],
            f"best_{sweep.metric}": best,
            "score": score,  # sweep.statistic of the metric's evaluations: what ranks trials
            "params": cfg,
            "repeat": repeat,
            "curve": curve,  # (epoch, metric) as reported: the learning-curves plot
        })
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_setting.setdefault(repr(sorted(row["params"].items())), []).append(row)
    for members in by_setting.values():
        scores = [m["score"] for m in members if m["score"] is not None]
        mean = sum(scores) / len(scores) if scores else None
        sd = (math.sqrt(sum((x - mean) ** 2 for x in scores) / (len(scores) - 1))
              if mean is not None and len(scores) > 1 else None)
        for m in members:
            m.update(setting_mean=mean, setting_sd=sd, setting_n=len(scores))
    sign = -1.0 if sweep.mode == "max" else 1.0

    def order(row: dict[str, Any]) -> tuple[bool, float, bool, float]:
        mean, score = row["setting_mean"], row["score"]
        return (mean is None, sign * float(mean or 0.0), score is None,
                sign * float(score or 0.0))

    rows.sort(key=order)
    return rows


def best_row(rows: Sequence[dict[str, Any]], sweep: Any) -> dict[str, Any] | None:
    """The best trial of :func:`trial_rows` (of the best setting: sorted best first, failed
    ones last), or None."""
    return rows[0] if rows and rows[0]["score"] is not None else None


def _setting_score(row: dict[str, Any]) -> str:
    """``mean ± sd (n)`` of a row's setting, or the trial's score alone."""
    mean, sd, n = row["setting_mean"], row["setting_sd"], row["setting_n"]
    if mean is None:
        return "—"
    return f"{mean:.4g}" + (f" ± {sd:.2g} (n={n})" if n > 1 and sd is not None else "")


def _short(err: Any) -> str:
    from components.errors import describe

    return describe(err)[:300] if isinstance(err, BaseException) else str(err)[:300]


def markdown(rows: Sequence[dict[str, Any]], sweep: Any) -> str:
    from components.sweep.confirmation import format_value

    keys = sorted({k for r in rows for k in r["params"]})
    repeats = sweep.repeats > 1
    head = ["trial", "status", "epochs", f"score: {sweep.statistic.describe(sweep.metric)}",
            *(["setting: mean ± sd (n)", "seed +"] if repeats else []),
            f"best {sweep.metric}", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best, score = r[f"best_{sweep.metric}"], r["score"]
        cells = [r["trial"], r["status"] + (f" ({r['error']})" if r["error"] else ""),
                 str(r["epochs"]), "—" if score is None else f"{score:.4g}",
                 *([_setting_score(r), str(r["repeat"])] if repeats else []),
                 "—" if best is None else f"{best:.4g}"]
        cells += [format_value(r["params"].get(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(sweep: Any, rows: Sequence[dict[str, Any]]) -> None:
    """trials.csv / .md, best.yaml, plots, importances into the sweep dir (published to a URI
    sweep dir when the files are complete)."""
    from components.io.storage import LocalMirror

    with LocalMirror(sweep_dir(sweep)) as mirror:
        _write_results(sweep, rows, mirror.local)
    if sweep.study_storage:
        export_study(sweep, rows)


def _write_results(sweep: Any, rows: Sequence[dict[str, Any]], out: Path) -> None:
    from components.io.storage import redacted
    from components.search_space import trial_config

    keys = sorted({k for r in rows for k in r["params"]})
    with atomic_open(out / "trials.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "status", "error", "epochs", "score", "repeat", "setting_mean",
                    "setting_sd", "setting_n", sweep.metric, f"best_{sweep.metric}", *keys])
        for r in rows:
            w.writerow([r["trial"], r["status"], r["error"], r["epochs"], r["score"],
                        r["repeat"], r["setting_mean"], r["setting_sd"], r["setting_n"],
                        r[sweep.metric], r[f"best_{sweep.metric}"],
                        *[r["params"].get(k) for k in keys]])
    write_text(out / "trials.md", markdown(rows, sweep) + "\n")
    write_text(out / TRIALS_JSON, json.dumps(list(rows), indent=1, default=str) + "\n")
    best = best_row(rows, sweep)
    if best is not None:
        cfg = trial_config(sweep, best["params"], name=f"{sweep.name}-best",
                           storage=sweep.storage)
        write_text(
            out / "best.yaml",
            f"# best {'setting' if sweep.repeats > 1 else 'trial'} of sweep {sweep.name} "
            f"(trial {best['trial']}): {sweep.statistic.describe(sweep.metric)} = "
            f"{_setting_score(best)}\n"
            + yaml.safe_dump(redacted(to_dict(cfg)), sort_keys=False)
        )
    plot_results(sweep, rows, out)


def main(space: str, overrides: Sequence[str], resume: bool = False,
         trust: bool = False, confirm_only: bool = False) -> int:
    from components.errors import run_command

    return run_command("sweep", lambda: run(space, overrides, resume=resume, trust=trust,
                                            confirm_only=confirm_only))
