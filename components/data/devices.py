"""The device a stage reads and computes on: ``cpu`` or ``cuda:N``, never a bare ``cuda``.

CUDA devices always carry their index (``cuda:N``): FFCV's loader thread makes the reader's
device its current one (``torch.cuda.set_device``), which refuses a bare ``cuda``.
:func:`resolve_device` picks a stage's device from what it was given (``--device``, or a Ray
task's GPUs), never from ``torch.cuda.is_available()`` alone.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from components.data.reader_errors import ReaderSettingError


def resolve_device(requested: str | torch.device | None = None) -> torch.device:
    """The device a stage (``simgraph evaluate``, ``embed``, a sweep's confirmation) reads and
    computes on: ``cpu`` or ``cuda:N``, never a bare ``cuda`` (see the module docstring).

    ``requested``: ``cpu``, ``cuda`` (= ``cuda:0``) or ``cuda:N`` (a ``--device``). ``None``:
    from the resources the stage was given. In a Ray task or actor that is the GPUs Ray gave
    it: ``cuda:0`` when it was given one (Ray sets ``CUDA_VISIBLE_DEVICES`` to them, so the
    first is index 0), else ``cpu`` — Ray 2.60 no longer hides a node's GPUs from CPU-only
    tasks, so ``torch.cuda.is_available()`` there says nothing about what the task holds.
    Elsewhere ``cuda:0`` when torch sees a GPU, else ``cpu``.

    Raises:
        ReaderSettingError: not ``cpu`` / ``cuda[:N]``, or a GPU that torch does not see.
    """
    what = f"--device {requested}"
    if requested is None:
        gpus = _ray_task_gpus()
        if gpus is None:
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if not gpus:
            return torch.device("cpu")
        requested, what = "cuda:0", f"the GPU this Ray task was given (Ray's id {gpus[0]})"
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ReaderSettingError(f"{what!s} is not a device this reader uses: use cpu or cuda:N "
                                 "(N: the GPU's index, e.g. cuda:0)")
    if dev.type == "cpu":
        return torch.device("cpu")
    index = 0 if dev.index is None else dev.index
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ReaderSettingError(
            f"{what} asks for a GPU, but torch sees no CUDA device here (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu, or run "
            "where torch sees the GPU")
    if index >= count:
        raise ReaderSettingError(
            f"{what}: torch sees {count} CUDA device{'s' if count != 1 else ''} (cuda:0 to "
            f"cuda:{count - 1}, numbered within CUDA_VISIBLE_DEVICES); use one of those")
    return torch.device("cuda", index)


def _ray_task_gpus() -> list[Any] | None:
    """The GPU ids Ray gave the task or actor this process runs; ``None`` outside one (Ray not
    imported or not started, or the driver: its ``get_gpu_ids()`` is always empty)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray._private.worker import WORKER_MODE

    if ray.get_runtime_context().worker.mode != WORKER_MODE:
        return None
    return list(ray.get_gpu_ids())
