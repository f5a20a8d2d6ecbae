"""What a run tells about itself beside its metrics, and the switches that make it tell more:
the seconds an epoch's steps waited for their batches (:class:`DataWait`), rank 0's progress
cadence (:data:`PROGRESS_EVERY_S`), each rank's worker record ``workers/rank<r>.json``
(:func:`worker_info`), host syncs reported by CUDA (:data:`SYNC_DEBUG_ENV`), and the resume
tests' fault injection (:data:`PAUSE_ENV`, :func:`pause_once`).

Fault injection for the resume tests: :data:`PAUSE_ENV` (``SIMGRAPH_PAUSE_AT_STEP=N``) in the
environment of the process that builds the trainer makes every rank sleep once before global
step N (a flag file in ``workers/`` stops it repeating after a restart); read once by
:func:`components.runs.recipe.loop_config`, never inside the step loop.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from components.runs.errors import RunError
from components.runtime import console

PAUSE_ENV = "SIMGRAPH_PAUSE_AT_STEP"
PROGRESS_EVERY_S = 20.0  # rank 0 prints a progress line this often during a long epoch
# ``warn`` / ``error``: torch.cuda.set_sync_debug_mode in every GPU worker (read by
# loop_config in the process that builds the trainer), to find host syncs in the step.
SYNC_DEBUG_ENV = "SIMGRAPH_CUDA_SYNC_DEBUG"
SYNC_DEBUG_MODES = ("", "default", "warn", "error")


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


def pause_once(run_dir: str, rank: int, step: int, seconds: float = 300.0) -> None:
    """Sleep ``seconds`` before global ``step`` (:data:`PAUSE_ENV`), once per run dir and rank:
    the flag file ``workers/paused-rank<r>-step<n>`` stops it repeating after a restart."""
    from components.io import storage

    flag = storage.join(run_dir, "workers", f"paused-rank{rank}-step{step}")
    if not storage.exists(flag):
        storage.write_text(flag, "")
        time.sleep(seconds)


def worker_info(run_dir: str, rank: int, world: int, device: Any,
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
