"""Sweep overhead: sweep wall time vs the sum of its trials' training time, and the share of
epochs ASHA saved, for a search space (default ``search_spaces/demo.yaml``) on this machine.

Training time of a trial = the sum of its per-epoch ``time_s`` (the epoch loop only: no Ray
start-up, no Train worker start-up, no kNN evaluation). Overhead = wall − Σ training time.
Epochs saved = 1 − epochs run / (trials × max epochs).

    python bench/sweep_overhead.py [SPACE.yaml] [key=value ...]
"""

from __future__ import annotations

import csv
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.search_space import load_sweep, trial_config  # noqa: E402
from pipelines import sweep as sweep_pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    args = sys.argv[1:]
    space = args[0] if args and "=" not in args[0] else str(ROOT / "search_spaces/demo.yaml")
    overrides = [a for a in args if "=" in a]
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"storage={tmp}", *overrides]
        sweep = load_sweep(space, overrides)
        t0 = time.perf_counter()
        rows = sweep_pipeline.run(space, overrides, echo=False)
        wall = time.perf_counter() - t0
        trials = Path(tmp) / sweep.name / "trials"
        train_s, epochs = 0.0, 0
        for metrics in trials.glob("*/metrics.csv"):
            with open(metrics) as f:
                for row in csv.DictReader(f):
                    train_s += float(row["time_s"])
                    epochs += 1
        max_epochs = (sweep.scheduler.max_epochs
                      or trial_config(sweep, {}, name="x", storage=tmp).train.epochs)
    n = len(rows)
    print(f"{space}: {n} trials, max {max_epochs} epochs each, scheduler {sweep.scheduler.name}")
    print(f"sweep wall time          {wall:8.1f} s")
    print(f"sum of training time     {train_s:8.1f} s  ({train_s / wall:.1%} of wall)")
    print(f"overhead per trial       {(wall - train_s) / max(n, 1):8.1f} s")
    print(f"epochs run               {epochs} of {n * max_epochs} "
          f"(ASHA saved {1 - epochs / max(n * max_epochs, 1):.0%})")


if __name__ == "__main__":
    main()
