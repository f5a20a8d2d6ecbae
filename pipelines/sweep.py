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

import contextlib
import csv
import json
import math
import os
import re
import statistics
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import yaml

from components.config import to_dict
from components.errors import SimgraphError
from components.io.files import atomic_open, write_text
from components.io.paths import base_dir, portable
from components.runs.hosts import metric_first

if TYPE_CHECKING:
    from components.runs.run_dir import PreparedRun


class SweepError(SimgraphError, RuntimeError):
    """The sweep cannot start or its results cannot be read."""


TRIALS_JSON = "trials.json"  # the trial rows (typed parameters): what --confirm reads back
CONFIRM_DIR = "confirm"  # <sweep dir>/confirm/<rank>-seed<j>: the confirmation runs
# How long a trial (or confirmation run) waits for its run dir's lock before it fails: the
# process of the same trial's earlier start may still be going (a driver killed and resumed
# at once, a restart on another node while Ray ends the old actor); the kernel releases its
# lock when it dies.
TRIAL_LOCK_WAIT_S = 60.0
TRIAL_LOCK_WAITING = ("another simgraph pretrain, run or sweep trial is training this trial's "
                      "run dir; stop it, then resume the sweep with --resume")


def sweep_dir(sweep: Any, base: str | Path | None = None) -> str:
    """``storage/name`` (a path or URI), a relative storage taken against ``base`` (default:
    :func:`components.io.paths.base_dir`)."""
    from components.io.paths import resolve_path
    from components.io.storage import join

    return join(resolve_path(sweep.storage, base), sweep.name)


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


def prefetch_plotting() -> None:
    """Import matplotlib and Optuna's plotting in a background thread while the trials run
    (the driver mostly waits then), so the plots are drawn as soon as the last trial ends:
    1.6 s of imports off every sweep's wall time here. A failed import is left for
    :func:`plot_results` to report."""

    def load() -> None:
        with contextlib.suppress(Exception):
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
            import optuna.importance  # noqa: F401
            import optuna.visualization.matplotlib  # noqa: F401

    threading.Thread(target=load, name="simgraph-prefetch-plotting", daemon=True).start()


