"""Pretraining as a recipe over the library, run by Ray Train on every worker.

:func:`make_trainer` builds the Ray Train V2 ``TorchTrainer`` (gloo on CPU, NCCL on GPU; the
same run name + storage resumes); each worker runs :func:`train_loop`, i.e.
:class:`PretrainRecipe`: setup (device, FFCV reader for this rank's share, model in DDP,
optimiser and schedule, restore) → per epoch train_epoch → evaluate_epoch (online kNN) → save
(``metrics.csv`` / TensorBoard by rank 0, full-state checkpoints every
``checkpoint.every_epochs`` and at the end, metrics reported to Ray, which Tune/ASHA read).
:func:`run_pretraining` is the driver (``simgraph pretrain`` and ``simgraph run``): hold the run
dir's lock (:func:`components.runs.run_dir.writing_run`), check the dataset, prepare or resume the
run dir, fit, read back the history; each ``simgraph sweep`` trial holds its own run dir's lock
the same way and builds its own trainer; ``simgraph preview`` draws batches from
:func:`train_views`, the workers' own loader.

Fault injection for the resume tests: :data:`PAUSE_ENV` (``SIMGRAPH_PAUSE_AT_STEP=N``) in the
environment of the process that builds the trainer makes every rank sleep once before global
step N (a flag file in ``workers/`` stops it repeating after a restart); read once by
:func:`loop_config`, never inside the step loop.

Where the recipe runs is its host (:mod:`components.runs.hosts`): a Ray Train worker, or — for a
one-worker sweep trial — the Tune trial actor itself (:func:`train_in_trial`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import PretrainConfig, from_dict, to_dict
from components.io.files import atomic_open
from components.runs.hosts import RunHost, TrainWorker
from components.runs.run_dir import (
    METRICS_CSV,
    RunError,
    RunFacts,
    check_same_dataset,
    describe_changes,
    past_the_schedule,
    resume_changes,
    writing_run,
)
from components.runs.summary import run_summary
from components.runtime import console

if TYPE_CHECKING:
    from components.runs.checkpoint import TrainingState

PAUSE_ENV = "SIMGRAPH_PAUSE_AT_STEP"
PROGRESS_EVERY_S = 20.0  # rank 0 prints a progress line this often during a long epoch
# ``warn`` / ``error``: torch.cuda.set_sync_debug_mode in every GPU worker (read by
# loop_config in the process that builds the trainer), to find host syncs in the step.
SYNC_DEBUG_ENV = "SIMGRAPH_CUDA_SYNC_DEBUG"
SYNC_DEBUG_MODES = ("", "default", "warn", "error")


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
    from components.runs.run_dir import latest_state

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
    import ray.train
    from ray.train.torch import TorchTrainer

    s = cfg.scaling
    resources: dict[str, float] = {"CPU": s.cpus_per_worker}
    if s.use_gpu:
        resources["GPU"] = s.gpus_per_worker
    return TorchTrainer(
        train_loop,
        train_loop_config=loop_config(cfg, run_dir, facts, pause_at_step, live=console.live(),
                                      score=score),
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
    a progress line every :data:`PROGRESS_EVERY_S`. ``score`` (sweep trials): ``metric``,
    ``mode`` and the :class:`~components.search_space.Statistic` fields ``name``, ``k``:
    every epoch's row gets ``sweep_score``, that statistic of the metric so far."""
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


def train_views(cfg: PretrainConfig, info: Any, rank: int, world: int, device: Any,
                with_captions: bool, batched_augment: bool | None = None) -> Any:
    """The training ``ViewLoader`` of one rank: what every worker reads (``simgraph preview``
    draws its batches from this same function). ``batched_augment``: see ``ViewLoader``."""
    from components.data.reader import ViewLoader

    d = cfg.data
    return ViewLoader(
        info.split_file("train"), batch_size=d.batch_size, views=d.views, augment=d.augment,
        train=True, seed=cfg.train.seed, rank=rank, world_size=world, device=device,
        num_workers=d.num_workers, drop_last=True, os_cache=d.os_cache,
        with_captions=with_captions, max_batches=cfg.train.steps_per_epoch,
        batched_augment=batched_augment,
    )


# ---------------------------------------------------------------------------------------------
# The recipe: what one Ray Train worker does.


