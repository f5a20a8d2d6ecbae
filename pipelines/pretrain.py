"""``simgraph pretrain CONFIG [key=value ...]``: pretrain an encoder with Ray Train.

Driver, top to bottom:

1. Load and validate the config, then the dataset dir against what the loss needs (labels,
   a class graph, captions) — before any Ray work.
2. Prepare the run dir ``storage/name``: ``config.yaml`` is written on the first run; a
   re-run with the same name must match it (except keys that may change on a resume, e.g.
   ``train.epochs``, ``scaling.*``) and resumes from the latest complete checkpoint.
3. Ray Train V2 ``TorchTrainer`` (gloo on CPU, NCCL on GPU) runs :func:`train_loop` on
   ``scaling.num_workers`` workers, on a local Ray started for the job or the ``RAY_ADDRESS``
   cluster. ``FailureConfig(max_failures)`` restarts the group from the latest checkpoint.
4. Print the per-epoch metrics table.

Worker (:func:`train_loop`): FFCV reader for this rank's share → :class:`PretrainModel` in
DDP → per-epoch metrics (loss and parts, lr, samples/s, data-wait fraction, anchors without
positives, online kNN top-1) reported to Ray (Tune/ASHA read them) and written by rank 0 to
``metrics.csv`` and TensorBoard (``tb/``); full-state checkpoints every
``checkpoint.every_epochs`` and at the end, the newest ``checkpoint.keep`` kept by Ray.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from components.config import (
    ConfigError,
    PretrainConfig,
    from_dict,
    load_config,
    to_dict,
)
from components.errors import SimgraphError, describe, run_command
from components.files import atomic_open

RUN_CONFIG = "config.yaml"
# Fault injection for the resume tests: every rank sleeps before this global step, once.
PAUSE_ENV = "SIMGRAPH_PAUSE_AT_STEP"
METRICS_CSV = "metrics.csv"
# Keys that may differ when a run is resumed (longer training, other hardware, logging).
RESUMABLE_CHANGES = (
    "train.epochs", "train.log_every_steps", "scaling.", "checkpoint.keep",
    "knn.every_epochs", "data.num_workers", "data.os_cache", "data.jit", "data.stage",
    "storage",
)


class PretrainError(SimgraphError, RuntimeError):
    """The run cannot start or did not finish; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# Driver side.


def check_dataset(cfg: PretrainConfig) -> dict[str, Any]:
    """Check the dataset dir against the loss and batch; returns facts the workers need.

    Raises:
        PretrainError: missing dataset, no labels for a supervised loss, no class graph or
            captions for X-CLR / CLIP, fewer training samples than one global batch.
    """
    from components.data.reader import DatasetError
    from components.data.staging import dataset_info
    from components.storage import StorageError
    from components.training import build_model

    try:
        info = dataset_info(cfg.data.dataset)  # a URI: only the manifest and class files
        train_n = info.splits.get("train", 0)
        info.split_file("train")
    except (DatasetError, StorageError) as e:
        raise PretrainError(str(e)) from None
    where = cfg.data.dataset
    sim = info.class_similarity()
    import torch

    try:  # builds the objective on CPU: the same checks the workers will hit, now
        model, _ = build_model(
            cfg.model, cfg.loss, len(info.classes),
            None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
            info.caption_dim,
        )
    except ValueError as e:
        raise PretrainError(f"loss {cfg.loss.name!r} cannot train on {where}: {e}") from None
    needs = model.objective.requires
    if "labels" in needs and not info.classes:
        raise PretrainError(
            f"loss {cfg.loss.name!r} needs labels but {where} has none (no classes in its "
            "manifest); use simclr or xclr with graph=caption"
        )
    if "captions" in needs and info.caption_dim == 0:
        raise PretrainError(
            f"loss {cfg.loss.name!r} needs caption embeddings but {where} has no caption "
            "field; preprocess with captions.enabled=true"
        )
    want = getattr(cfg.loss, "caption_dim", None)
    if want is not None and info.caption_dim and want != info.caption_dim:
        raise PretrainError(
            f"loss.caption_dim={want} but {where} stores {info.caption_dim}-d caption "
            f"embeddings; set loss.caption_dim={info.caption_dim}"
        )
    global_batch = cfg.data.batch_size * cfg.scaling.num_workers
    if train_n < global_batch:
        raise PretrainError(
            f"{where} has {train_n} training samples, fewer than one global batch "
            f"({cfg.scaling.num_workers} workers × data.batch_size={cfg.data.batch_size}); "
            "lower data.batch_size"
        )
    knn = cfg.knn.every_epochs > 0
    knn_note = ""
    if knn and not info.classes:
        knn, knn_note = False, "no labels"
    elif knn and (info.splits.get(cfg.knn.query_split, 0) == 0
                  or info.splits.get(cfg.knn.bank_split, 0) == 0):
        knn, knn_note = False, (f"split {cfg.knn.query_split!r} or {cfg.knn.bank_split!r} is "
                                "empty")
    return {"num_classes": len(info.classes), "caption_dim": info.caption_dim,
            "dataset": dataset_identity(info.manifest),
            "train_samples": train_n, "knn": knn, "knn_note": knn_note,
            "needs_captions": "captions" in needs}


