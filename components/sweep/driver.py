"""A sweep from start to end, what ``simgraph sweep`` runs (:func:`run`): the checks before
Ray starts (:func:`check_sweep_dataset`), what a user should know first (:func:`start_notes`),
Tune, the results and the confirmation stage, all under the sweep dir's one-writer lock.

Top to bottom:

1. Load the search space (``components/search_space/``): every parameter path is checked
   against the config dataclasses, per conditional branch, before any trial starts.
2. Tune, wired as Ray 2.60 needs it (docs/ray-notes.md; :mod:`components.sweep.tuner`): each
   trial is a function trainable.
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
   signed ``state_digest.json`` written when each sweep run ends; :mod:`components.sweep.resume`);
   ``--trust-sweep-dir`` skips that.
4. Results in the sweep dir (:mod:`components.sweep.results`): ``trials.csv`` / ``trials.md``
   (every trial, failed ones marked failed with their error, never with a value),
   ``best.yaml`` (a runnable pretrain config), plots (metric vs each numeric parameter and
   best per loss, settings with error bars; Optuna's views, parameter importances only where
   the data supports them), and the Optuna study in ``study_storage`` when configured.
5. The confirmation stage when ``confirm.top`` > 0 (:mod:`components.sweep.confirm_runs`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from components.io.paths import resolve_path
from components.runtime import session
from components.sweep.confirm_runs import confirm, confirm_finished
from components.sweep.layout import SweepError, sweep_dir
from components.sweep.plots import prefetch_plotting
from components.sweep.results import best_row, markdown, setting_score, trial_rows, write_results
from components.sweep.resume import (
    check_resume,
    check_sweep_state,
    record_start,
    record_sweep_state,
)
from components.sweep.study import check_study_storage
from components.sweep.tuner import base_config, make_tuner

if TYPE_CHECKING:
    from components.search_space import SweepConfig


def start_notes(sweep: SweepConfig) -> list[str]:
    """What a user should know before the sweep spends its time: how trials are scored (and
    the setting that scores them by the best epoch's value instead), and whether the
    evaluation split is too small for the differences a sweep looks for."""
    notes = [f"[simgraph] trials are scored by the {sweep.statistic.describe(sweep.metric)} "
             f"(statistic: {sweep.statistic.name}"
             + (f", k: {sweep.statistic.k}" if sweep.statistic.name == "mean_last" else "")
             + ")"
             + ("; set statistic.name=best to score them by the best epoch's value instead"
                if sweep.statistic.name != "best" else "")]
    from components.search_space import ACCURACY_METRICS  # YAML + configs: ~0.1 s

    if sweep.metric not in ACCURACY_METRICS:
        return notes
    from components.data.reader import DatasetError  # torch
    from components.data.staging import dataset_info
    from components.io.storage import StorageError  # pyarrow

    base = base_config(sweep)
    what, split = (("kNN", base.knn.query_split) if sweep.metric == "knn_top1" else
                   ("online linear probe", base.probe.split_of(base.knn)))
    try:
        n = dataset_info(resolve_path(base.data.dataset)).splits.get(split, 0)
    except (DatasetError, StorageError):
        return notes  # the trials will say what is wrong with the dataset
    if n and 0.5 / math.sqrt(n) > 0.02:
        se = 100 * 0.5 / math.sqrt(n)
        notes.append(
            f"[simgraph] warning: the {what} is scored on {n} {split} images: one "
            f"image is {100 / n:.1f} points and an accuracy near 50 % has a standard error "
            f"of ±{se:.1f} points, so trials closer than ~{2 * se:.0f} points cannot be told "
            "apart; a larger split (preprocess split.val) or statistic.k > 1 helps")
    return notes


def check_sweep_dataset(sweep: SweepConfig) -> None:
    """Before Ray and Tune start: the base config's dataset has a ``manifest.json`` where every
    trial will look for it (a relative path means the base dir, e.g. the folder the sweep was
    started from), so a wrong path is one line here instead of the same failure per trial.

    Raises:
        SweepError: no manifest there.
    """
    from components.data.shards import MANIFEST  # numpy
    from components.io import storage  # pyarrow
    from components.search_space import trial_config  # YAML + configs: ~0.1 s

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
    one row per trial (see :func:`~components.sweep.results.trial_rows`). ``trust``: resume
    without checking who could have written Tune's state in the sweep dir
    (:func:`~components.sweep.resume.check_sweep_state`). ``confirm_only``: only the
    confirmation stage, on a finished sweep
    (:func:`~components.sweep.confirm_runs.confirm_finished`).

    One writer per sweep dir: all of it runs holding the sweep dir's lock
    (``<storage>/.<name>.lock``, :func:`components.io.storage.writer_lock`), so a second sweep of
    the same name — started together, or a ``--resume`` / ``--confirm`` beside a live one —
    is refused in one line naming the first (host, pid, since); a killed sweep's lock is taken
    over, saying so.

    Raises:
        SweepError: another process holds the sweep dir, or what the sweep raises.
    """
    from components.io import storage  # pyarrow
    from components.search_space import load_sweep  # YAML + configs: ~0.1 s

    sweep = load_sweep(sweep_path, overrides)
    if not confirm_only:
        check_sweep_dataset(sweep)  # a read: a missing dataset leaves nothing, not even a lock
    where = sweep_dir(sweep)
    with storage.writer_lock(where, "the sweep dir", error=SweepError,
                             refusal="another simgraph sweep is writing it; wait for it, stop "
                                     "it, or choose another name="):
        return _run(sweep, sweep_path, overrides, resume, echo, trust, confirm_only)


def _run(sweep: SweepConfig, sweep_path: str, overrides: Sequence[str], resume: bool,
         echo: bool, trust: bool, confirm_only: bool) -> list[dict[str, Any]]:
    """:func:`run` under the sweep dir's lock, on the ``sweep`` it loaded (and whose dataset
    it checked) from ``sweep_path`` and ``overrides``."""
    from components.io.storage import display, join  # pyarrow
    from components.search_space import sweep_identity  # YAML + configs: ~0.1 s

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
    with session.ray_session(None, needs_dashboard=not sweep.resources.in_trial):
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
            from components.sweep.confirmation import format_value  # numpy

            params = sorted(best["params"].items())
            settings = " ".join(f"{k}={format_value(v)}" for k, v in params)
            then = ("the confirmation below decides best.yaml" if sweep.confirm.top > 0 else
                    f"its pretrain config: {display(join(sweep_dir(sweep), 'best.yaml'))}")
            print(f"best {'setting' if sweep.repeats > 1 else 'trial'} ({best['trial']}): "
                  f"{sweep.statistic.describe(sweep.metric)} {setting_score(best)} "
                  f"({settings}); {then}")
        print(f"sweep dir: {display(sweep_dir(sweep))} (trials.md, plots: *.png)")
    if sweep.confirm.top > 0:
        confirm(sweep, rows, sweep_path, overrides, echo=echo)
    return rows