class PretrainRecipe:
    """One worker's pretraining, in the order it runs: :meth:`setup` (device, data, model,
    optimiser, restore from Ray's checkpoint), then per epoch :meth:`train_epoch` →
    :meth:`evaluate_epoch` (online kNN) → :meth:`save` (metrics, checkpoint, report to Ray),
    then :meth:`cleanup`. :func:`train_loop` is ``PretrainRecipe(loop_config).run()``.

    ``loop_config``: ``config`` (a :class:`PretrainConfig` as a dict), ``run_dir``, ``facts``
    (a :class:`RunFacts` as a dict), ``pause_at_step`` (test fault injection; 0 = off).
    """

    def __init__(self, loop_config: dict[str, Any], host: RunHost | None = None) -> None:
        self.host = host  # None: a Ray Train worker (made in setup, inside Ray Train)
        self.cfg = from_dict(PretrainConfig, loop_config["config"])
        self.run_dir = str(loop_config["run_dir"])
        self.facts = RunFacts(**loop_config["facts"])
        self.pause_at_step = int(loop_config.get("pause_at_step", 0))
        self.live = bool(loop_config.get("live", False))
        self.cuda_sync_debug = str(loop_config.get("cuda_sync_debug", ""))
        self.score: dict[str, Any] | None = loop_config.get("score")
        console.set_verbose(bool(loop_config.get("verbose", False)))

    # -- setup ---------------------------------------------------------------------------------

    def setup(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from components.data.reader import DatasetInfo, set_jit
        from components.data.staging import local_dataset
        from components.training.optim import build_for_run
        from components.training.step import build_model, compile_encoder, uses_projector

        cfg, facts = self.cfg, self.facts
        if self.host is None:
            self.host = TrainWorker(self.run_dir)
        host = self.host
        self.rank, self.world = host.rank, host.world
        device = self.device = host.device()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # before the first collective on NCCL
            if self.cuda_sync_debug:  # bench/gpu_acceptance.py: report host syncs
                torch.cuda.set_sync_debug_mode(self.cuda_sync_debug)
        set_jit(cfg.data.jit)
        # The step, the kNN and the reader's torch ops run on the worker's CPUs (FFCV no longer
        # resets this process-wide count to data.num_workers: components.data.ffcv_import).
        torch.set_num_threads(max(1, math.floor(cfg.scaling.cpus_per_worker)))

        # A URI, or data.stage: read a node-local copy (made once per node, verified).
        self.info = DatasetInfo.load(local_dataset(cfg.data.dataset, cfg.data.stage,
                                                   cfg.data.stage_dir))
        gpu_paths = self.gpu_paths(device)
        # First, before this worker writes anything into the run dir (its worker record).
        self.train_loader = self._open_train_split(gpu_paths)
        # train.amp as this worker's device takes it (`auto` resolved once, not per step)
        self.amp = _worker_info(self.run_dir, self.rank, self.world, device,
                                host.ray_node_ranks(), cfg.train.amp)["amp"]
        self.train_cfg = dataclasses.replace(cfg.train, amp=self.amp)

        sim = self.info.class_similarity()
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        model, ema = build_model(
            cfg.model, cfg.loss, facts.num_classes,
            None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
            facts.caption_dim,
        )
        model.channels_last = gpu_paths and cfg.model.channels_last
        if gpu_paths and cfg.model.sync_bn and self.world > 1:
            # BatchNorm over the global batch without SyncBatchNorm's host syncs (docs/gpu.md);
            # its running-mean shift stays equal on every rank: each applies the same update
            from components.runtime.distributed import convert_global_batchnorm

            model.encoder = convert_global_batchnorm(model.encoder)
        model.to(device)
        if model.channels_last:
            model.to(memory_format=torch.channels_last)
        if cfg.train.compile:
            compile_encoder(model)
        if ema is not None:
            ema.to(device)
            if model.channels_last:  # a copy made before the conversion: the model's layout
                ema.to(memory_format=torch.channels_last)
        self.model, self.ema = model, ema

        self.steps_per_epoch = len(self.train_loader)
        self.total_steps = self.steps_per_epoch * cfg.train.epochs
        self.global_batch = cfg.data.batch_size * self.world
        self.optimizer, self.scheduler = build_for_run(
            model, cfg.optim, self.global_batch, self.steps_per_epoch, cfg.train.epochs)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == "fp16" else None

        self.start_epoch, self.step = 0, 0
        # Samples seen at step `start_step` (a resume's): a checkpoint's samples are
        # these + (step - start_step) x global batch (no per-step bookkeeping)
        self.start_samples, self.start_step = 0, 0
        self.history: list[dict[str, Any]] = []
        with host.latest_checkpoint() as ckpt_dir:
            self.restore(ckpt_dir)

        self.ddp: torch.nn.Module = model
        if self.world > 1:
            unused = not uses_projector(model.objective)
            if unused and not console.verbose():
                # Expected (CoNe: the projector is unused only until its bank fills); DDP warns
                # once the bank is full and every parameter has a gradient.
                warnings.filterwarnings("ignore", message=".*find_unused_parameters=True was "
                                        "specified in DDP constructor")
            self.ddp = DistributedDataParallel(
                model, find_unused_parameters=unused,
                # BN statistics are averaged before eval / saving; the memory bank is identical
                # on every rank: no per-step buffer broadcast.
                forward_sync_buffers=False,
            )
        self.knn_loaders: tuple[Any, Any] | None = None
        self.log = _RunLog(self.run_dir, self.start_epoch, cfg) if self.rank == 0 else None
        if self.rank == 0 and facts.knn and cfg.knn.every_epochs:
            from components.evaluation.knn import KnnRule

            rule = KnnRule.of(cfg.knn)  # the rule `evaluate` and a sweep's confirmation use
            n = facts.splits.get(cfg.knn.bank_split, rule.k)
            console.say(f"[simgraph] online {rule.describe(cfg.knn.query_split, rule.k_for(n))}"
                        f" (knn_top1), every {cfg.knn.every_epochs} epoch(s) and after the last")

    def _open_train_split(self, gpu_paths: bool) -> Any:
        """This rank's training loader (:func:`train_views`), opened only once the dataset dir
        is still the one the run started on (:func:`components.data.integrity.verify_identity`
        against :attr:`RunFacts.dataset`, which the driver took at the run's start).

        The loader opens (maps) its split file here, at every start of a worker — the first,
        a Ray Train restart after a worker failure, a resume — and keeps that file for the
        run; a ``simgraph preprocess --overwrite`` swapped in since the run started would
        otherwise be trained on while the checkpoints record the old dataset.

        Raises:
            DatasetError: no manifest now, or another dataset (one line: what changed and
                what to do).
        """
        from components.data.integrity import verify_identity

        verify_identity(str(self.info.root), self.facts.dataset, self.cfg.name,
                        "the training loader")
        return train_views(self.cfg, self.info, self.rank, self.world, self.device,
                           self.facts.needs_captions, batched_augment=gpu_paths)

    def gpu_paths(self, device: Any) -> bool:
        """Whether to take the GPU's code paths (batched augmentation on the device,
        channels_last, global BatchNorm): on CUDA. Tests override it to run them on CPU."""
        return bool(device.type == "cuda")

    def restore(self, ckpt_dir: Path | None) -> None:
        """Load the full state of the host's latest checkpoint (``None``: a fresh start)."""
        from components.runs.checkpoint import CheckpointError, TrainingState

        if ckpt_dir is None:
            return
        state = TrainingState.load(ckpt_dir, map_location=self.device)
        # Whatever host gave the checkpoint (Ray's snapshot, the run dir): the same data.
        check_same_dataset(self.cfg.name, self.cfg.data.dataset, state.dataset,
                           self.facts.dataset)
        self.model.load_state_dict(state.model)
        if self.ema is not None:
            if state.ema is None:
                raise CheckpointError(f"checkpoint {ckpt_dir} holds no EMA encoder, which loss "
                                      f"{self.cfg.loss.name!r} needs")
            self.ema.load_state_dict(state.ema)
        # this run's base LRs (its shape, its optim.lr), before the checkpoint's replace them
        fresh_lrs = [float(b) for b in self.scheduler.base_lrs]
        self.optimizer.load_state_dict(state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        if self.scaler is not None and state.scaler:
            self.scaler.load_state_dict(state.scaler)
        self.start_epoch = state.epoch
        self.history = state.history
        self.step = self._continue_schedule(state, fresh_lrs)
        self.start_samples, self.start_step = state.samples_seen(), self.step
        if self.rank == 0:
            console.say(f"[simgraph] resumed {self.cfg.name!r} after epoch {self.start_epoch} "
                        f"(step {self.step})")

    def _continue_schedule(self, state: TrainingState, fresh_lrs: list[float]) -> int:
        """Elastic resume: re-place the restored optimizer and schedule where a run started
        with this config and cluster shape is after the samples the checkpoint has seen
        (:func:`~components.training.optim.continue_schedule`); returns that step, this run's global
        step from now on. One mechanism for what may change on a resume and moves the LR:
        ``scaling.num_workers`` (the global batch: ``optim.lr_scaling``'s base LR, the steps
        per epoch, warm-up and decay lengths), ``optim.lr`` (a diverged run lowers it),
        ``train.epochs`` (the decay's length). Unchanged, it rewrites the restored values
        with themselves.

        Raises:
            RunError: the samples seen are past the end of this shape's schedule (before any
                step; names what changed and how to go on).
        """
        from components.training.optim import continue_schedule, schedule_position

        samples = state.samples_seen()
        step = schedule_position(samples, self.global_batch)
        changed = resume_changes(state.config, self.cfg)
        if step > self.total_steps:
            raise RunError(past_the_schedule(self.cfg, samples, changed, self.global_batch,
                                             self.total_steps))
        lrs = continue_schedule(self.optimizer, self.scheduler, fresh_lrs, step)
        moved = [c for c in changed if c[0] != "train.epochs"]
        if self.rank == 0 and (moved or step != state.step):
            console.say(f"[simgraph] resuming with {describe_changes(changed) or 'this shape'}: "
                        f"{samples} samples seen = step {step} of this run's "
                        f"{self.total_steps} ({self.steps_per_epoch} per epoch, global batch "
                        f"{self.global_batch}); LR {lrs[0]:.6g} (base {fresh_lrs[0]:.6g}, "
                        f"optim.lr_scaling {self.cfg.optim.lr_scaling}), as a run started "
                        "with this config has there")
        return step

    def way_back(self) -> str:
        """What a run that diverged can go back to (the run dir's newest complete finite
        checkpoint, by its path) and what to change before re-running — only settings a resume
        may change (:data:`components.runs.run_dir.RESUMABLE_CHANGES`). Rank 0's words; other ranks
        say less (their message is not the one shown)."""
        from components.io.storage import display
        from components.runs.checkpoint import CheckpointUnreadable
        from components.runs.run_dir import latest_complete

        cfg = self.cfg
        change = f"lower optim.lr (now {cfg.optim.lr:g})"
        amp = getattr(self, "amp", cfg.train.amp)
        if amp == "fp16":
            change += ", use train.amp=bf16 where the GPU has it (else none)"
        elif amp == "bf16":
            change += ", use train.amp=none"
        if cfg.train.grad_clip is None:
            change += ", set train.grad_clip (e.g. 1.0)"
        change += " or raise the temperature"
        if self.rank != 0:
            return f"see rank 0's message for the checkpoint to go back to; {change}"
        try:
            found = latest_complete(self.run_dir)
        except CheckpointUnreadable as e:
            return f"its checkpoints could not be checked ({e}); {change}"
        if found is None:
            return (f"no checkpoint was saved before it diverged: re-running the same command "
                    f"starts it again from scratch; first {change}")
        return (f"the last good checkpoint is {display(found[1])} (epoch {found[0]}): "
                f"re-running the same command resumes from it; to keep it from diverging "
                f"again, {change} (these may change on a resume)")

    # -- one epoch -----------------------------------------------------------------------------

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Every step of ``epoch`` (0-based); its metrics row (loss parts, lr, throughput,
        data-wait fraction)."""
        import torch

        from components.runtime import distributed
        from components.training.step import (
            NonFiniteLossError,
            SkipGuard,
            SkippedStep,
            StepState,
            seed_everything,
            sync_buffers,
            train_step,
        )

        cfg, n = self.cfg, self.steps_per_epoch
        seed_everything(cfg.train.seed, epoch, self.rank)
        self.train_loader.set_epoch(epoch)
        self.model.train()
        acc, wait, t0 = StepState(), DataWait(self.device), time.perf_counter()
        skips = SkipGuard()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        shown = t0  # rank 0's last progress line / event
        every = console.LIVE_EVERY_S if self.live else PROGRESS_EVERY_S
        last_lr = float(self.optimizer.param_groups[0]["lr"])
        batches = iter(self.train_loader)
        for i in range(n):
            if self.step + 1 == self.pause_at_step:
                _pause_once(self.run_dir, self.rank, self.step + 1)
            batch = wait.next(batches)
            where = (f"epoch {epoch + 1} step {i + 1}/{n} (global step {self.step + 1}) of "
                     f"run {cfg.name!r}")
            try:
                metrics = train_step(
                    self.ddp, self.ema, self.optimizer, self.scheduler, self.scaler, batch,
                    train_cfg=self.train_cfg, device=self.device, step=self.step,
                    total_steps=self.total_steps,
                    ema_momentum=getattr(cfg.loss, "ema_momentum", 0.996), where=where)
            except SkippedStep as e:  # fp16 overflow on every rank: the guard may stop the run
                self.step += 1
                try:
                    skips.skipped(e, where)
                except NonFiniteLossError as stop:
                    raise NonFiniteLossError(f"{stop}; {self.way_back()}") from None
                continue
            except NonFiniteLossError as e:  # the optimizer has not stepped: nothing to undo
                raise NonFiniteLossError(f"{e}; {self.way_back()}") from None
            skips.ok()
            self.step += 1
            last_lr = metrics.pop("lr")
            acc.add(metrics)
            if self.rank == 0 and self.step % cfg.train.log_every_steps == 0:
                console.say(f"[simgraph] epoch {epoch + 1} step {i + 1}/{n} "
                            f"loss {metrics['loss']:.4f} lr {last_lr:.6g}")
            now = time.perf_counter()
            if self.rank == 0 and now - shown >= every and i + 1 < n:
                shown, done = now, now - t0
                ips = (i + 1) * cfg.data.batch_size * self.world / done
                loss = float(metrics["loss"])
                console.say(console.progress_event(epoch + 1, cfg.train.epochs, i + 1, n, loss,
                                                   ips) if self.live else
                            console.progress_line(epoch + 1, cfg.train.epochs, i + 1, n, loss,
                                                  ips, done * (n - i - 1) / (i + 1)))
        for _ in batches:  # let FFCV finish the epoch's order (nothing left: exact count)
            pass
        elapsed = time.perf_counter() - t0
        sync_buffers(self.model)
        if self.ema is not None:  # its BN statistics are copies of this rank's, before the sync
            sync_buffers(self.ema)
        row: dict[str, Any] = {"epoch": epoch + 1, "step": self.step, **acc.summary()}
        row["lr"] = last_lr  # of the epoch's last step
        if self.scaler is not None:
            row["skipped_steps"] = skips.total  # fp16 overflow
        row["samples_per_s"] = n * cfg.data.batch_size * self.world / elapsed
        # On the device: NCCL refuses host tensors in a collective.
        row["data_wait"] = distributed.mean_over_ranks(
            torch.tensor([wait.seconds() / elapsed], device=self.device))
        if self.device.type == "cuda":  # this rank's peak over the epoch (the largest rank's
            # matters for an out-of-memory error; rank 0's is what metrics.csv shows)
            row["gpu_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        row["time_s"] = elapsed
        return row

    def evaluate_epoch(self, epoch: int, row: dict[str, Any]) -> None:
        """The online kNN top-1 (``knn_top1`` in ``row``, its wall time ``eval_s``) on the
        epochs ``knn.every_epochs`` names and the last one, when the dataset allows it
        (:attr:`RunFacts.knn`)."""
        from components.data.reader import ViewLoader
        from components.evaluation.knn import KnnRule
        from components.training.step import extract_features

        cfg, d = self.cfg, self.cfg.data
        if not self.facts.knn or not ((epoch + 1) % cfg.knn.every_epochs == 0
                                      or epoch + 1 == cfg.train.epochs):
            return
        if self.knn_loaders is None:
            from components.data.integrity import verify_identity

            # A rebuild swapped in since the run started is refused, never scored on.
            verify_identity(str(self.info.root), self.facts.dataset, cfg.name,
                            "the kNN evaluation")
            self.knn_loaders = tuple(  # type: ignore[assignment]
                ViewLoader(self.info.split_file(s), batch_size=d.batch_size, views=1,
                           augment=d.augment, train=False, rank=self.rank,
                           world_size=self.world, device=self.device,
                           num_workers=d.num_workers, drop_last=False, os_cache=d.os_cache,
                           with_captions=False)
                for s in (cfg.knn.bank_split, cfg.knn.query_split)
            )
        assert self.knn_loaders is not None
        t0 = time.perf_counter()
        encoder = self.model.encoder
        bank = extract_features(encoder, self.knn_loaders[0], self.device, self.amp)
        queries = extract_features(encoder, self.knn_loaders[1], self.device, self.amp)
        correct, total = KnnRule.of(cfg.knn).sharded_correct(bank, queries,
                                                             self.facts.num_classes)
        p = correct / total
        row["knn_top1"] = p
        # Its standard error over the query images (binomial): how far apart two epochs'
        # values must be before they differ.
        row["knn_top1_se"] = math.sqrt(p * (1 - p) / total)
        row["knn_queries"] = total
        row["eval_s"] = time.perf_counter() - t0

    def save(self, epoch: int, row: dict[str, Any]) -> None:
        """Append ``row`` to the history and metrics; report it to the host, with a full-state
        checkpoint every ``checkpoint.every_epochs`` epochs and after the last."""
        cfg, host = self.cfg, self.host
        assert host is not None  # set by setup
        self.history.append(row)
        if self.score is not None:  # a sweep trial: its score so far (what Tune ranks)
            from components.search_space import SCORE, score_history

            value = score_history(self.history, self.score)[-1]
            if value is not None:
                row[SCORE] = value
        if self.log is not None:
            self.log.write(self.history)
        last = epoch + 1 == cfg.train.epochs
        if not ((epoch + 1) % cfg.checkpoint.every_epochs == 0 or last):
            host.report(row, None, None)
            return
        state = checkpoint_state(
            cfg, model=self.model, ema=self.ema, optimizer=self.optimizer,
            scheduler=self.scheduler, scaler=self.scaler, epoch=epoch + 1,
            step=self.step, history=self.history, dataset=self.facts.dataset,
            samples=self.start_samples + (self.step - self.start_step) * self.global_batch,
        )
        self._check_finite(state)
        from components.runs.checkpoint import CheckpointWriteError

        try:
            with tempfile.TemporaryDirectory(prefix="simgraph-ckpt-") as tmp:
                ckpt = None
                if self.rank == 0:
                    state.save(tmp, checked=True)
                    ckpt = tmp
                host.report(row, ckpt, epoch + 1)
        except CheckpointWriteError as e:  # a full disk: one line, the older ones kept
            raise CheckpointWriteError(f"checkpoint after epoch {epoch + 1} not saved: {e}; "
                                       f"{self._kept()}") from None

    def _check_finite(self, state: TrainingState) -> None:
        """Refuse to checkpoint a diverged state (the loss is checked before each step, the
        weights only here: once per checkpoint, never per step). Every rank checks its copy
        (DDP keeps them equal) and, with several, one all-reduce of a flag makes them stop
        together.

        Raises:
            NonFiniteState: names what is not finite, the checkpoint to go back to and what
                to change (:meth:`way_back`); nothing was written or pruned.
        """
        import torch

        from components.runs.checkpoint import NonFiniteState
        from components.runtime import distributed

        bad = state.nonfinite()
        diverged = bool(bad)
        if self.world > 1:
            flag = torch.tensor([float(diverged)], device=self.device)
            diverged = bool(distributed.all_reduce_sum(flag).item() > 0)
        if diverged:
            where = ", ".join(bad) if bad else "another rank's copy"
            raise NonFiniteState(
                f"run {self.cfg.name!r} diverged: its state after epoch {state.epoch} (step "
                f"{state.step}) is not finite (NaN or inf in {where}), so it was not saved "
                f"and no checkpoint was pruned; {self.way_back()}")

    def _kept(self) -> str:
        """What is left after a failed checkpoint write, and how to go on."""
        from components.io.storage import display
        from components.runs.run_dir import latest_complete

        try:
            found = latest_complete(self.run_dir)
        except Exception:  # noqa: BLE001 - the storage failing too: say less
            found = None
        kept = ("the run dir's older checkpoints are intact" if found is None else
                f"the run dir's older checkpoints are intact (newest: {display(found[1])})")
        return f"{kept}; re-run the same command once there is room to resume"

    def cleanup(self) -> None:
        if self.log is not None:
            self.log.close()

    def run(self) -> None:
        self.setup()
        epochs, t0 = self.cfg.train.epochs, time.perf_counter()
        for epoch in range(self.start_epoch, epochs):
            row = self.train_epoch(epoch)
            self.evaluate_epoch(epoch, row)
            self.save(epoch, row)
            if self.rank == 0:
                per_epoch = (time.perf_counter() - t0) / (epoch + 1 - self.start_epoch)
                console.say(console.epoch_line(row, epochs, per_epoch * (epochs - epoch - 1)))
        self.cleanup()


def checkpoint_state(cfg: PretrainConfig, *, model: Any, ema: Any, optimizer: Any,
                     scheduler: Any, scaler: Any, epoch: int, step: int,
                     history: list[dict[str, Any]], dataset: dict[str, Any],
                     samples: int | None = None) -> TrainingState:
    """What a checkpoint holds: the full training state after ``epoch`` epochs (``samples``:
    the training samples consumed, all ranks), the history, the dataset identity and the
    run's config — without the credentials of any URI in it
    (:func:`components.io.storage.redacted`), as in ``config.yaml``."""
    from components.io.storage import redacted
    from components.runs.checkpoint import TrainingState

    return TrainingState(
        model=model.state_dict(), ema=None if ema is None else ema.state_dict(),
        optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
        scaler=None if scaler is None else scaler.state_dict(),
        epoch=epoch, step=step, history=history, seed=cfg.train.seed,
        config=redacted(to_dict(cfg)), dataset=dataset, samples=samples,
    )


def train_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: :class:`PretrainRecipe` ``(loop_config).run()``."""
    PretrainRecipe(loop_config).run()


class DataWait:
    """Seconds an epoch's steps waited for their batches.

    CPU: wall time inside ``next()``. CUDA: the time the *GPU* sat idle between the end of
    one step's queued work and the start of the next step's (two events on the current
    stream around ``next()``, read once at the end of the epoch): the work of the previous
    step is still running while the host waits for the loader (FFCV's thread waits on the GPU
    before it reuses a buffer), so the host's wall time would count GPU compute as waiting.
    """

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"
        self.host_s = 0.0
        self.events: list[tuple[Any, Any]] = []

    def next(self, batches: Any) -> Any:
        if not self.cuda:
            t = time.perf_counter()
            batch = next(batches)
            self.host_s += time.perf_counter() - t
            return batch
        import torch

        done = torch.cuda.Event(enable_timing=True)
        done.record()
        batch = next(batches)
        ready = torch.cuda.Event(enable_timing=True)
        ready.record()
        self.events.append((done, ready))
        return batch

    def seconds(self) -> float:
        if not self.cuda:
            return self.host_s
        if not self.events:
            return 0.0
        self.events[-1][1].synchronize()  # once per epoch
        return sum(a.elapsed_time(b) for a, b in self.events) / 1000.0


class _RunLog:
    """Rank 0's ``metrics.csv`` (rewritten from the history, so a resumed run never keeps rows
    of epochs it redid) and TensorBoard events (purged from the resume epoch on), written
    locally and published to a URI run dir after every epoch (:class:`LocalMirror`)."""

    def __init__(self, run_dir: str, start_epoch: int, cfg: PretrainConfig) -> None:
        from tensorboardX import SummaryWriter

        from components.io.storage import LocalMirror

        self.mirror = LocalMirror(run_dir)
        self.tb = SummaryWriter(str(self.mirror.local / "tb"), purge_step=start_epoch + 1)
        self.mlflow = None
        t = cfg.tracking
        if t.mlflow:
            from components.training.tracking import MLflowRun

            self.mlflow = MLflowRun(self.mirror.local, cfg.name, to_dict(cfg), t.mlflow_uri,
                                    t.mlflow_experiment)
        self.wandb = None
        if t.wandb:
            from components.training.tracking import WandbRun

            self.wandb = WandbRun(self.mirror.local, cfg.name, to_dict(cfg), t.wandb_project,
                                  t.wandb_mode)

    def write(self, history: list[dict[str, Any]]) -> None:
        keys: list[str] = []
        for row in history:
            keys += [k for k in row if k not in keys]
        with atomic_open(self.mirror.local / METRICS_CSV, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(history)
        row = history[-1]
        for k, v in row.items():
            if k != "epoch" and isinstance(v, int | float):
                self.tb.add_scalar(k, v, row["epoch"])
        self.tb.flush()
        if self.mlflow is not None:
            self.mlflow.log_epoch(row)
        if self.wandb is not None:
            self.wandb.log_epoch(row)
        self.mirror.sync()

    def close(self) -> None:
        """After the last epoch (the recipe's cleanup; a failed run never gets here, so its
        MLflow run stays RUNNING until a resume finishes it)."""
        if self.mlflow is not None:
            self.mlflow.finish()
        if self.wandb is not None:
            self.wandb.finish()
        self.tb.close()
        self.mirror.close()


def _pause_once(run_dir: str, rank: int, step: int, seconds: float = 300.0) -> None:
    from components.io import storage

    flag = storage.join(run_dir, "workers", f"paused-rank{rank}-step{step}")
    if not storage.exists(flag):
        storage.write_text(flag, "")
        time.sleep(seconds)


def _worker_info(run_dir: str, rank: int, world: int, device: Any,
                 ray_ranks: tuple[int, int] | None, amp: str = "none") -> dict[str, Any]:
    """``workers/rank<r>.json``: where each rank runs (pid, node, device, the precision
    ``train.amp`` gives there) — for operators and for tests that kill a worker or check
    placement.

    The node / local ranks are computed from Ray node ids (:func:`~components.runtime.distributed.
    node_layout`), not taken from Ray Train, which ranks nodes by IP: nodes sharing an IP
    would all be node 0 (``ray_ranks``: Ray Train's, kept for comparison; ``None`` outside Ray
    Train). The device is the host's (:mod:`components.runs.hosts`: this worker's GPU ids within
    ``CUDA_VISIBLE_DEVICES``), checked against what this node has.

    Raises:
        RunError: the device index Ray gave does not exist on this node.
    """
    import ray
    import torch

    from components.io.paths import project_root
    from components.runtime import distributed

    # Outside Ray (a host in a test or a plain process): one node.
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    layout = distributed.node_layout(distributed.all_node_ids(node_id), rank)
    ray_node, ray_local = ray_ranks or (layout["node_rank"], layout["local_rank"])
    info = {
        "rank": rank, "world_size": world, "pid": os.getpid(), "host": socket.gethostname(),
        "node_id": node_id, **layout, "ray_node_rank": ray_node, "ray_local_rank": ray_local,
        # Outside Ray (a test's host) get_gpu_ids() would start a local Ray instance.
        "device": str(device),
        "backend": (torch.distributed.get_backend()
                    if torch.distributed.is_available() and torch.distributed.is_initialized()
                    else None),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else [],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "code": str(project_root()),  # which copy of the project runs (a job's working_dir)
        "started": time.time(),
    }
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise RunError(
            f"rank {rank} on node {node_id} was given {device} but sees "
            f"{torch.cuda.device_count()} GPUs (CUDA_VISIBLE_DEVICES="
            f"{info['cuda_visible_devices']!r}); do not set CUDA_VISIBLE_DEVICES yourself")
    from components.training.step import resolve_amp

    info["amp"] = resolve_amp(amp, device)  # what `auto` became on this worker's device
    if (info["ray_node_rank"], info["ray_local_rank"]) != (layout["node_rank"],
                                                           layout["local_rank"]):
        console.say(f"[simgraph] rank {rank}: Ray Train says node_rank {info['ray_node_rank']} / "
                    f"local_rank {info['ray_local_rank']} (it ranks nodes by IP), node ids say "
                    f"{layout['node_rank']} / {layout['local_rank']}")
    from components.io import storage

    storage.write_text(storage.join(run_dir, "workers", f"rank{rank}.json"), json.dumps(info))
    return info