def numeric_params(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The numeric parameters of the finished trials (a plot against each)."""
    return sorted({k for r in rows if r["score"] is not None for k, v in r["params"].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)})


def plot_confirmed(sweep: Any, rows: Sequence[dict[str, Any]], conf: Any, out: Path) -> None:
    """The metric-vs-parameter plots again, with the confirmed settings marked (only when the
    sweep's metric is the kNN top-1 they are confirmed on: one axis)."""
    if sweep.metric != "knn_top1":
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for k in numeric_params(rows):
        fig = param_figure(sweep, rows, k, confirmed=conf)
        fig.savefig(out / f"{sweep.metric}_vs_{k}.png", dpi=110)
        plt.close(fig)


def plot_results(sweep: Any, rows: Sequence[dict[str, Any]], out: Path) -> None:
    """PNGs beside trials.md: the metric against each numeric parameter and the best setting
    per loss (each setting at its mean with an error bar, :func:`setting_se`; with repeats
    each seed a faint dot; log axes for log distributions, readable ticks), every trial's
    learning curve in one figure, and Optuna's own matplotlib views (optimisation history,
    slice, parameter importances where the data supports them (:func:`importance_support`),
    a contour of the two most important parameters, or of the first two swept ones without
    importances)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if r["score"] is not None]
    for k in numeric_params(rows):  # e.g. metric vs tau_s: X-CLR Fig. 3c
        fig = param_figure(sweep, rows, k)
        fig.savefig(out / f"{sweep.metric}_vs_{k}.png", dpi=110)
        plt.close(fig)
    if any(r["params"].get("loss.name") is not None for r in good):
        fig = best_per_loss_figure(sweep, rows)
        fig.savefig(out / "best_per_loss.png", dpi=110)
        plt.close(fig)
    curves = [r for r in rows if r.get("curve")]
    if curves:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for r in curves:
            ax.plot([e for e, _ in r["curve"]], [v for _, v in r["curve"]], marker=".",
                    linewidth=1, label=f"{r['trial']} ({r['status']})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(sweep.metric)
        if len(curves) <= 12:
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "learning_curves.png", dpi=110)
        plt.close(fig)
    if len(good) < 2:
        return
    with _optuna_console():
        study = _study(sweep, rows)
        importances = param_importances(sweep, rows, study)
        if importances:
            write_text(out / "param_importances.yaml", yaml.safe_dump(importances))
        swept = [k for k in sweep.parameters() if any(k in r["params"] for r in good)]
        _optuna_plots(study, out, list(importances), pair=list(importances)[:2] or swept[:2])


# ---------------------------------------------------------------------------------------------
# Settings with their uncertainty: what the plots draw and what gates the importances.


def settings(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The finished trials (a score) grouped by setting (``params``), in the rows' order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["score"] is not None:
            groups.setdefault(repr(sorted(r["params"].items())), []).append(r)
    return list(groups.values())


SeBasis = Literal["seeds", "trial", "curve"]


def setting_se(members: Sequence[dict[str, Any]], sweep: Any
               ) -> tuple[float | None, SeBasis | None]:
    """The standard error of a setting's mean (``setting_mean`` of its finished trials
    ``members``) and what it rests on, or ``(None, None)`` when nothing tells:

    - ``"seeds"``: two or more finished repeats: ``setting_sd / sqrt(setting_n)``, the
      standard error of the mean over seeds;
    - one finished trial (one seed), its own uncertainty:

      - ``"trial"``: the row's ``<metric>_se`` (e.g. ``knn_top1_se``, the binomial standard
        error of its final kNN) when it carries one;
      - ``"curve"``: for ``knn_top1``, when its curve has >= 2 evaluations: the sample sd of
        its last ``max(k, 2)`` evaluations (``k = sweep.statistic.k``) divided by the square
        root of the evaluations its score averages (``min(k, len(curve))`` for ``mean_last``,
        1 for ``last`` / ``best``). Epoch-to-epoch moves of the kNN on a small val split are
        mostly noise; a curve still rising adds its trend, so this errs on the large side.
        Not for other metrics (a falling loss is trend, not noise).
    """
    n = members[0]["setting_n"] if members else 0
    if n > 1 and members[0]["setting_sd"] is not None:
        return float(members[0]["setting_sd"]) / math.sqrt(n), "seeds"
    if len(members) != 1:
        return None, None
    row = members[0]
    own = row.get(f"{sweep.metric}_se")
    if isinstance(own, int | float) and math.isfinite(own):
        return float(own), "trial"
    values = [v for _, v in row.get("curve") or []]
    if sweep.metric != "knn_top1" or len(values) < 2:
        return None, None
    k = sweep.statistic.k
    tail = values[-max(k, 2):]
    mean = sum(tail) / len(tail)
    sd = math.sqrt(sum((v - mean) ** 2 for v in tail) / (len(tail) - 1))
    averaged = min(k, len(values)) if sweep.statistic.name == "mean_last" else 1
    return sd / math.sqrt(averaged), "curve"


class SettingPoint(NamedTuple):
    """One setting in a plot: the parameter's value, the setting's mean score, the standard
    error of that mean (:func:`setting_se`; None: no bar) and its loss (``""`` if not swept)."""

    x: float
    mean: float
    se: float | None
    loss: str


def setting_points(rows: Sequence[dict[str, Any]], sweep: Any,
                   param: str) -> list[SettingPoint]:
    """Every finished setting that has ``param``, by loss then ``param``'s value."""
    pts = [SettingPoint(group[0]["params"][param], group[0]["setting_mean"],
                        setting_se(group, sweep)[0], str(group[0]["params"].get("loss.name", "")))
           for group in settings(rows) if param in group[0]["params"]]
    return sorted(pts, key=lambda p: (p.loss, p.x))


