"""Pretraining throughput: samples/s and data-wait fraction with 1 and 2 Ray Train workers.

Runs the demo pretraining config (``pipelines/configs/pretrain/demo.yaml``; dataset from
``make demo`` or ``simgraph preprocess pipelines/configs/data/demo.yaml``) once per worker
count in one local Ray, fresh run dirs, and compares the medians over epochs 2.. (epoch 1
includes start-up). Same global batch in both settings.

    python bench/workers.py [--epochs 4] [--global-batch 128] [key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import PretrainConfig, load_config  # noqa: E402
from components.runtime.session import ray_session  # noqa: E402
from pipelines import pretrain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, ray_session(None):
        for workers in (1, 2):
            cfg = load_config(ROOT / "pipelines/configs/pretrain/demo.yaml", PretrainConfig, [
                f"name=bench-{workers}w", f"storage={tmp}", f"train.epochs={args.epochs}",
                f"scaling.num_workers={workers}", f"scaling.cpus_per_worker={1 / workers}",
                f"data.batch_size={args.global_batch // workers}", "knn.every_epochs=0",
                *args.overrides,
            ])
            history = pretrain.run(cfg, echo=False)[1:]
            rows[workers] = (statistics.median(r["samples_per_s"] for r in history),
                             statistics.median(r["data_wait"] for r in history))
    print(f"demo model, global batch {args.global_batch}, median of epochs 2..{args.epochs}")
    print("workers  samples/s  data-wait")
    for w, (sps, wait) in rows.items():
        print(f"{w:7d}  {sps:9.0f}  {wait:9.3f}")
    print(f"2 vs 1 workers: {rows[2][0] / rows[1][0]:.2f}x samples/s")


if __name__ == "__main__":
    main()
