"""Sweep overhead: a sweep's wall time against the time its trials spend training, for each
way a trial can run (``resources.mode``: ``in_trial`` — inside the Tune trial actor — and
``worker_group`` — a Ray Train worker group per trial), side by side in one Ray session.

Per trial: training = the sum of its per-epoch ``time_s`` (the epoch loop), evaluation = the
sum of ``eval_s`` (the online kNN). Slots = trials that run at once (``max_concurrent``;
``auto``: as many as the cluster's CPUs hold). Training share = Σ training / (slots × wall):
the fraction of the reserved trial-seconds spent training. Overhead per trial = (slots × wall
− Σ training − Σ evaluation) / trials: Tune's trial actor, Train's controller / worker group /
process group when used, imports, the model and FFCV Loaders, checkpoints, idle slots, the
results and plots at the end. Ray itself starts once, before all rows, and is reported on its
own line. Epochs saved = 1 − epochs run / (trials × max epochs) (ASHA).

    python bench/sweep_overhead.py [SPACE.yaml] [--modes in_trial worker_group] [key=value ...]

Run it inside a loopback-only network namespace like the tests: ``make bench-sweep`` from the
repo root, after ``make demo`` (which builds the demo sweep's dataset, ``data/demo``).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.search_space import load_sweep, trial_config  # noqa: E402
from components.sweep.driver import run as run_sweep  # noqa: E402
from components.sweep.tuner import concurrency  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def measure(space: str, overrides: list[str], mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [f"storage={tmp}", f"resources.mode={mode}", *overrides]
        sweep = load_sweep(space, args)
        slots = concurrency(sweep)
        t0 = time.perf_counter()
        rows = run_sweep(space, args, echo=False)
        wall = time.perf_counter() - t0
        train_s = eval_s = 0.0
        epochs = 0
        for metrics in (Path(tmp) / sweep.name / "trials").glob("*/metrics.csv"):
            with open(metrics) as f:
                for row in csv.DictReader(f):
                    train_s += float(row["time_s"])
                    eval_s += float(row.get("eval_s") or 0.0)
                    epochs += 1
        max_epochs = (sweep.scheduler.max_epochs
                      or trial_config(sweep, {}, name="x", storage=tmp).train.epochs)
    n = max(len(rows), 1)
    return {"trials": len(rows), "slots": slots, "wall": wall, "train": train_s,
            "eval": eval_s, "share": train_s / (slots * wall),
            "overhead": (slots * wall - train_s - eval_s) / n, "epochs": epochs,
            "max_epochs": len(rows) * max_epochs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("space", nargs="?", default=str(ROOT / "search_spaces/demo.yaml"))
    p.add_argument("--modes", nargs="+", default=["in_trial", "worker_group"],
                   choices=["in_trial", "worker_group"])
    p.add_argument("--concurrency", nargs="+", default=[None],
                   help="max_concurrent values to compare (1, 2, auto, ...; default: the file's)")
    args, overrides = p.parse_known_args()
    bad = [o for o in overrides if "=" not in o]
    if bad:
        p.error(f"not a key=value override: {' '.join(bad)}")

    import ray

    t0 = time.perf_counter()
    ray.init(address="local", object_store_memory=1 << 30, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    rows = [(m, c) for m in args.modes for c in args.concurrency]
    try:
        results = {(m, c): measure(args.space, overrides + ([f"max_concurrent={c}"] if c else []),
                                   m)
                   for m, c in rows}
    finally:
        ray.shutdown()

    print(f"{args.space} {' '.join(overrides)} — {datetime.date.today()}, {platform.machine()}, "
          f"{platform.node()}; Ray start-up {ray_start:.1f} s (once, not in the rows)\n")
    print("| mode | max_concurrent (slots) | trials | sweep wall | Σ training | Σ kNN eval | "
          "training share | overhead per trial | epochs run |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (m, c), r in results.items():
        print(f"| {m} | {c or 'file'} ({r['slots']}) | {r['trials']} | {r['wall']:.1f} s | "
              f"{r['train']:.1f} s | {r['eval']:.1f} s | {r['share']:.0%} | "
              f"{r['overhead']:.1f} s | {r['epochs']} of {r['max_epochs']} |")


if __name__ == "__main__":
    main()