def _se_caption(sweep: Any, groups: Sequence[Sequence[dict[str, Any]]]) -> str:
    """What the error bars of ``groups`` (settings) are, for a figure's caption."""
    bases = {setting_se(g, sweep)[1] for g in groups}
    k, stat = sweep.statistic.k, sweep.statistic.name
    said = {
        "seeds": "± standard error of the mean over seeds (sd/√n)",
        "trial": f"one seed: ± its own {sweep.metric} standard error",
        "curve": (f"one seed: ± sd/√{k} of its last {k} {sweep.metric} evaluations"
                  if stat == "mean_last" else
                  f"one seed: ± sd of its last {max(k, 2)} {sweep.metric} evaluations"),
    }
    parts = [said[b] for b in ("seeds", "trial", "curve") if b in bases]
    if not parts:
        return "no error bars: one seed per setting and no estimate of its noise"
    if None in bases:
        parts.append("no bar: no estimate")
    if any(len(g) > 1 for g in groups):
        parts.append("faint dots: each seed")
    return "error bars: " + "; ".join(parts)


def _loss_colours(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    losses = sorted({str(r["params"].get("loss.name", "")) for r in rows})
    return {loss: f"C{i}" for i, loss in enumerate(losses)}


# A setting's seeds: small faint dots, drawn 6 points right of its mean (with two seeds they
# lie exactly at the ends of its error bar, under the caps).
_SEED_DOTS: dict[str, Any] = {"s": 12, "alpha": 0.45, "linewidths": 0, "zorder": 3}


def _beside(fig: Any, ax: Any) -> Any:
    from matplotlib.transforms import offset_copy

    return offset_copy(ax.transData, fig, x=6, y=0, units="points")


def _ylabel(sweep: Any, groups: Sequence[Sequence[dict[str, Any]]], what: str = "") -> str:
    k = sweep.statistic.k
    score = {"mean_last": f"mean of last {k}", "last": "last", "best": "best epoch"}
    seeds = ", mean over seeds" if any(len(g) > 1 for g in groups) else ""
    return f"{what}{sweep.metric} ({score[sweep.statistic.name]}){seeds}"


def _caption(ax: Any, text: str) -> None:
    import textwrap

    ax.set_title(textwrap.fill(text, 62), fontsize=6.5)


def param_figure(sweep: Any, rows: Sequence[dict[str, Any]], param: str,
                 confirmed: Any = None) -> Any:
    """The metric against ``param`` (X-CLR Fig. 3c's view for τ_s): each setting at its mean
    with ± its standard error (:func:`setting_points`), its seeds' scores (with repeats) as
    faint dots beside it, a colour per loss, a log axis for a log distribution; the caption
    says what the bars are. ``confirmed`` (a :class:`~components.sweep.confirmation.Confirmation`,
    when the sweep's metric is the kNN top-1 it confirms): each confirmed setting's score on
    its split as a black diamond with its 95 % interval, the confirmed best filled."""
    import matplotlib.pyplot as plt

    groups = [g for g in settings(rows) if param in g[0]["params"]]
    pts = setting_points(rows, sweep, param)
    colours = _loss_colours([g[0] for g in groups])
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for loss in colours:  # the seeds of settings with repeats, faint, beside their mean
        seeds = [r for g in groups if len(g) > 1
                 and str(g[0]["params"].get("loss.name", "")) == loss for r in g]
        if seeds:
            ax.scatter([r["params"][param] for r in seeds], [r["score"] for r in seeds],
                       transform=_beside(fig, ax), **_SEED_DOTS, color=colours[loss])
    for loss in sorted({p.loss for p in pts}):
        mine = [p for p in pts if p.loss == loss]
        ax.errorbar([p.x for p in mine], [p.mean for p in mine],
                    yerr=[p.se if p.se is not None else math.nan for p in mine], fmt="o", ms=5,
                    capsize=3, elinewidth=1, color=colours[loss], label=loss or None,
                    zorder=2)
    caption = _se_caption(sweep, groups)
    marked = [c for c in (confirmed.settings if confirmed is not None else [])
              if param in c.candidate.params]
    for i, c in enumerate(marked):
        v = c.score
        ax.errorbar([c.candidate.params[param]], [v.value],
                    yerr=[[v.value - v.low], [v.high - v.value]], fmt="D",
                    ms=6, capsize=3, color="k", mfc="k" if c is confirmed.best else "none",
                    zorder=4, label=f"confirmed ({confirmed.split})" if i == 0 else None)
    if marked:
        caption += (f"; diamonds: confirmed on the {confirmed.split} split (95 % interval, "
                    "the best filled)")
    dists = sweep.parameters()
    if param in dists and dists[param].log:
        _log_axis(ax)
    ax.set_xlabel(param)
    ax.set_ylabel(_ylabel(sweep, groups), fontsize=8)
    _caption(ax, caption)
    if any(p.loss for p in pts) or marked:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def best_per_loss_figure(sweep: Any, rows: Sequence[dict[str, Any]]) -> Any:
    """The best setting of each loss (by its mean, as the tables rank them) with ± its
    standard error (:func:`setting_se`), its seeds' scores (with repeats) as faint dots."""
    import matplotlib.pyplot as plt

    sign = 1.0 if sweep.mode == "max" else -1.0
    best: dict[str, list[dict[str, Any]]] = {}
    for g in settings(rows):
        loss = g[0]["params"].get("loss.name")
        if loss is not None and (str(loss) not in best or sign * g[0]["setting_mean"]
                                 > sign * best[str(loss)][0]["setting_mean"]):
            best[str(loss)] = g
    losses = sorted(best)
    colours = _loss_colours([g[0] for g in best.values()])
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for i, loss in enumerate(losses):
        g = best[loss]
        se = setting_se(g, sweep)[0]
        ax.bar(i, g[0]["setting_mean"], yerr=se if se is not None else None, capsize=4,
               color=colours[loss], alpha=0.8)
        if len(g) > 1:
            ax.scatter([i] * len(g), [r["score"] for r in g], transform=_beside(fig, ax),
                       **_SEED_DOTS, color="k")
    ax.set_xticks(range(len(losses)), losses)
    ax.set_ylabel(_ylabel(sweep, list(best.values()), "best setting's "), fontsize=8)
    _caption(ax, _se_caption(sweep, list(best.values())))
    fig.tight_layout()
    return fig


@contextlib.contextmanager
def _optuna_console() -> Iterator[None]:
    """Optuna while the searcher is built and the sweep's results are drawn and exported: its
    INFO lines ("A new study created in memory / in RDB") and repeated importance warnings
    ("Some regimes for parameter ... have less than 2 trials") only with ``--verbose``; quiet,
    the warnings become one line."""
    import warnings

    import optuna

    from components.runtime import console

    if console.verbose():
        yield
        return
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        optuna.logging.set_verbosity(level)
    rough = sorted({m.group(1) for w in caught
                    if (m := re.search(r"parameter `(.+?)` have less than 2 trials",
                                       str(w.message)))})
    if rough:
        print(f"simgraph sweep: parameter importances are rough: some values of "
              f"{', '.join(rough)} have fewer than 2 trials", file=sys.stderr)
    for w in caught:
        if "have less than 2 trials" not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _log_axis(ax: Any, which: str = "x") -> None:
    """A log axis whose labels do not collide: plain numbers at 1-2-5 major ticks, no minor
    labels (matplotlib labels minor ticks of a narrow log range, e.g. 0.05-0.5, and they
    overlap)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    if which == "x":
        ax.set_xscale("log")
    else:
        ax.set_yscale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())
    if which == "x":
        ax.tick_params(axis="x", labelrotation=30)


def _optuna_plots(study: Any, out: Path, ranked: Sequence[str],
                  pair: Sequence[str] = ()) -> None:
    """Optuna's matplotlib visualisations of the finished trials (each a PNG; one that Optuna
    cannot draw for this study is skipped with a note, the others are still written):
    importances when ``ranked`` (the parameters by importance) has two or more, a contour of
    ``pair`` (default: the two most important)."""
    import warnings

    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    views: dict[str, Any] = {
        "optuna_history.png": lambda: ovm.plot_optimization_history(study),
        "optuna_slice.png": lambda: ovm.plot_slice(study),
    }
    if len(ranked) >= 2:
        views["optuna_importances.png"] = lambda: ovm.plot_param_importances(study)
    contour = list(pair or ranked)[:2]
    if len(contour) == 2:
        views["optuna_contour.png"] = lambda: ovm.plot_contour(study, params=contour)
    for name, draw in views.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                ax = draw()
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).get_figure()
            for a in fig.axes:  # Optuna's log axes label their minor ticks too: they collide
                if a.get_xscale() == "log":
                    _log_axis(a)
                if a.get_yscale() == "log":
                    _log_axis(a, "y")
            fig.savefig(out / name, dpi=110, bbox_inches="tight")
            plt.close(fig)
        except (ValueError, RuntimeError, ImportError) as e:
            print(f"simgraph sweep: no {name} ({e})", file=sys.stderr)
            plt.close("all")


def _study(sweep: Any, rows: Sequence[dict[str, Any]], storage: Any = None) -> Any:
    """An Optuna study holding the finished trials (value = best metric), failed ones FAIL."""
    import optuna

    from components.search_space import optuna_distributions

    dists = optuna_distributions(sweep)
    direction: Literal["maximize", "minimize"] = "maximize" if sweep.mode == "max" else "minimize"
    if storage is not None and study_owner(storage, sweep.name) == _owner(sweep):
        optuna.delete_study(study_name=sweep.name, storage=storage)  # ours: written again
    study = optuna.create_study(study_name=sweep.name, storage=storage, direction=direction)
    if storage is not None:
        study.set_user_attr(STUDY_OWNER, _owner(sweep))
    seen: set[str] = set()
    for r in rows:  # one Optuna trial per setting: the mean over its repeats, as the searcher
        key = repr(sorted(r["params"].items()))
        if key in seen:
            continue
        seen.add(key)
        params = {k: v for k, v in r["params"].items() if k in dists}
        value = r["setting_mean"]
        state = (optuna.trial.TrialState.COMPLETE if value is not None
                 else optuna.trial.TrialState.FAIL)
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params},
            value=value, state=state, user_attrs={"trial": r["trial"]},
        ))
    return study


def importance_support(sweep: Any, rows: Sequence[dict[str, Any]]) -> str | None:
    """Why the finished settings of ``rows`` cannot support parameter importances (one line),
    or None when they can. Over the finished settings (distinct ``params`` with a score; the
    repeats of a setting count once), two rules:

    1. Enough settings: at least ``max(4, 2 * P)``, ``P`` the number of swept parameters
       (``sweep.parameters()``: unconditional and every branch's). fANOVA fits a random
       forest to (setting -> mean score); with fewer settings its ranking reflects where the
       few points happen to lie.
    2. A spread above the noise: ``spread`` is the sample standard deviation of the
       settings' means, ``noise`` the median of their standard errors (:func:`setting_se`;
       settings without one left out). When ``spread <= 2 * noise`` the means differ by no
       more than a setting's own seeds or evaluations do, and importances would rank noise.
       When no setting has a standard error the noise is unknown and only rule 1 applies.
    """
    groups = settings(rows)
    means = [float(g[0]["setting_mean"]) for g in groups]
    n_params = len(sweep.parameters())
    needed = max(4, 2 * n_params)
    if len(means) < needed:
        return (f"{len(means)} finished setting{'s' * (len(means) != 1)} for {n_params} swept "
                f"parameter{'s' * (n_params != 1)}: importances need at least {needed} "
                "(max(4, 2 × parameters))")
    ses = sorted(se for g in groups if (se := setting_se(g, sweep)[0]) is not None)
    if not ses:
        return None
    noise = statistics.median(ses)
    spread = statistics.stdev(means)
    if spread <= 2 * noise:
        return (f"the {len(means)} settings' means spread by sd {spread:.3g}, within 2 × "
                f"their median standard error {noise:.3g}: their differences are noise")
    return None


def param_importances(sweep: Any, rows: Sequence[dict[str, Any]],
                      study: Any = None) -> dict[str, float]:
    """Optuna's (fANOVA) importances of the swept parameters, or ``{}`` (with one line on
    stderr saying why) where the data does not support them (:func:`importance_support`);
    ``study``: :func:`_study` of ``rows`` when the caller has built it already."""
    import optuna

    reason = importance_support(sweep, rows)
    if reason is not None:
        print(f"simgraph sweep: no parameter importances (param_importances.yaml, "
              f"optuna_importances.png): {reason}", file=sys.stderr)
        return {}
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(
            study if study is not None else _study(sweep, rows)).items()}
    except (RuntimeError, ValueError) as e:  # e.g. a single distinct value per parameter
        print(f"simgraph sweep: no parameter importances ({e})", file=sys.stderr)
        return {}


STUDY_OWNER = "simgraph_sweep_dir"  # user attr: the sweep dir whose trials the study holds


def _owner(sweep: Any) -> str:
    from components.io.storage import display

    return display(sweep_dir(sweep))


def study_owner(storage: Any, name: str) -> str | None:
    """The sweep dir that wrote study ``name`` in ``storage``; ``""`` for a study simgraph did
    not write, ``None`` when there is none."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None
    return str(study.user_attrs.get(STUDY_OWNER, ""))


