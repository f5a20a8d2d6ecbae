"""``train.accumulate: k`` (the gradient cache): peak memory and time per sample of a training
step vs k, the batch and its loss unchanged.

One step takes a batch of ``--batch`` samples × 2 views; with k > 1 the encoder runs on k
chunks twice (without a graph, then with one, chunk by chunk:
:class:`components.training.step.GradCache`), so its activations are a chunk's while the loss
sees the whole batch. Memory: every k in a process of its own (the CPU's peak resident set,
``ru_maxrss``, is a per-process high-water mark that cannot be reset), measured from just
before the first step (model, optimiser and batch already allocated) over a warm-up step and
one more — activations, gradients and the step's transients; on CUDA,
``torch.cuda.max_memory_allocated`` over the second step, above what was allocated before it.
Time: all ks in one process, interleaved step by step (``--steps`` rounds after a warm-up
round). SGD without momentum (no optimiser state to allocate in the first step). The
median step's wall time and, for a machine shared with other work, its process CPU time
(every thread's).

    python bench/accumulate.py [--backbone resnet18] [--batch 64] [--resolution 64]
        [--ks 1 2 4] [--steps 3] [--loss supcon]   # ~3.5 min on a 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import (  # noqa: E402
    LOSS_CONFIGS,
    ModelConfig,
    TrainConfig,
    from_dict,
)
from components.data.reader import Batch  # noqa: E402
from components.training.optim import build_optimizer, build_scheduler  # noqa: E402
from components.training.step import build_model, train_step  # noqa: E402


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Setup:
    """A model, optimiser and batch; :meth:`step` times one training step at ``k``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = device = torch.device(args.device)
        torch.manual_seed(0)
        model_cfg = ModelConfig(backbone=args.backbone, small_images=args.small_images,
                                sync_bn=False, channels_last=device.type == "cuda")
        loss: Any = from_dict(LOSS_CONFIGS[args.loss], {"tau": 0.1})
        self.model, self.ema = build_model(model_cfg, loss, args.classes, None, 0,
                                           args.resolution)
        self.model.channels_last = device.type == "cuda"
        self.model.to(device)
        self.opt = build_optimizer(self.model, "sgd", 0.05, 0.0, 0.0)
        self.sched = build_scheduler(self.opt, 10**6, 0)
        g = torch.Generator().manual_seed(0)
        self.batch = Batch(
            images=torch.randn(args.batch, 2, 3, args.resolution, args.resolution, generator=g
                               ).to(device),
            labels=torch.randint(0, args.classes, (args.batch,), generator=g).to(device),
            sample_ids=torch.arange(args.batch, device=device), captions=None)
        self.steps = 0

    def step(self, k: int) -> tuple[float, float]:
        """(wall, this process's CPU) seconds of one step at ``accumulate=k``."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        t, c = time.perf_counter(), time.process_time()
        train_step(self.model, self.ema, self.opt, self.sched, None, self.batch,
                   train_cfg=TrainConfig(accumulate=k, amp=self.args.amp), device=self.device,
                   step=self.steps, total_steps=10**6, ema_momentum=0.99, where="bench")
        if cuda:
            torch.cuda.synchronize()
        self.steps += 1
        return time.perf_counter() - t, time.process_time() - c


def peak_memory(args: argparse.Namespace, k: int) -> float:
    """MiB a step at ``k`` takes at its peak (this process: a warm-up step and one more)."""
    setup = _Setup(args)
    before = _rss_mib()
    setup.step(k)  # warm-up
    if setup.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(setup.device)
        base = torch.cuda.memory_allocated(setup.device)
        setup.step(k)
        return (torch.cuda.max_memory_allocated(setup.device) - base) / 2**20
    setup.step(k)
    return _rss_mib() - before


def step_times(args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """Median (wall, CPU) seconds per step for each k: the ks interleaved in one process, the
    order reversed every round, so drift and other work hit them alike; round 0 warms up."""
    setup = _Setup(args)
    times: dict[int, list[tuple[float, float]]] = {k: [] for k in args.ks}
    for r in range(args.steps + 1):
        for k in (args.ks if r % 2 else args.ks[::-1]):
            t = setup.step(k)
            if r:
                times[k].append(t)
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="resnet18")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (2 views each)")
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--small-images", action="store_true",
                    help="the CIFAR stem (no stride-2 stem or max-pool: 16× the activations)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per k (median)")
    ap.add_argument("--loss", default="simclr", choices=["simclr", "supcon"])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--amp", default="none", choices=["none", "bf16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps({"peak_mib": peak_memory(args, args.child)}))
        return
    bad = [k for k in args.ks if k < 1 or args.batch % k]
    if bad:
        raise SystemExit(f"--ks {bad}: each k must be >= 1 and divide --batch {args.batch}")
    peaks = {}
    for k in args.ks:  # one process per k: a fresh high-water mark
        cmd = [sys.executable, __file__, *sys.argv[1:], "--child", str(k)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        peaks[k] = json.loads(out.strip().splitlines()[-1])["peak_mib"]
    times = step_times(args)
    where = (torch.cuda.get_device_name(0) if args.device == "cuda"
             else f"cpu, {torch.get_num_threads()} threads")
    print(f"{args.backbone}{' (small-image stem)' if args.small_images else ''}, batch "
          f"{args.batch} × 2 views, {args.resolution} px, {args.loss}, amp {args.amp}, {where}; "
          f"median of {args.steps} interleaved steps per k after 1 warm-up round")
    memory = "peak allocated above the start (MiB)" if args.device == "cuda" else \
        "peak RSS above the start (MiB)"
    print(f"| k | chunk | ms / sample | × k=1 time | CPU ms / sample | × k=1 CPU | {memory} "
          "| × k=1 memory |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    k0 = args.ks[0]
    (w0, c0), m0 = times[k0], peaks[k0]
    for k in args.ks:
        (w, c), m = times[k], peaks[k]
        print(f"| {k} | {args.batch // k} | {1000 * w / args.batch:.2f} | {w / w0:.2f} "
              f"| {1000 * c / args.batch:.2f} | {c / c0:.2f} | {m:.0f} | {m / m0:.2f} |")

if __name__ == "__main__":
    main()
