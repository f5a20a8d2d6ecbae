"""Running a sweep's confirmation stage (what to confirm and the statistics:
:mod:`components.sweep.confirmation`): the confirmation runs as Ray tasks
(:func:`confirm_fn`: train one setting with a fresh seed, score it on ``confirm.split``),
:func:`confirm` driving them after a sweep, :func:`confirm_finished` for ``simgraph sweep
FILE --confirm`` on a finished one, and the files it writes (:func:`write_confirmation`:
``confirm.md`` / ``.csv`` / ``.json``, the confirmation appended to ``trials.md``, and
``best.yaml`` from the confirmed best).

:func:`confirm_fn` is handed to ``ray.remote`` by module path; ``pipelines/sweep.py``, where
it lived before, still exposes it. Ray, torch and numpy are imported inside the functions.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from components.config import to_dict
from components.errors import describe
from components.io.files import atomic_open, write_text
from components.io.paths import base_dir, localize, portable
from components.runs.hosts import InProcess
from components.runtime import session
from components.sweep.layout import CONFIRM_DIR, TRIALS_JSON, SweepError, sweep_dir
from components.sweep.plots import plot_confirmed
from components.sweep.results import markdown
from components.sweep.resume import check_resume, record_sweep_state
from components.sweep.tuner import TRIAL_LOCK_WAIT_S, TRIAL_LOCK_WAITING, base_config

if TYPE_CHECKING:
    from components.search_space import SweepConfig
    from components.sweep.confirmation import Confirmation


def confirm_fn(params: dict[str, Any], seed_index: int, name: str, sweep_path: str,
               sweep_overrides: list[str], cwd: str) -> Any:
    """One confirmation run, in a Ray task holding one trial's resources: train ``params``
    with the ``seed_index``-th fresh seed (or resume it, or find it finished: the run dir
    name is fixed), then its per-image kNN hits on ``confirm.split``."""
    from components.io.storage import join  # pyarrow
    from components.runs.recipe import loop_config, make_trainer  # torch
    from components.runs.run_dir import writing_run  # the data package: in the task
    from components.runs.scoring import split_knn_hits  # numpy
    from components.runs.worker import PretrainRecipe
    from components.search_space import load_sweep, trial_config  # YAML + configs: ~0.1 s
    from components.sweep.confirmation import SEED_OFFSET  # numpy

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


def confirm(sweep: SweepConfig, rows: Sequence[dict[str, Any]], sweep_path: str,
            overrides: Sequence[str], echo: bool = True) -> Confirmation | None:
    """Retrain the ``confirm.top`` best settings of ``rows`` with ``confirm.seeds`` fresh seeds
    each (Ray tasks, as many at once as the cluster holds), score them on ``confirm.split``,
    and write the confirmed answer (:func:`write_confirmation`); returns the
    :class:`~components.sweep.confirmation.Confirmation` (``None``: no finished setting).

    Raises:
        SweepError: a confirmation run failed (re-running ``--confirm`` resumes the runs).
    """
    import ray  # Ray: ~1 s to import, only once the confirmation starts

    from components.sweep.confirmation import (  # numpy
        candidates,
        closing_line,
        run_name,
        summarise,
    )

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
    with session.ray_session(None, needs_dashboard=not sweep.resources.in_trial):
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
    from components.evaluation.knn import KnnRule  # torch

    conf = summarise(hits, chosen, sweep.confirm.split,
                     curse_comparable=sweep.metric == "knn_top1",
                     rule=KnnRule.of(base_config(sweep).knn).name())  # split_knn_hits' rule
    write_confirmation(sweep, rows, conf)
    record_sweep_state(sweep)
    if echo:
        from components.io.storage import display, join  # pyarrow
        from components.sweep.confirmation import table  # numpy

        print(table(conf, sweep.metric))
        print(closing_line(conf, seeds) + "; its pretrain config: "
              + display(join(sweep_dir(sweep), "best.yaml")))
    return conf


def write_confirmation(sweep: SweepConfig, rows: Sequence[dict[str, Any]],
                       conf: Confirmation) -> None:
    """``confirm.md`` / ``.csv`` / ``.json``, the confirmation appended to ``trials.md``, and
    ``best.yaml`` from the confirmed best (published to a URI sweep dir when complete)."""
    from components.io.storage import LocalMirror, redacted  # pyarrow
    from components.search_space import trial_config  # YAML + configs: ~0.1 s
    from components.sweep.confirmation import closing_line, table  # numpy
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
    from components.io import storage  # pyarrow
    from components.search_space import load_sweep, sweep_identity  # ~0.1 s

    sweep = load_sweep(sweep_path, overrides)
    if sweep.confirm.top < 1:
        raise SweepError("--confirm needs confirm.top >= 1: set confirm: {top: 3} in the sweep "
                         "file, or add confirm.top=3 to the command")
    check_resume(sweep, sweep_identity(sweep_path, sweep, overrides), flag="--confirm")
    path = storage.join(sweep_dir(sweep), TRIALS_JSON)
    if not storage.exists(path):
        raise SweepError(f"{storage.display(sweep_dir(sweep))} has no {TRIALS_JSON}, which a "
                         "sweep writes when it ends: finish the sweep with --resume, then run "
                         "--confirm again")
    rows = json.loads(storage.read_text(path))
    confirm(sweep, rows, sweep_path, overrides, echo=echo)
    return list(rows)
