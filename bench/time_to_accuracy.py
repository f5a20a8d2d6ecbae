"""How long does each loss take to reach a fixed kNN@20 on Fashion-MNIST?

Fashion-MNIST (Debian ``dataset-fashion-mnist``, ``--per-class`` images per class of the
official train and test splits), the small-data recipe (``pipelines/configs/pretrain/
small_data.yaml``: 4-block ConvNet, Adam, constant LR, batch 128, one worker) trained through
``simgraph pretrain`` for up to ``--epochs`` epochs per loss and seed. After every epoch the
online kNN@20 (train bank, **test** queries: 10 × ``--per-class`` images, steadier than the
small val split) is compared with each ``--targets`` value. Per loss and target (mean ± std
over the seeds that reach it): the first epoch at or above the target, the training samples
seen by then, and the wall time — training plus the per-epoch kNN, the time a user waits —
and how many seeds reached it.

    python bench/time_to_accuracy.py [--per-class 200] [--epochs 20] [--seeds 0 1]
        [--losses simclr supcon xclr] [--targets 0.78 0.82 0.85] [--work DIR] [--out FILE]

The numbers are this machine's CPU. On a GPU machine run the same bench with
``--config pipelines/configs/pretrain/fashion_mnist_resnet18.yaml`` (ResNet-18 small stem,
NCCL, FFCV to CUDA, AMP) for the GPU column; docs/benchmarks.md says which was measured.
A finished run in ``--work`` is read back, not trained again.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import PreprocessConfig, PretrainConfig, load_config  # noqa: E402
from components.runtime.session import ray_session  # noqa: E402
from pipelines import preprocess, pretrain  # noqa: E402

RECIPE = ROOT / "pipelines/configs/pretrain/small_data.yaml"
DATA = ROOT / "pipelines/configs/data/demo.yaml"
LOSSES: dict[str, list[str]] = {
    "simclr": ["loss.name=simclr", "loss.tau=0.1"],
    "supcon": ["loss.name=supcon", "loss.tau=0.1"],
    "xclr": ["loss.name=xclr", "loss.tau=0.1", "loss.tau_s=0.1", "loss.graph=class"],
    "sincere": ["loss.name=sincere", "loss.tau=0.1"],
    "cone": ["loss.name=cone", "loss.bank_size=1024", "loss.top_n=16"],
    "ce": ["loss.name=ce"],
}


def reached(history: Sequence[dict[str, Any]], target: float, samples_per_epoch: int
            ) -> dict[str, float] | None:
    """The first epoch whose online kNN is ≥ ``target``: epoch, samples seen, wall seconds
    (training + kNN of every epoch up to it); None if no epoch reaches it."""
    wall = 0.0
    for row in history:
        wall += float(row["time_s"]) + float(row.get("eval_s", 0.0))
        if float(row.get("knn_top1", -1.0)) >= target:
            return {"epoch": float(row["epoch"]), "samples": float(row["epoch"] *
                                                                   samples_per_epoch),
                    "wall_s": wall}
    return None


def _ms(xs: Sequence[float], fmt: str) -> str:
    if not xs:
        return "—"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{fmt.format(statistics.fmean(xs))} ± {fmt.format(sd)}"


def report(results: dict[str, list[tuple[list[dict[str, Any]], int]]],
           targets: Sequence[float], args: argparse.Namespace, seconds: float) -> str:
    lines = [
        f"`python bench/time_to_accuracy.py --per-class {args.per_class} --epochs "
        f"{args.epochs} --seeds {' '.join(map(str, args.seeds))} --losses "
        f"{' '.join(args.losses)} --targets {' '.join(map(str, targets))}` — "
        f"{datetime.date.today()}, {platform.machine()}, {len(os.sched_getaffinity(0))} "
        f"CPUs, {seconds / 60:.0f} min; config `{Path(args.config).relative_to(ROOT)}`; "
        "online kNN@20 on the test split after every epoch; mean ± std over the seeds that "
        "reach the target.",
        "",
        "| loss | target kNN@20 | reached (seeds) | epoch | samples | wall time (s) | "
        "best kNN@20 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for loss, runs in results.items():
        best = [max(float(r.get("knn_top1", 0.0)) for r in h) * 100 for h, _ in runs]
        for t in targets:
            hits = [x for x in (reached(h, t, n) for h, n in runs) if x is not None]
            lines.append(
                f"| {loss} | {100 * t:.0f} % | {len(hits)}/{len(runs)} | "
                f"{_ms([h['epoch'] for h in hits], '{:.1f}')} | "
                f"{_ms([h['samples'] for h in hits], '{:,.0f}')} | "
                f"{_ms([h['wall_s'] for h in hits], '{:.0f}')} | {_ms(best, '{:.1f}')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--losses", nargs="+", default=["simclr", "supcon", "xclr"],
                    choices=list(LOSSES))
    ap.add_argument("--targets", type=float, nargs="+", default=[0.78, 0.82, 0.85])
    ap.add_argument("--config", default=str(RECIPE))
    ap.add_argument("--work", default="runs/time_to_accuracy")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("overrides", nargs="*", help="extra pretrain overrides for every run")
    args = ap.parse_args()
    if any(not 0 < t <= 1 for t in args.targets):
        ap.error(f"--targets {args.targets}: give kNN top-1 fractions in (0, 1], e.g. 0.82")
    work = Path(args.work).resolve()
    pre = load_config(DATA, PreprocessConfig, [f"output={work / 'data'}",
                                               f"source.max_per_class={args.per_class}"])
    results: dict[str, list[tuple[list[dict[str, Any]], int]]] = {}
    t0 = time.perf_counter()
    with ray_session(None):
        preprocess.run(pre, echo=False)
        for loss in args.losses:
            for seed in args.seeds:
                cfg = load_config(Path(args.config), PretrainConfig, [
                    *LOSSES[loss], f"name={loss}-s{seed}", f"storage={work / 'runs'}",
                    f"data.dataset={pre.output}", f"train.seed={seed}",
                    f"train.epochs={args.epochs}", "knn.every_epochs=1",
                    "knn.query_split=test", "checkpoint.every_epochs=5", *args.overrides])
                history = pretrain.run(cfg, echo=False)  # a finished run is read back
                per_epoch = int(history[0]["step"]) * cfg.data.batch_size * \
                    cfg.scaling.num_workers
                results.setdefault(loss, []).append((history, per_epoch))
                knn = [round(100 * float(r.get("knn_top1", 0.0)), 1) for r in history]
                print(f"[time_to_accuracy] {cfg.name}: kNN@20 by epoch {knn} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    text = report(results, args.targets, args, time.perf_counter() - t0)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
