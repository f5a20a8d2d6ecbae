"""The GPU path's constraints, checked on CPU (issue: "the GPU path works the first time").

* The reader's FFCV pipelines for a CUDA target: every op from ``ToDevice`` on declares its
  buffers on that device and every output ends there (FFCV allocates a declared buffer of no
  device in pinned *host* memory: ``ToTorchImage(channels_last=False)`` after ``ToDevice``
  copied every CUDA batch back to the host). Checked from the ops' declarations, no Loader.
* A strict-device run (:mod:`tests.support.strict_device`): two ranks of the recipe on gloo, with
  the GPU path's batched augmentation, channels_last and bf16 autocast on CPU, where a host tensor
  in a collective or a host/device mix raises as NCCL and CUDA would — for pretraining steps
  and the online kNN.
* Fractional / multi-GPU workers the recipe cannot use are refused by config and sweep files.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from components.config import AugmentConfig, ConfigError, PretrainConfig, from_dict
from components.data.reader import ViewLoader
from components.data.view_ops import pipeline_ops
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded
from tests.support.strict_device import DeviceRuleError, strict_device

CUDA = torch.device("cuda", 1)
RES = 12


def _walk(ops: list[Any], state: Any, target: torch.device) -> tuple[Any, list[str]]:
    """Declared state after ``ops`` (decoder excluded: ``state`` is its output) and the ops
    from ``ToDevice`` on whose buffers are declared anywhere but ``target``."""
    from ffcv.transforms import ToDevice

    moved, wrong = False, []
    for op in ops[1:]:
        state, alloc = op.declare_state_and_memory(state)
        moved = moved or isinstance(op, ToDevice)
        queries = alloc if isinstance(alloc, list | tuple) else [alloc]
        if moved and any(q is not None and q.device != target for q in queries):
            wrong.append(type(op).__name__)
    return state, wrong


def _decoded(ops: list[Any], side: int) -> Any:
    """What an image decoder hands on: HWC uint8, ``[V, H, W, 3]`` for a decoder of V views."""
    from ffcv.pipeline.state import State

    views = getattr(ops[0], "views", None)
    shape = (side, side, 3) if views is None else (views, side, side, 3)
    return State(jit_mode=True, device=torch.device("cpu"), shape=shape,
                 dtype=np.dtype("uint8"))


@pytest.mark.parametrize("train", [True, False])
def test_reader_pipelines_end_on_the_cuda_device(train: bool) -> None:
    from ffcv.pipeline.state import State

    aug = AugmentConfig(resolution=RES)
    got = pipeline_ops(["image", "label", "sample_id", "caption"], augment=aug, train=train,
                       views=3, device=CUDA, batched_augment=True, with_captions=True)
    # training: the 3 views cropped from one decode, one [B, 3, H, W, 3] output
    assert sorted(got) == ["caption", "image", "label", "sample_id"]
    decoded = {  # what the other decoders hand on: ints; a float vector
        "label": State(jit_mode=True, device=torch.device("cpu"), shape=(1,),
                       dtype=np.dtype("int64")),
        "caption": State(jit_mode=True, device=torch.device("cpu"), shape=(5,),
                         dtype=np.dtype("float32")),
    }
    for key, ops in got.items():
        start = (_decoded(ops, RES) if key == "image" else
                 decoded["label" if key in ("label", "sample_id") else "caption"])
        state, wrong = _walk(ops, start, CUDA)
        assert wrong == [], f"{key}: {wrong} declare buffers off {CUDA} after ToDevice"
        assert state.device == CUDA, f"{key} ends on {state.device}"
        if key == "image":
            assert tuple(state.shape) == ((3, RES, RES, 3) if train else (3, RES, RES))
            assert state.dtype in (torch.uint8, np.dtype("uint8"))


def test_device_crop_slots_end_on_the_cuda_device() -> None:
    """The GPU path's default (``device_crops``): each run of views of one augmentation — one
    view or several, per view group — is one ``[B, S]`` uint8 slot output on the device (the
    decoded images and their draws), cropped there after the loader."""
    from ffcv.pipeline.state import State

    from components.data.augment.device_crop import DecodeForDeviceCrops, slot_bytes

    big, small = AugmentConfig(resolution=RES), AugmentConfig(resolution=8, scale=[0.05, 0.2])
    got = pipeline_ops(["image", "label", "sample_id"], augment=big, train=True, views=4,
                       device=CUDA, batched_augment=True, with_captions=False,
                       view_augments=[big, big, big, small], device_crops=True)
    groups = {"image": (3, RES), "image_3": (1, 8)}
    assert sorted(k for k in got if k.startswith("image")) == sorted(groups)
    for key, (views, side) in groups.items():
        op = got[key][0]
        assert isinstance(op, DecodeForDeviceCrops)
        assert (op.views, op.output_size) == (views, (side, side))
        slot = (slot_bytes(40, 30, views),)  # a file whose largest image is 40 x 30
        state, wrong = _walk(got[key], State(jit_mode=True, device=torch.device("cpu"),
                                             shape=slot, dtype=np.dtype("uint8")), CUDA)
        assert wrong == [] and state.device == CUDA and tuple(state.shape) == slot, key
    with pytest.raises(ValueError, match="device_crops needs batched_augment"):
        pipeline_ops(["image"], augment=big, train=True, views=2, device=CUDA,
                     batched_augment=False, with_captions=False, device_crops=True)


def test_view_group_pipelines_end_on_the_cuda_device_at_their_sizes() -> None:
    """Multi-crop on the GPU path: each group's views are cropped from one decode at the
    group's size and end on the device (2 × 12 px + 3 × 8 px views)."""
    big, small = AugmentConfig(resolution=RES), AugmentConfig(resolution=8, scale=[0.05, 0.2])
    got = pipeline_ops(["image", "label", "sample_id"], augment=big, train=True, views=5,
                       device=CUDA, batched_augment=True, with_captions=False,
                       view_augments=[big, big, small, small, small])
    groups = {"image": (2, RES), "image_2": (3, 8)}
    assert sorted(k for k in got if k.startswith("image")) == sorted(groups)
    for key, (views, side) in groups.items():
        assert got[key][0].output_size == (side, side) and got[key][0].views == views
        state, wrong = _walk(got[key], _decoded(got[key], side), CUDA)
        assert wrong == [] and state.device == CUDA, key
        assert tuple(state.shape) == (views, side, side, 3)


