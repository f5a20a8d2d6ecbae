"""Where a :class:`~components.runs.worker.PretrainRecipe` runs: what it asks of Ray, in one place.

The recipe needs five things from its host: its rank and the world size, its device, the
checkpoint to resume from, and a way to report an epoch's metrics (with a checkpoint every
``checkpoint.every_epochs`` epochs). Two hosts give them:

* :class:`TrainWorker` — a Ray Train V2 worker (``simgraph pretrain``, multi-worker sweep
  trials): Ray Train owns the checkpoints (``ray.train.report``; it keeps
  ``checkpoint.keep`` of them in the run dir) and resumes a run of the same name.
* :class:`TuneTrial` — the Tune trial actor itself (one-worker sweep trials,
  ``resources.mode``): no Train controller, worker group or process group is started, which
  is most of a short trial's fixed cost. The host writes the checkpoints into the run dir in
  the same layout (``epoch_NNNNN/`` with ``state.pt`` + ``meta.json``, the newest
  ``checkpoint.keep`` kept), resumes from the newest complete one, and reports each epoch to
  Tune (``ray.tune.report``), the sweep's metric first.

(:class:`InProcess`: the same without Tune, for runs that report to no one.) All leave the same
run dir behind: ``simgraph evaluate``, ``latest_complete`` and a resumed
sweep read either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class RunHost(Protocol):
    """What :class:`~components.runs.worker.PretrainRecipe` asks of the process it runs in."""

    rank: int
    world: int

    def device(self) -> torch.device:
        """The device this rank trains on."""

    def ray_node_ranks(self) -> tuple[int, int] | None:
        """Ray Train's (node rank, local rank) of this worker; ``None`` outside Ray Train."""

    def latest_checkpoint(self) -> contextlib.AbstractContextManager[Path | None]:
        """The checkpoint to resume from, as a local directory (``None``: a fresh start)."""

    def report(self, row: dict[str, Any], checkpoint: str | None, epoch: int | None) -> None:
        """Report one epoch's ``row``. On a checkpoint epoch every rank passes ``epoch`` (the
        epochs completed) and rank 0 its local checkpoint dir ``checkpoint`` (kept in the run
        dir as :func:`~components.runs.checkpoints.checkpoint_name` ``(epoch)``); on other
        epochs both are ``None``. Every rank calls this once per epoch."""


class TrainWorker:
    """A Ray Train V2 worker: rank, device and checkpoints are Ray Train's — cross-checked
    against the run dir (``run_dir``), whose newest complete checkpoint wins when Ray's
    snapshot is missing or older (:func:`resume_from`)."""

    def __init__(self, run_dir: str | None = None) -> None:
        import ray.train

        ctx = ray.train.get_context()
        self._ctx = ctx
        self.run_dir = run_dir
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()

    def device(self) -> torch.device:
        import ray.train.torch

        device: torch.device = ray.train.torch.get_device()
        return device

    def ray_node_ranks(self) -> tuple[int, int] | None:
        return self._ctx.get_node_rank(), self._ctx.get_local_rank()

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        import ray.train

        from components.runs.checkpoint import local_copy, read_meta
        from components.runs.checkpoints import latest_complete

        checkpoint = ray.train.get_checkpoint()
        newest = latest_complete(self.run_dir) if self.run_dir is not None else None
        with contextlib.ExitStack() as stack:
            ray_dir = None if checkpoint is None else Path(
                stack.enter_context(checkpoint.as_directory()))
            ray_epoch = None if ray_dir is None else int(read_meta(ray_dir)["epoch"])
            if resume_from(ray_epoch, None if newest is None else newest[0]) == "run_dir":
                assert newest is not None
                if self.rank == 0:
                    from components.runtime import console

                    console.say(f"[simgraph] Ray's run snapshot names "
                                f"{'no checkpoint' if ray_epoch is None else f'epoch {ray_epoch}'}"
                                f"; resuming from the run dir's newest complete checkpoint "
                                f"{Path(newest[1]).name}")
                yield stack.enter_context(local_copy(newest[1]))
                return
            yield ray_dir

    def report(self, row: dict[str, Any], checkpoint: str | None, epoch: int | None) -> None:
        import ray.train

        from components.runs.checkpoints import checkpoint_name

        if epoch is None:
            ray.train.report(row)
            return
        ckpt = None if checkpoint is None else ray.train.Checkpoint.from_directory(checkpoint)
        ray.train.report(row, checkpoint=ckpt, checkpoint_dir_name=checkpoint_name(epoch))


