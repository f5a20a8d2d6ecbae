"""Pretraining as a recipe over the library: where it is started, and what Ray is handed.

:func:`make_trainer` builds the Ray Train V2 ``TorchTrainer`` (gloo on CPU, NCCL on GPU; the
same run name + storage resumes); each worker runs :func:`train_loop`, i.e.
:class:`~components.runs.worker.PretrainRecipe` (:mod:`components.runs.worker`): setup (device,
FFCV reader for this rank's share, model in DDP, optimiser and schedule, restore) → per epoch
train_epoch → evaluate_epoch (online kNN) → save (``metrics.csv`` / TensorBoard by rank 0,
full-state checkpoints every ``checkpoint.every_epochs`` and at the end, metrics reported to
Ray, which Tune/ASHA read). :func:`run_pretraining` is the driver (``simgraph pretrain`` and
``simgraph run``): hold the run dir's lock (:func:`components.runs.run_dir.writing_run`), check
the dataset, prepare or resume the run dir, fit, read back the history; each ``simgraph sweep``
trial holds its own run dir's lock the same way and builds its own trainer; ``simgraph
preview`` draws batches from :func:`~components.data.reader.train_views`, the workers' own
loader.

What Ray Train and Tune are handed (:func:`train_loop`, built into :func:`make_trainer`'s
trainer) and what a sweep's trial and confirmation functions call (:func:`make_trainer`,
:func:`loop_config`, :func:`train_in_trial`) are named by this module's path.

Fault injection for the resume tests (:data:`~components.runs.diagnostics.PAUSE_ENV`) and the
CUDA sync debug mode (:data:`~components.runs.diagnostics.SYNC_DEBUG_ENV`) are read once by
:func:`loop_config`, never inside the step loop: :mod:`components.runs.diagnostics`.

Where the recipe runs is its host (:mod:`components.runs.hosts`): a Ray Train worker, or — for a
one-worker sweep trial — the Tune trial actor itself (:func:`train_in_trial`).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from components.config import PretrainConfig, to_dict
from components.runs.checkpoints import latest_state
from components.runs.dataset_checks import RunFacts
from components.runs.diagnostics import PAUSE_ENV, SYNC_DEBUG_ENV, SYNC_DEBUG_MODES
from components.runs.errors import RunError
from components.runs.run_dir import writing_run
from components.runs.summary import run_summary
from components.runs.worker import PretrainRecipe
from components.runtime import console


class PretrainError(RunError):
    """Training started but did not finish; the message says where, and the last complete
    checkpoint stays in the run dir."""


def run_pretraining(cfg: PretrainConfig, echo: bool = True,
                    command: str = "pretrain") -> list[dict[str, Any]]:
    """Train (or resume) the run; returns its per-epoch metrics history. The driver of
    ``simgraph pretrain`` and ``simgraph run`` (``command``: which, for a refusal's words).

    1.-2. :func:`components.runs.run_dir.writing_run` (as every sweep trial): the run dir's
       one-writer lock, held until training ends (a second writer is refused in one line
       naming the first), a folder of someone else's files refused; then check the dataset dir
       against what the loss needs (labels, a class graph, captions) before any Ray work, and
       prepare the run dir ``storage/name``: a re-run with the same name must match
       ``config.yaml`` (except keys that may change on a resume) and the data it started on,
       and resumes from the latest complete checkpoint; a finished run is returned.
    3. Train: in this process for a local one-worker CPU run (:func:`trains_in_process`),
       else :func:`make_trainer`'s ``TorchTrainer`` on a local Ray started for the job or the
       ``RAY_ADDRESS`` cluster; ``FailureConfig(max_failures)`` restarts the group from the
       latest checkpoint.

    Raises:
        RunError: another process holds the run dir, bad dataset or run dir (checked before
            Ray starts).
        PretrainError: training failed (the message says where; the last good checkpoint
            stays in the run dir).
    """
    from components.io.storage import display

    with writing_run(cfg, command=command) as run:
        cfg, facts, run_dir, history = run.cfg, run.facts, run.run_dir, run.finished
        if history is not None:
            if echo:
                print(f"simgraph: run {cfg.name!r} is already complete ({len(history)} epochs)")
                print(history_table(history))
            return history
        if echo:
            print(run_summary(cfg, facts, display(run_dir)), flush=True)
        history = (_train_in_process if trains_in_process(cfg) else _train_on_ray)(
            cfg, facts, run_dir)
    if echo:
        print(history_table(history))
        print(f"run dir: {display(run_dir)}")
    return history


def _train_on_ray(cfg: PretrainConfig, facts: RunFacts, run_dir: str) -> list[dict[str, Any]]:
    """Fit :func:`make_trainer`'s ``TorchTrainer`` on a local Ray started for the job or the
    ``RAY_ADDRESS`` cluster; returns the run's history."""
    from components.errors import SimgraphError, root_cause
    from components.runs.checkpoint import TrainingState
    from components.runtime.session import check_placement, ray_session

    with ray_session(None):
        s = cfg.scaling  # a worker no node can hold: the numbers now, not Ray's timeout later
        check_placement(s.num_workers, s.cpus_per_worker, s.gpus_per_worker if s.use_gpu else 0,
                        s.placement_strategy)
        trainer = make_trainer(cfg, run_dir, facts)
        try:
            result = trainer.fit()
        except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error
            if not isinstance(root_cause(e), SimgraphError):
                # A bug (or the machine: CUDA, NCCL, memory): what a report needs is the
                # traceback, which Ray's text holds for every failed worker.
                sys.stderr.write(f"{e}\n")
            raise _training_failed(cfg, run_dir, e) from None
        finally:
            console.BAR.close()
    if result.checkpoint is None:
        raise PretrainError(f"run {cfg.name!r} finished without a checkpoint")
    with result.checkpoint.as_directory() as d:
        return TrainingState.load(d).history


def trains_in_process(cfg: PretrainConfig) -> bool:
    """Whether ``simgraph pretrain`` trains ``cfg`` in its own process (``scaling.host``; see
    :class:`~components.config.ScalingSection`): the worker group, its controller and a Ray
    start are most of a small run's start-up (docs/benchmarks.md)."""
    s = cfg.scaling
    if s.host != "auto":
        return s.host == "in_process"
    return (s.num_workers == 1 and not s.use_gpu and s.max_failures == 0
            and not os.environ.get("RAY_ADDRESS"))


def _train_in_process(cfg: PretrainConfig, facts: RunFacts,
                      run_dir: str) -> list[dict[str, Any]]:
    """The recipe without Ray, with an :class:`~components.runs.hosts.InProcess` host
    (checkpoints published and pruned as a Ray Train run's, resumed from the run dir's newest
    complete one); returns the run's history."""
    from components.errors import SimgraphError
    from components.runs.hosts import InProcess

    try:
        PretrainRecipe(loop_config(cfg, run_dir, facts),
                       host=InProcess(run_dir, cfg.checkpoint.keep)).run()
    except SimgraphError:
        raise
    except Exception as e:  # noqa: BLE001 - a bug (or the machine): keep its traceback
        traceback.print_exc()
        raise _training_failed(cfg, run_dir, e) from None
    state = latest_state(run_dir)
    if state is None:
        raise PretrainError(f"run {cfg.name!r} finished without a checkpoint")
    return state.history


def _training_failed(cfg: PretrainConfig, run_dir: str, e: BaseException) -> PretrainError:
    """The one line a failed training ends with, on either host."""
    from components.errors import describe
    from components.io.storage import display

    return PretrainError(f"training {cfg.name!r} failed: {describe(e)}\n"
                         f"completed checkpoints stay in {display(run_dir)}; re-run the same "
                         "command to resume")


def history_table(history: Sequence[dict[str, Any]]) -> str:
    """The per-epoch metrics as a fixed-width table."""
    cols = ["epoch", "loss", "lr", "knn_top1", "samples_per_s", "data_wait", "time_s"]
    if any("probe_top1" in row for row in history):  # the online linear probe ran
        cols.insert(4, "probe_top1")
    lines = [" ".join(f"{c:>13}" for c in cols)]
    for row in history:
        cells = []
        for c in cols:
            v = row.get(c, float("nan"))
            cells.append(f"{v:>13d}" if isinstance(v, int) else f"{v:>13.4g}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def make_trainer(cfg: PretrainConfig, run_dir: str, facts: RunFacts,
                 callbacks: Sequence[Any] = (), pause_at_step: int | None = None,
                 score: dict[str, Any] | None = None) -> Any:
    """The Ray Train V2 ``TorchTrainer`` for this run (same name + storage = resume).
    ``callbacks``: Ray Train callbacks, e.g. Tune's ``TuneReportCallback`` in a sweep trial.
    ``pause_at_step``: fault injection for tests (see :data:`PAUSE_ENV`; default: read it).
    ``score``: a sweep trial's score (see :func:`loop_config`)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from components.runs.init_checks import init_payload

    s = cfg.scaling
    resources: dict[str, float] = {"CPU": s.cpus_per_worker}
    if s.use_gpu:
        resources["GPU"] = s.gpus_per_worker
    config = loop_config(cfg, run_dir, facts, pause_at_step, live=console.live(), score=score)
    data = init_payload(facts.init)
    if data is not None:
        # model.init is a path on this node: workers on other nodes get the bytes this
        # process checked, once per node through the object store (not inside the config
        # Ray copies to every worker)
        config["init_weights"] = ray.put(data)
    return TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=s.num_workers, use_gpu=s.use_gpu, resources_per_worker=resources,
            placement_strategy=s.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=cfg.name,
            storage_path=cfg.storage,  # a path or URI, resolved by pyarrow as ours are
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=ray.train.FailureConfig(max_failures=s.max_failures),
            callbacks=list(callbacks),
        ),
    )


def loop_config(cfg: PretrainConfig, run_dir: str, facts: RunFacts,
                pause_at_step: int | None = None, live: bool = False,
                score: dict[str, Any] | None = None) -> dict[str, Any]:
    """What :class:`PretrainRecipe` is built from (plain containers: Ray ships it to workers).
    ``pause_at_step`` ``None``: read :data:`PAUSE_ENV` here, once. ``live``: rank 0 sends
    progress events for the driver's live bar (:func:`components.runtime.console.live`) instead of
    a progress line every :data:`~components.runs.diagnostics.PROGRESS_EVERY_S`. ``score``
    (sweep trials): ``metric``, ``mode`` and the :class:`~components.search_space.Statistic`
    fields ``name``, ``k``: every epoch's row gets ``sweep_score``, that statistic of the metric
    so far."""
    if pause_at_step is None:
        pause_at_step = int(os.environ.get(PAUSE_ENV, "0") or 0)
    sync_debug = os.environ.get(SYNC_DEBUG_ENV, "")
    if sync_debug not in SYNC_DEBUG_MODES:
        raise RunError(f"{SYNC_DEBUG_ENV}={sync_debug!r} is not allowed: choose one of "
                       f"{', '.join(m for m in SYNC_DEBUG_MODES if m)} or leave it unset")
    return {"config": to_dict(cfg), "run_dir": run_dir, "facts": facts.to_dict(),
            "pause_at_step": pause_at_step, "verbose": console.verbose(), "live": live,
            "cuda_sync_debug": sync_debug, "score": score}


def train_in_trial(cfg: PretrainConfig, run_dir: str, facts: RunFacts, metric: str,
                   score: dict[str, Any] | None = None) -> None:
    """Train one-worker ``cfg`` in this process, a Ray Tune trial actor
    (:class:`~components.runs.hosts.TuneTrial`: no Ray Train worker group): resumes from the
    run dir's newest complete checkpoint and reports every epoch to Tune, ``metric`` first."""
    from components.runs.hosts import TuneTrial

    if cfg.scaling.num_workers != 1:
        raise RunError(f"scaling.num_workers={cfg.scaling.num_workers} cannot train inside a "
                       "Tune trial: only one-worker runs can (use a Ray Train worker group)")
    host = TuneTrial(run_dir, cfg.checkpoint.keep, metric)
    PretrainRecipe(loop_config(cfg, run_dir, facts, score=score), host=host).run()


def train_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: :class:`PretrainRecipe` ``(loop_config).run()``."""
    PretrainRecipe(loop_config).run()