def absolute_paths(cfg: PretrainConfig, base: str | Path | None = None) -> PretrainConfig:
    """Local dataset and storage paths made absolute, relative ones against ``base`` (default:
    :func:`components.paths.base_dir`): Ray Train workers and Tune trials run in other working
    directories. URIs (``s3://`` …) are left as they are."""
    from components.paths import resolve_path

    return dataclasses.replace(
        cfg, storage=resolve_path(cfg.storage, base),
        data=dataclasses.replace(cfg.data, dataset=resolve_path(cfg.data.dataset, base)),
    )


def dataset_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What identifies a dataset dir's content: stored in checkpoints, so evaluation can refuse
    a dataset other than the one a run trained on."""
    return {
        "params_digest": manifest.get("params_digest"),
        "splits": {k: v.get("sha256") for k, v in manifest.get("splits", {}).items()},
        "classes": list(manifest.get("classes", [])),
    }


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _with_defaults(d: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the keys added since it was written filled in at their defaults
    (which keep the old behaviour), so an older run still resumes and evaluates; a config
    that no longer loads is compared as it is."""
    try:
        return to_dict(from_dict(PretrainConfig, d))
    except (ConfigError, TypeError):
        return d


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two config dicts (either side may lack a key;
    keys added to the config classes later count as their defaults), ignoring
    :data:`RESUMABLE_CHANGES`: what makes two configs different runs."""
    a, b = _flatten(_with_defaults(old)), _flatten(_with_defaults(new))
    return sorted(k for k in set(a) | set(b)
                  if a.get(k) != b.get(k) and not k.startswith(RESUMABLE_CHANGES))


def prepare_run_dir(cfg: PretrainConfig) -> str:
    """Create ``storage/name`` (a path or URI) with ``config.yaml``, or check a re-run
    against it; returns the run dir.

    Raises:
        PretrainError: the run dir holds another run's config (names the differing keys), or
            the storage cannot be written.
    """
    from components import storage

    run_dir = storage.join(cfg.storage, cfg.name)
    path = storage.join(run_dir, RUN_CONFIG)
    new = to_dict(cfg)
    try:
        storage.makedirs(run_dir)
        if storage.exists(path):
            diff = config_diff(yaml.safe_load(storage.read_text(path)) or {}, new)
            if diff:
                raise PretrainError(
                    f"run {cfg.name!r} in {storage.display(cfg.storage)} was started with a "
                    f"different config ({', '.join(diff[:6])} differ); re-running a name "
                    "resumes it, so choose a new name= or restore those values"
                )
        storage.write_text(path, yaml.safe_dump(new, sort_keys=False))
    except storage.StorageError as e:
        raise PretrainError(f"cannot use storage {storage.display(cfg.storage)}: {e}") from None
    return run_dir


def make_trainer(cfg: PretrainConfig, run_dir: str, facts: dict[str, Any],
                 callbacks: Sequence[Any] = ()) -> Any:
    """The Ray Train V2 ``TorchTrainer`` for this run (same name + storage = resume).
    ``callbacks``: Ray Train callbacks, e.g. Tune's ``TuneReportCallback`` in a sweep trial."""
    import ray.train
    from ray.train.torch import TorchTrainer

    s = cfg.scaling
    resources: dict[str, float] = {"CPU": s.cpus_per_worker}
    if s.use_gpu:
        resources["GPU"] = s.gpus_per_worker
    return TorchTrainer(
        train_loop,
        train_loop_config={"config": to_dict(cfg), "run_dir": run_dir, "facts": facts,
                           "pause_at_step": int(os.environ.get(PAUSE_ENV, "0"))},
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


def run(cfg: PretrainConfig, echo: bool = True) -> list[dict[str, Any]]:
    """Train (or resume) the run; returns its per-epoch metrics history.

    Raises:
        PretrainError: bad dataset / run dir, or training failed (the message says where;
            the last good checkpoint stays in the run dir).
    """
    from components.checkpoint import load_state, local_copy
    from components.storage import display
    from pipelines.preprocess import ray_session

    cfg = absolute_paths(cfg)
    facts = check_dataset(cfg)
    run_dir = prepare_run_dir(cfg)
    done = latest_complete(run_dir)
    history: list[dict[str, Any]]
    if done is not None and done[0] >= cfg.train.epochs:
        with local_copy(done[1]) as d:
            history = load_state(d)["history"]
        if echo:
            print(f"simgraph: run {cfg.name!r} is already complete ({done[0]} epochs)")
            print(table(history))
        return history
    if echo and facts["knn_note"]:
        print(f"simgraph: online kNN is off for this run ({facts['knn_note']})")
    with ray_session(None):
        trainer = make_trainer(cfg, run_dir, facts)
        try:
            result = trainer.fit()
        except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error
            raise PretrainError(
                f"training {cfg.name!r} failed: {describe(e)}\n"
                f"completed checkpoints stay in {display(run_dir)}; re-run the same command to "
                "resume"
            ) from None
    if result.checkpoint is None:
        raise PretrainError(f"run {cfg.name!r} finished without a checkpoint")
    with result.checkpoint.as_directory() as d:
        history = load_state(d)["history"]
    if echo:
        print(table(history))
        print(f"run dir: {display(run_dir)}")
    return history


def latest_complete(run_dir: str | Path) -> tuple[int, str] | None:
    """(epochs, dir) of the newest checkpoint ``epoch_NNNNN`` in ``run_dir`` (a path or URI)
    whose write completed; dirs left by an interrupted write fail
    :func:`~components.checkpoint.is_complete_at` and are skipped."""
    from components import storage
    from components.checkpoint import is_complete_at

    epochs = {int(n[6:]): n for n in storage.list_dir(str(run_dir))
              if n.startswith("epoch_") and n[6:].isdigit()}
    for epoch in sorted(epochs, reverse=True):
        d = storage.join(str(run_dir), epochs[epoch])
        if is_complete_at(d):
            return epoch, d
    return None


def table(history: Sequence[dict[str, Any]]) -> str:
    cols = ["epoch", "loss", "lr", "knn_top1", "samples_per_s", "data_wait", "time_s"]
    lines = [" ".join(f"{c:>13}" for c in cols)]
    for row in history:
        cells = []
        for c in cols:
            v = row.get(c, float("nan"))
            cells.append(f"{v:>13d}" if isinstance(v, int) else f"{v:>13.4g}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str]) -> int:
    return run_command("pretrain", lambda: run(load_config(config, PretrainConfig, overrides)))


# ---------------------------------------------------------------------------------------------
# Worker side (runs in every Ray Train worker).


def train_views(cfg: PretrainConfig, info: Any, rank: int, world: int, device: Any,
                with_captions: bool) -> Any:
    """The training ``ViewLoader`` of one rank: what every worker reads (``simgraph preview``
    draws its batches from this same function)."""
    from components.data.reader import ViewLoader

    d = cfg.data
    return ViewLoader(
        info.split_file("train"), batch_size=d.batch_size, views=d.views, augment=d.augment,
        train=True, seed=cfg.train.seed, rank=rank, world_size=world, device=device,
        num_workers=d.num_workers, drop_last=True, os_cache=d.os_cache,
        with_captions=with_captions, max_batches=cfg.train.steps_per_epoch,
    )


def train_loop(loop_config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from components import distributed
    from components.checkpoint import load_state, save_state
    from components.data.reader import DatasetInfo, ViewLoader, set_jit
    from components.data.staging import local_dataset
    from components.optim import build_for_run
    from components.training import (
        StepState,
        build_model,
        distributed_knn_top1,
        extract_features,
        seed_everything,
        sync_buffers,
        train_step,
        uses_projector,
    )

    cfg = from_dict(PretrainConfig, loop_config["config"])
    run_dir, facts = str(loop_config["run_dir"]), loop_config["facts"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the first collective on NCCL
    set_jit(cfg.data.jit)  # imports ffcv, which sets torch threads to 1
    torch.set_num_threads(max(1, math.floor(cfg.scaling.cpus_per_worker)))
    _worker_info(run_dir, rank, world, device)

    # A URI, or data.stage: read a node-local copy (made once per node, verified).
    info = DatasetInfo.load(local_dataset(cfg.data.dataset, cfg.data.stage, cfg.data.stage_dir))
    sim = info.class_similarity()
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
    model, ema = build_model(
        cfg.model, cfg.loss, facts["num_classes"],
        None if sim is None else torch.as_tensor(sim, dtype=torch.float32),
        facts["caption_dim"],
    )
    on_gpu = device.type == "cuda"
    model.channels_last = on_gpu and cfg.model.channels_last
    if on_gpu and cfg.model.sync_bn and world > 1:
        model.encoder = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model.encoder)
    model.to(device)
    if model.channels_last:
        model.to(memory_format=torch.channels_last)
    if ema is not None:
        ema.to(device)

    d = cfg.data
    train_loader = train_views(cfg, info, rank, world, device, facts["needs_captions"])
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * cfg.train.epochs
    optimizer, scheduler = build_for_run(model, cfg.optim, d.batch_size * world,
                                         steps_per_epoch, cfg.train.epochs)
    scaler = torch.amp.GradScaler("cuda") if cfg.train.amp == "fp16" else None

    start_epoch, step, history = 0, 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            state = load_state(ckpt_dir, map_location=device)
        model.load_state_dict(state["model"])
        if ema is not None:
            ema.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        start_epoch, step, history = int(state["epoch"]), int(state["step"]), state["history"]
        if rank == 0:
            print(f"[simgraph] resumed {cfg.name!r} after epoch {start_epoch} (step {step})")
    if step > total_steps:
        raise PretrainError(f"the checkpoint is at step {step}, past this run's {total_steps}")

    ddp: torch.nn.Module = model
    if world > 1:
        ddp = DistributedDataParallel(
            model, find_unused_parameters=not uses_projector(model.objective),
            # BN statistics are averaged before eval / saving; the memory bank is identical on
            # every rank: no per-step buffer broadcast.
            forward_sync_buffers=False,
        )

    knn_loaders: tuple[Any, Any] | None = None
    log = _RunLog(run_dir, start_epoch) if rank == 0 else None
    for epoch in range(start_epoch, cfg.train.epochs):
        seed_everything(cfg.train.seed, epoch, rank)
        train_loader.set_epoch(epoch)
        model.train()
        acc, wait, t0 = StepState(), 0.0, time.perf_counter()
        last_lr = float(optimizer.param_groups[0]["lr"])
        batches = iter(train_loader)
        for i in range(steps_per_epoch):
            if step + 1 == loop_config["pause_at_step"]:
                _pause_once(run_dir, rank, step + 1)
            t = time.perf_counter()
            batch = next(batches)
            wait += time.perf_counter() - t
            metrics = train_step(
                ddp, ema, optimizer, scheduler, scaler, batch, train_cfg=cfg.train,
                device=device, step=step, total_steps=total_steps,
                ema_momentum=getattr(cfg.loss, "ema_momentum", 0.996),
                where=f"epoch {epoch + 1} step {i + 1}/{steps_per_epoch} (global step "
                      f"{step + 1}) of run {cfg.name!r}",
            )
            step += 1
            last_lr = metrics.pop("lr")
            acc.add(metrics)
            if rank == 0 and step % cfg.train.log_every_steps == 0:
                print(f"[simgraph] epoch {epoch + 1} step {i + 1}/{steps_per_epoch} "
                      f"loss {metrics['loss']:.4f} lr {last_lr:.4g}")
        for _ in batches:  # let FFCV finish the epoch's order (nothing left: exact count)
            pass
        elapsed = time.perf_counter() - t0
        sync_buffers(model)
        if ema is not None:  # its BN statistics are copies of this rank's, before the sync
            sync_buffers(ema)
        row: dict[str, Any] = {"epoch": epoch + 1, "step": step, **acc.summary()}
        row["lr"] = last_lr  # of the epoch's last step
        row["samples_per_s"] = steps_per_epoch * d.batch_size * world / elapsed
        row["data_wait"] = distributed.mean_over_ranks(torch.tensor([wait / elapsed]))
        row["time_s"] = elapsed
        if facts["knn"] and ((epoch + 1) % cfg.knn.every_epochs == 0
                             or epoch + 1 == cfg.train.epochs):
            if knn_loaders is None:
                knn_loaders = tuple(  # type: ignore[assignment]
                    ViewLoader(info.split_file(s), batch_size=d.batch_size, views=1,
                               augment=d.augment, train=False, rank=rank, world_size=world,
                               device=device, num_workers=d.num_workers, drop_last=False,
                               os_cache=d.os_cache, with_captions=False)
                    for s in (cfg.knn.bank_split, cfg.knn.query_split)
                )
            assert knn_loaders is not None
            bank = extract_features(model.encoder, knn_loaders[0], device, cfg.train.amp)
            queries = extract_features(model.encoder, knn_loaders[1], device, cfg.train.amp)
            row["knn_top1"] = distributed_knn_top1(
                bank, queries, k=cfg.knn.k, num_classes=facts["num_classes"],
                temperature=cfg.knn.temperature)
        history.append(row)
        if log is not None:
            log.write(history)
        last = epoch + 1 == cfg.train.epochs
        if (epoch + 1) % cfg.checkpoint.every_epochs == 0 or last:
            with tempfile.TemporaryDirectory(prefix="simgraph-ckpt-") as tmp:
                ckpt = None
                if rank == 0:
                    save_state(tmp, {
                        "model": model.state_dict(),
                        "ema": None if ema is None else ema.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "scaler": None if scaler is None else scaler.state_dict(),
                        "epoch": epoch + 1, "step": step, "history": history,
                        "seed": cfg.train.seed, "config": to_dict(cfg),
                        "dataset": facts["dataset"],
                    })
                    ckpt = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report(row, checkpoint=ckpt,
                                 checkpoint_dir_name=f"epoch_{epoch + 1:05d}")
        else:
            ray.train.report(row)
    if log is not None:
        log.close()


class _RunLog:
    """Rank 0's ``metrics.csv`` (rewritten from the history, so a resumed run never keeps rows
    of epochs it redid) and TensorBoard events (purged from the resume epoch on), written
    locally and published to a URI run dir after every epoch (:class:`LocalMirror`)."""

    def __init__(self, run_dir: str, start_epoch: int) -> None:
        from tensorboardX import SummaryWriter

        from components.storage import LocalMirror

        self.mirror = LocalMirror(run_dir)
        self.tb = SummaryWriter(str(self.mirror.local / "tb"), purge_step=start_epoch + 1)

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
        self.mirror.sync()

    def close(self) -> None:
        self.tb.close()
        self.mirror.close()


def _pause_once(run_dir: str, rank: int, step: int, seconds: float = 300.0) -> None:
    from components import storage

    flag = storage.join(run_dir, "workers", f"paused-rank{rank}-step{step}")
    if not storage.exists(flag):
        storage.write_text(flag, "")
        time.sleep(seconds)


def _worker_info(run_dir: str, rank: int, world: int, device: Any) -> dict[str, Any]:
    """``workers/rank<r>.json``: where each rank runs (pid, node, device) — for operators and
    for tests that kill a worker or check placement.

    The node / local ranks are computed from Ray node ids (:func:`~components.distributed.
    node_layout`), not taken from Ray Train, which ranks nodes by IP: nodes sharing an IP
    would all be node 0. The device is Ray's (``ray.train.torch.get_device``: this worker's
    GPU ids within ``CUDA_VISIBLE_DEVICES``, by node id), checked against what this node has.

    Raises:
        PretrainError: the device index Ray gave does not exist on this node.
    """
    import ray
    import ray.train
    import torch

    from components import distributed
    from components.paths import project_root

    node_id = ray.get_runtime_context().get_node_id()
    layout = distributed.node_layout(distributed.all_node_ids(node_id), rank)
    ctx = ray.train.get_context()
    info = {
        "rank": rank, "world_size": world, "pid": os.getpid(), "host": socket.gethostname(),
        "node_id": node_id, **layout,
        "ray_node_rank": ctx.get_node_rank(), "ray_local_rank": ctx.get_local_rank(),
        "device": str(device), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "code": str(project_root()),  # which copy of the project runs (a job's working_dir)
        "started": time.time(),
    }
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise PretrainError(
            f"rank {rank} on node {node_id} was given {device} but sees "
            f"{torch.cuda.device_count()} GPUs (CUDA_VISIBLE_DEVICES="
            f"{info['cuda_visible_devices']!r}); do not set CUDA_VISIBLE_DEVICES yourself")
    if (info["ray_node_rank"], info["ray_local_rank"]) != (layout["node_rank"],
                                                           layout["local_rank"]):
        print(f"[simgraph] rank {rank}: Ray Train says node_rank {info['ray_node_rank']} / "
              f"local_rank {info['ray_local_rank']} (it ranks nodes by IP), node ids say "
              f"{layout['node_rank']} / {layout['local_rank']}")
    from components import storage

    storage.write_text(storage.join(run_dir, "workers", f"rank{rank}.json"), json.dumps(info))
    return info


__all__ = ["PretrainError", "check_dataset", "main", "make_trainer", "prepare_run_dir", "run",
           "table", "train_loop"]