def _study_storage(spec: str) -> Any:
    import optuna

    if spec.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(spec[len("journal:"):]))
    return optuna.storages.RDBStorage(spec)


def check_study_storage(sweep: Any) -> None:
    """Before a sweep starts: ``study_storage`` must not hold a study of this name that
    another sweep (or a person) wrote — exporting would replace it.

    Raises:
        SweepError: naming the storage, the study and the ways out.
    """
    if not sweep.study_storage:
        return
    with _optuna_console():
        owner = study_owner(_study_storage(sweep.study_storage), sweep.name)
    if owner not in (None, _owner(sweep)):
        who = f"sweep {owner}" if owner else "someone else (not a simgraph sweep)"
        raise SweepError(
            f"study_storage={sweep.study_storage!r} already holds a study named {sweep.name!r} "
            f"written by {who}; exporting this sweep would replace it. Set study_storage to "
            "another file, or name= another sweep")


def export_study(sweep: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Write the trials to ``study_storage`` (``sqlite:///…`` or ``journal:<file>``) so the
    study opens in Optuna's API and dashboard."""
    storage = _study_storage(sweep.study_storage)
    if study_owner(storage, sweep.name) not in (None, _owner(sweep)):  # appeared meanwhile
        raise SweepError(f"study_storage={sweep.study_storage!r} now holds another study named "
                         f"{sweep.name!r}; not replaced — the results are in "
                         f"{_owner(sweep)} (trials.csv)")
    with _optuna_console():
        _study(sweep, rows, storage)


def main(space: str, overrides: Sequence[str], resume: bool = False,
         trust: bool = False, confirm_only: bool = False) -> int:
    from components.errors import run_command

    return run_command("sweep", lambda: run(space, overrides, resume=resume, trust=trust,
                                            confirm_only=confirm_only))