def test_cpu_pipelines_stay_on_the_host_without_a_copy() -> None:
    from ffcv.transforms import ToDevice, ToTorchImage

    got = pipeline_ops(["image", "label", "sample_id"], augment=AugmentConfig(resolution=RES),
                       train=True, views=2, device=torch.device("cpu"), batched_augment=False,
                       with_captions=False)
    for ops in got.values():
        assert not any(isinstance(op, ToDevice) for op in ops)
    tti = [op for ops in got.values() for op in ops if isinstance(op, ToTorchImage)]
    # a [B, 3, H, W] view over FFCV's [B, H, W, 3] buffer: no NCHW copy (the reader normalises
    # from it into the batch's own NCHW float tensor, components/data/normalise.py)
    assert len(tti) == 2 and all(op.channels_last for op in tti)


# -- the strict-device rules themselves --------------------------------------------------------


def test_strict_device_refuses_what_nccl_and_cuda_refuse(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        dev = torch.ones(4)  # made before the mode: a device tensor
        with strict_device() as mode:
            dist.all_reduce(torch.ones(3, device=dev.device))
            dist.all_reduce(dev * 2)
            with pytest.raises(DeviceRuleError, match=r"all_reduce got a host tensor \(1,\)"):
                dist.all_reduce(torch.tensor([0.5]))
            with pytest.raises(DeviceRuleError, match="same device"):
                _ = dev + torch.arange(4)
            _ = dev * torch.tensor(2.0)  # a 0-dim host tensor passes as a scalar, as on CUDA
            _ = dev + torch.arange(4).to(dev.device)
            _ = dev[torch.tensor([0, 2])]  # indexing with host indices is allowed on CUDA
            host = torch.from_numpy(np.ones(4, dtype=np.float32))
            with pytest.raises(DeviceRuleError, match="same device"):
                _ = dev + host.float()
            with pytest.raises(DeviceRuleError, match="all_reduce"):
                dist.all_reduce(dev.cpu())
            dist.all_reduce(dev.cpu().to(dev.device))
        assert mode.collectives == 5
    finally:
        dist.destroy_process_group()


# -- a strict-device run of the recipe ---------------------------------------------------------


class _Host:
    """A rank of a plain gloo process group as the recipe's host: fresh start, results kept."""

    def __init__(self, rank: int, world: int, run_dir: str) -> None:
        self.rank, self.world, self.run_dir = rank, world, run_dir
        self.rows: list[dict[str, Any]] = []

    def device(self) -> torch.device:
        return torch.device("cpu")

    def ray_node_ranks(self) -> tuple[int, int] | None:
        return None

    def latest_checkpoint(self) -> Any:
        import contextlib

        return contextlib.nullcontext(None)

    def report(self, row: dict[str, Any], checkpoint: str | None, name: str | None) -> None:
        self.rows.append(row)


def _strict_worker(rank: int, world: int, port: str, cfgs: list[dict[str, Any]],
                   out: str) -> None:
    with gloo_group(rank, world, port, timeout_s=120):
        for i, cfg in enumerate(cfgs):  # one process group for every config: ranks start once
            _strict_run(rank, world, cfg, Path(out) / f"{i}-r{rank}.pt")


def _strict_run(rank: int, world: int, cfg: dict[str, Any], out: Path) -> None:
    from components.runs.dataset_checks import check_dataset
    from components.runs.recipe import loop_config
    from components.runs.run_dir import prepare_run_dir
    from components.runs.worker import PretrainRecipe

    config = from_dict(PretrainConfig, cfg)
    facts = check_dataset(config)
    run_dir = prepare_run_dir(config) if rank == 0 else None
    box = [run_dir]
    dist.broadcast_object_list(box)
    host = _Host(rank, world, str(box[0]))

    class GpuPathsOnCpu(PretrainRecipe):
        """The recipe with what it would do on a GPU, where a CPU can do it."""

        def gpu_paths(self, device: torch.device) -> bool:
            return True

        def setup(self) -> None:
            super().setup()
            from components.data.augment import BatchedSimCLRAugment

            ops = self.train_loader._post_ops  # per view: the batched augmentation
            assert ops and all(isinstance(o, BatchedSimCLRAugment) for o in ops), ops
            layouts = {p.is_contiguous(memory_format=torch.channels_last)
                       for m in (self.model, self.ema) if m is not None
                       for p in m.parameters() if p.dim() == 4}
            assert layouts == {True}  # model and EMA copy: channels_last
            from components.runtime.distributed import GlobalBatchNorm

            norms = [m for m in self.ddp.module.encoder.modules()
                     if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            # model.sync_bn: BatchNorm over both ranks' batch, without host syncs
            assert norms and all(isinstance(m, GlobalBatchNorm) for m in norms)

        def train_epoch(self, epoch: int) -> dict[str, Any]:
            with strict_device() as mode:
                row = super().train_epoch(epoch)
            self.checked = getattr(self, "checked", 0) + mode.collectives
            return row

        def evaluate_epoch(self, epoch: int, row: dict[str, Any]) -> None:
            with strict_device() as mode:
                super().evaluate_epoch(epoch, row)
            self.checked += mode.collectives

    recipe = GpuPathsOnCpu(loop_config(config, host.run_dir, facts, pause_at_step=0),
                           host=host)
    recipe.run()
    torch.save({"rows": host.rows, "checked": recipe.checked}, out)
    dist.barrier()


STRICT_LOSSES = [
    {"name": "supcon", "tau": 0.2},
    {"name": "xclr", "tau": 0.2, "tau_s": 0.1, "graph": "caption"},
    {"name": "cone", "bank_size": 40, "top_n": 8},
]


@pytest.mark.slow
def test_strict_device_run_of_the_recipe(tmp_path: Path) -> None:
    """A 2-rank recipe run per loss (SupCon, X-CLR on captions, CoNe) with the GPU paths taken
    on CPU under the strict device mode (the two ranks start once for the three runs); the
    online linear probe on (its all-reduces checked too), equal on both ranks."""
    data = synthetic_dataset(tmp_path / "ds", size=16)
    cfgs = [tiny_run_config(data, tmp_path / "runs", name=f"run-{loss['name']}", loss=loss,
                            train__epochs=2, train__steps_per_epoch=2, train__amp="bf16",
                            data__augment={"resolution": 16, "blur_p": 0.5},
                            probe={"every_epochs": 1})
            for loss in STRICT_LOSSES]
    spawn_bounded(_strict_worker, (2, rendezvous_file(tmp_path), cfgs, str(tmp_path)), 2,
                  480.0)
    for i, loss in enumerate(STRICT_LOSSES):
        for r in range(2):
            got = torch.load(tmp_path / f"{i}-r{r}.pt", weights_only=False)
            assert [row["epoch"] for row in got["rows"]] == [1, 2], loss
            assert all(np.isfinite(row["loss"]) and 0 <= row["knn_top1"] <= 1
                       and 0 <= row["probe_top1"] <= 1 and np.isfinite(row["probe_loss"])
                       for row in got["rows"]), loss
            assert got["checked"] > 0, loss  # the collectives were seen and checked
        rows = [torch.load(tmp_path / f"{i}-r{r}.pt", weights_only=False)["rows"]
                for r in range(2)]
        assert [r["probe_top1"] for r in rows[0]] == [r["probe_top1"] for r in rows[1]], loss


# -- workers the recipe cannot place on GPUs ---------------------------------------------------


@pytest.mark.parametrize("scaling,match", [
    ({"num_workers": 2, "use_gpu": True, "gpus_per_worker": 0.5},
     r"scaling.gpus_per_worker=0.5 with scaling.num_workers=2 is not allowed"),
    ({"num_workers": 1, "use_gpu": True, "gpus_per_worker": 2.0},
     r"scaling.gpus_per_worker=2.0 is not allowed"),
])
def test_gpu_shares_the_recipe_cannot_use_are_refused(scaling: dict[str, Any], match: str,
                                                      tmp_path: Path) -> None:
    cfg = tiny_run_config(tmp_path, tmp_path / "runs", scaling=scaling)
    with pytest.raises(ConfigError, match=match):
        from_dict(PretrainConfig, cfg)


def test_gpu_shares_the_recipe_can_use_are_accepted(tmp_path: Path) -> None:
    for scaling in ({"num_workers": 1, "use_gpu": True, "gpus_per_worker": 0.5},
                    {"num_workers": 4, "use_gpu": True, "gpus_per_worker": 1.0},
                    {"num_workers": 2, "use_gpu": False, "gpus_per_worker": 0.5}):
        from_dict(PretrainConfig, tiny_run_config(tmp_path, tmp_path / "runs", scaling=scaling))


def test_sweep_resources_refuse_fractional_gpus_for_multi_worker_trials() -> None:
    from components.search_space import Resources

    Resources(workers=1, gpus_per_worker=0.25)  # four one-worker trials share a GPU
    with pytest.raises(ConfigError, match=r"resources.gpus_per_worker=0.5 with "
                                          r"resources.workers=2 is not allowed"):
        Resources(workers=2, gpus_per_worker=0.5)
    with pytest.raises(ConfigError, match=r"resources.gpus_per_worker=2.0 is not allowed"):
        Resources(workers=1, gpus_per_worker=2.0)


# -- FFCV's loader thread on the rank's GPU ----------------------------------------------------


def test_loader_thread_selects_the_rank_device(no_jit: None, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """FFCV's pipeline thread makes CUDA calls (streams, events, copies); the current device
    is per thread, so without a ``set_device`` there every local rank >= 1 opens a context on
    GPU 0. The thread must select the loader's device before its first batch."""
    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=4)
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: calls.append((threading.current_thread().name, d)))
    loader = ViewLoader(data / "train.beton", batch_size=4, views=1, num_workers=1,
                        augment=AugmentConfig(resolution=16))
    loader.loader.thread_device = CUDA  # as a CUDA loader sets it (the copy itself needs a GPU)
    assert len(list(loader)) == 4
    threads = {name for name, _ in calls}
    assert calls and all(d == CUDA for _, d in calls), calls
    assert threading.current_thread().name not in threads  # set in the pipeline thread


class _FakeCuda:
    """What a faked CUDA call returns: a stream / event / context manager that does nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> _FakeCuda:
        return self

    def __getattr__(self, name: str) -> _FakeCuda:  # wait_stream, record, wait, synchronize
        return self

    def __enter__(self) -> _FakeCuda:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


# Every CUDA entry FFCV's loader and the reader use: each opens a CUDA context on a GPU
# machine (on GPU 0 unless the thread selected another device).
CUDA_ENTRIES = ("set_device", "current_stream", "Stream", "Event", "stream", "synchronize",
                "current_device", "init", "_lazy_init")


def _record_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """FFCV as it runs on a GPU machine (``IS_CUDA``, decided at its import), with every CUDA
    entry of :data:`CUDA_ENTRIES` and ``Tensor.pin_memory`` recording its call (and doing
    nothing): the names called, in order."""
    from ffcv.loader import epoch_iterator

    calls: list[str] = []

    def record(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> _FakeCuda:
            calls.append(name)
            return _FakeCuda()
        return call

    def pin(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append("pin_memory")
        return self

    monkeypatch.setattr(epoch_iterator, "IS_CUDA", True)
    for name in CUDA_ENTRIES:
        monkeypatch.setattr(torch.cuda, name, record(name))
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return calls


@pytest.mark.parametrize("train", [True, False])
def test_a_cpu_reader_never_calls_into_cuda(no_jit: None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, train: bool) -> None:
    """Issue 40: FFCV uses CUDA whenever torch sees a GPU, whatever the loader's device: its
    iterator took the current stream, made streams and events and pinned every host buffer,
    each opening a CUDA context on GPU 0 in CPU-only processes (preprocess tasks, CPU sweep
    trials, ``evaluate --device cpu``). A CPU reader on a machine where FFCV sees a GPU makes
    no CUDA call; a CUDA reader's loader (its thread device set) still makes FFCV's calls
    (the net catches them), and both read the same batches."""
    data = synthetic_dataset(tmp_path / "ds", size=16, train_per_class=4)
    split = data / ("train.beton" if train else "val.beton")
    calls = _record_cuda(monkeypatch)

    def read(thread_device: torch.device | None) -> list[Any]:
        loader = ViewLoader(split, batch_size=4, views=2, num_workers=1, train=train, seed=3,
                            augment=AugmentConfig(resolution=RES), device="cpu")
        if thread_device is not None:
            loader.loader.thread_device = thread_device  # as a cuda:N reader sets it
        return list(loader)

    on_cpu = read(None)
    assert on_cpu and calls == [], calls
    on_cuda = read(CUDA)
    assert {"set_device", "current_stream", "Stream", "stream", "pin_memory"} <= set(calls)
    assert len(on_cuda) == len(on_cpu)
    for a, b in zip(on_cpu, on_cuda, strict=True):  # FFCV's own code and the host copy agree
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sample_ids, b.sample_ids)


def test_cuda_sync_debug_mode_is_read_once_and_checked(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from components.runs.dataset_checks import RunFacts
    from components.runs.diagnostics import SYNC_DEBUG_ENV
    from components.runs.errors import RunError
    from components.runs.recipe import loop_config

    cfg = from_dict(PretrainConfig, tiny_run_config(tmp_path, tmp_path / "runs"))
    facts = RunFacts(num_classes=4, caption_dim=0, dataset={}, knn=True, knn_note="",
                     needs_captions=False)
    monkeypatch.setenv(SYNC_DEBUG_ENV, "warn")
    assert loop_config(cfg, "r", facts)["cuda_sync_debug"] == "warn"
    monkeypatch.setenv(SYNC_DEBUG_ENV, "loud")
    with pytest.raises(RunError, match=r"SIMGRAPH_CUDA_SYNC_DEBUG='loud' is not allowed: "
                                       r"choose one of default, warn, error"):
        loop_config(cfg, "r", facts)