def resume_from(ray_epoch: int | None, run_dir_epoch: int | None) -> str | None:
    """Which checkpoint a Ray Train worker resumes from: ``"ray"`` (Ray's snapshot),
    ``"run_dir"`` (the run dir's newest complete checkpoint, when Ray names none or an older
    one: a lost or stale snapshot must not restart a run at epoch 0 on top of its
    checkpoints) or ``None`` (a fresh start)."""
    if run_dir_epoch is not None and (ray_epoch is None or run_dir_epoch > ray_epoch):
        return "run_dir"
    return "ray" if ray_epoch is not None else None


class TuneTrial:
    """The Tune trial actor as a one-rank host (``world`` 1, no process group).

    Args:
        run_dir: the trial's run dir (a path or URI); checkpoints go to ``run_dir/<name>``.
        keep: how many of the newest checkpoints to keep (``None``: all), like Ray Train's
            ``CheckpointConfig(num_to_keep)``.
        metric: the sweep's metric, put first in every result (Tune's trial table shows the
            first few metrics of a result).
    """

    rank, world = 0, 1

    def __init__(self, run_dir: str, keep: int | None, metric: str) -> None:
        self.run_dir, self.keep, self.metric = run_dir, keep, metric

    def device(self) -> torch.device:
        import ray
        import torch

        # Ray sets CUDA_VISIBLE_DEVICES to the trial's GPUs: the first one is index 0.
        # (Outside Ray — tests — get_gpu_ids() would start a local Ray instance.)
        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        return torch.device("cuda", 0) if gpus else torch.device("cpu")

    def ray_node_ranks(self) -> tuple[int, int] | None:
        return None

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        from components.runs.checkpoint import local_copy
        from components.runs.checkpoints import latest_complete

        found = latest_complete(self.run_dir)
        if found is None:
            yield None
            return
        with local_copy(found[1]) as d:
            yield d

    def report(self, row: dict[str, Any], checkpoint: str | None, epoch: int | None) -> None:
        if checkpoint is not None and epoch is not None:
            from components.runs.checkpoints import prune_checkpoints, publish_checkpoint

            # The older ones go only once the new one is there, whole, verified and on disk.
            publish_checkpoint(checkpoint, self.run_dir, epoch)
            prune_checkpoints(self.run_dir, self.keep)
        self.send(metric_first(row, self.metric))

    def send(self, result: dict[str, Any]) -> None:
        """Hand one epoch's result to Tune (after its checkpoint is in the run dir)."""
        from ray import tune

        tune.report(result)


def metric_first(row: dict[str, Any], metric: str) -> dict[str, Any]:
    """``row`` with ``metric``, ``epoch`` and ``lr`` as its first keys."""
    first = {k: row[k] for k in (metric, "epoch", "lr") if k in row}
    return {**first, **row}


class InProcess(TuneTrial):
    """A one-worker run in this process with no one to report to (a sweep's confirmation runs,
    each in its own Ray task): :class:`TuneTrial`'s checkpoints and resume, results kept in
    the run dir only."""

    def __init__(self, run_dir: str, keep: int | None) -> None:
        super().__init__(run_dir, keep, metric="loss")

    def send(self, result: dict[str, Any]) -> None:
        pass
