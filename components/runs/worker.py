"""The recipe: what one worker does (:class:`PretrainRecipe`, on whichever host
:mod:`components.runs.hosts` gives it: a Ray Train worker, a Tune trial actor, this process):
setup (device, FFCV reader for this rank's share via
:func:`~components.data.reader.train_views`, model in DDP, optimiser and schedule, restore)
→ per epoch train_epoch → evaluate_epoch (online kNN and linear probe) → save
(``metrics.csv`` / TensorBoard by rank 0 through :class:`~components.runs.run_log.RunLog`,
full-state checkpoints every ``checkpoint.every_epochs`` and at the end:
:func:`~components.runs.checkpoint.checkpoint_state`, metrics reported to the host, which
Tune/ASHA read). Where it is started from: :mod:`components.runs.recipe`."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import PretrainConfig, from_dict
from components.runs.checkpoints import latest_complete
from components.runs.dataset_checks import RunFacts, check_same_dataset
from components.runs.diagnostics import PROGRESS_EVERY_S, DataWait, pause_once, worker_info
from components.runs.errors import RunError
from components.runs.hosts import RunHost, TrainWorker
from components.runs.resume import describe_changes, past_the_schedule, resume_changes
from components.runs.run_log import RunLog
from components.runtime import console

if TYPE_CHECKING:
    from components.runs.checkpoint import TrainingState
    from components.training.online_probe import OnlineProbe


# ---------------------------------------------------------------------------------------------
# The recipe: what one Ray Train worker does.


class PretrainRecipe:
    """One worker's pretraining, in the order it runs: :meth:`setup` (device, data, model,
    optimiser, restore from Ray's checkpoint), then per epoch :meth:`train_epoch` →
    :meth:`evaluate_epoch` (online kNN) → :meth:`save` (metrics, checkpoint, report to Ray),
    then :meth:`cleanup`. :func:`components.runs.recipe.train_loop` is
    ``PretrainRecipe(loop_config).run()``.

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
        # model.init's bytes as the driver read them (an ObjectRef from make_trainer, or the
        # bytes): a worker on another node has no file at that path. None: read the path.
        self.init_weights: Any = loop_config.get("init_weights")
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
        self.amp = worker_info(self.run_dir, self.rank, self.world, device,
                                host.ray_node_ranks(), cfg.train.amp)["amp"]
        self.train_cfg = dataclasses.replace(cfg.train, amp=self.amp)

        sim = self.info.class_similarity()
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
        model, ema = build_model(
            cfg.model, cfg.loss, facts.num_classes,
            None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
            facts.caption_dim, cfg.data.augment.resolution,
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
        # probe.every_epochs > 0: the online linear probe (the driver refused it on a dataset
        # without labels), zero-initialised: built before restore, which loads its state
        self.probe: OnlineProbe | None = None
        if cfg.probe.every_epochs:
            from components.training.online_probe import OnlineProbe

            self.probe = OnlineProbe(model.encoder.feat_dim, facts.num_classes,
                                     lr=cfg.probe.lr, weight_decay=cfg.probe.weight_decay,
                                     device=device)

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
        self.eval_loaders: dict[str, Any] = {}  # split -> its unaugmented loader (kNN, probe)
        self.log = RunLog(self.run_dir, self.start_epoch, cfg) if self.rank == 0 else None
        if self.rank == 0 and facts.knn and cfg.knn.every_epochs:
            from components.evaluation.knn import KnnRule

            rule = KnnRule.of(cfg.knn)  # the rule `evaluate` and a sweep's confirmation use
            n = facts.splits.get(cfg.knn.bank_split, rule.k)
            console.say(f"[simgraph] online {rule.describe(cfg.knn.query_split, rule.k_for(n))}"
                        f" (knn_top1), every {cfg.knn.every_epochs} epoch(s) and after the last")
        if self.rank == 0 and self.probe is not None:
            p = cfg.probe
            console.say(f"[simgraph] online linear probe on the backbone features (AdamW, lr "
                        f"{p.lr:g}, weight decay {p.weight_decay:g}), top-1 on "
                        f"{p.split_of(cfg.knn)!r} (probe_top1), every {p.every_epochs} "
                        "epoch(s) and after the last")

    def _open_train_split(self, gpu_paths: bool) -> Any:
        """This rank's training loader (:func:`~components.data.reader.train_views`), opened
        only once the dataset dir is still the one the run started on
        (:func:`components.data.integrity.verify_identity` against :attr:`RunFacts.dataset`,
        which the driver took at the run's start).

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
        from components.data.reader import train_views

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
            self.load_init()
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
        if self.probe is not None:
            if state.probe is not None:
                self.probe.load_state_dict(state.probe)
                self.probe.set_hyperparameters(self.cfg.probe.lr, self.cfg.probe.weight_decay)
            elif self.rank == 0:
                console.say(f"[simgraph] checkpoint {ckpt_dir.name} holds no online probe "
                            "(saved before the probe existed or with probe.every_epochs 0): "
                            "the probe starts fresh")
        self.start_epoch = state.epoch
        self.history = state.history
        self.step = self._continue_schedule(state, fresh_lrs)
        self.start_samples, self.start_step = state.samples_seen(), self.step
        if self.rank == 0:
            console.say(f"[simgraph] resumed {self.cfg.name!r} after epoch {self.start_epoch} "
                        f"(step {self.step})")

    def load_init(self) -> None:
        """A fresh start with ``model.init``: the file's tensors into the encoder's backbone
        (and projector) and the EMA copy's, before the first step
        (:func:`components.models.init_weights.load_init`; the driver checked its keys and
        recorded its sha256, :mod:`components.runs.init_checks`). On Ray Train the bytes come
        from the driver (``init_weights``: a worker's node need not hold the file); in the
        process that checked it, from the path. A resume never reads it.

        Raises:
            InitWeightsError: the file no longer fits (one line naming it).
            RunError: the file changed since the driver checked it.
        """
        path = self.cfg.model.init
        if not path:
            return
        import hashlib

        from components.io.files import sha256_file
        from components.models.init_weights import load_init

        data = self.init_weights
        if data is not None and not isinstance(data, bytes):
            import ray

            data = ray.get(data)  # the driver's bytes, this node's copy
        want = self.facts.init.get("sha256")
        if want is not None and want != (sha256_file(path) if data is None
                                         else hashlib.sha256(data).hexdigest()):
            raise RunError(f"model.init {path} changed since the run was prepared (sha256 "
                           f"{want[:12]}… then); start the run again")
        plan = load_init(self.model.encoder, path, self.cfg.model.backbone, data)
        if self.ema is not None:
            load_init(self.ema.module, path, self.cfg.model.backbone, data)
        if self.rank == 0:
            console.say(f"[simgraph] initialised from {plan.summary()}")

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
        may change (:data:`components.runs.resume.RESUMABLE_CHANGES`). Rank 0's words; other ranks
        say less (their message is not the one shown)."""
        from components.io.storage import display
        from components.runs.checkpoint import CheckpointUnreadable

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
                pause_once(self.run_dir, self.rank, self.step + 1)
            batch = wait.next(batches)
            where = (f"epoch {epoch + 1} step {i + 1}/{n} (global step {self.step + 1}) of "
                     f"run {cfg.name!r}")
            try:
                metrics = train_step(
                    self.ddp, self.ema, self.optimizer, self.scheduler, self.scaler, batch,
                    train_cfg=self.train_cfg, device=self.device, step=self.step,
                    total_steps=self.total_steps,
                    ema_momentum=getattr(cfg.loss, "ema_momentum", 0.996), where=where,
                    probe=self.probe)
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
        """The online kNN top-1 (``knn_top1`` in ``row``) on the epochs ``knn.every_epochs``
        names and the last one, when the dataset allows it (:attr:`RunFacts.knn`); the online
        probe's top-1 (``probe_top1``) on those ``probe.every_epochs`` names and the last one;
        their wall time ``eval_s``. Each split's unaugmented features are extracted once per
        epoch, whoever reads them (the probe's split is the kNN's query split by default)."""
        from components.evaluation.knn import KnnRule
        from components.training.step import extract_features

        cfg = self.cfg
        last = epoch + 1 == cfg.train.epochs

        def due(every: int) -> bool:
            return every > 0 and ((epoch + 1) % every == 0 or last)

        knn = self.facts.knn and due(cfg.knn.every_epochs)
        probe = self.probe if self.probe is not None and due(cfg.probe.every_epochs) else None
        if not knn and probe is None:
            return
        t0 = time.perf_counter()
        features: dict[str, tuple[Any, Any]] = {}  # split -> (features [N, F], labels [N])

        def of(split: str) -> tuple[Any, Any]:
            if split not in features:
                features[split] = extract_features(
                    self.model.encoder, self._eval_loader(split, "the kNN evaluation" if knn
                                                          else "the online probe's evaluation"),
                    self.device, self.amp)
            return features[split]

        if knn:
            bank, queries = of(cfg.knn.bank_split), of(cfg.knn.query_split)
            correct, total = KnnRule.of(cfg.knn).sharded_correct(bank, queries,
                                                                 self.facts.num_classes)
            p = correct / total
            row["knn_top1"] = p
            # Its standard error over the query images (binomial): how far apart two epochs'
            # values must be before they differ.
            row["knn_top1_se"] = math.sqrt(p * (1 - p) / total)
            row["knn_queries"] = total
        if probe is not None:
            correct, total = probe.correct(*of(cfg.probe.split_of(cfg.knn)))
            p = correct / max(total, 1)
            row["probe_top1"] = p
            row["probe_top1_se"] = math.sqrt(p * (1 - p) / max(total, 1))  # binomial, as kNN's
            row["probe_queries"] = total
        row["eval_s"] = time.perf_counter() - t0

    def _eval_loader(self, split: str, what: str) -> Any:
        """The unaugmented one-view loader of ``split`` (this rank's share), made once. Before
        the first: a rebuild swapped in since the run started is refused, never scored on."""
        from components.data.reader import ViewLoader

        if split not in self.eval_loaders:
            if not self.eval_loaders:
                from components.data.integrity import verify_identity

                verify_identity(str(self.info.root), self.facts.dataset, self.cfg.name, what)
            d = self.cfg.data
            self.eval_loaders[split] = ViewLoader(
                self.info.split_file(split), batch_size=d.batch_size, views=1,
                augment=d.augment, train=False, rank=self.rank, world_size=self.world,
                device=self.device, num_workers=d.num_workers, drop_last=False,
                os_cache=d.os_cache, with_captions=False,
                batched_augment=self.gpu_paths(self.device))  # the device's batches
        return self.eval_loaders[split]

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
        from components.runs.checkpoint import checkpoint_state

        state = checkpoint_state(
            cfg, model=self.model, ema=self.ema, optimizer=self.optimizer,
            scheduler=self.scheduler, scaler=self.scaler, epoch=epoch + 1,
            step=self.step, history=self.history, dataset=self.facts.dataset,
            samples=self.start_samples + (self.step - self.start_step) * self.global_batch,
            probe=self.probe,
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
