"""Start-up of a small ``simgraph pretrain`` run: in-process (``scaling.host: in_process``, the
default for a local one-worker CPU run) against a Ray Train worker group (``ray_train``),
interleaved, side by side in one run (issue 33 item 1).

Each run is the CLI in a fresh process on the tests' synthetic dataset (a small ConvNet, one
CPU worker); per run: wall time, the epochs' own time (Σ ``time_s`` + ``eval_s`` of its
metrics.csv) and the rest — Python and torch imports, Ray start, controller and worker group,
loaders, checkpoints, teardown. Printed: medians over ``--repeats`` with each host's range,
and the ratio in-process / Ray Train.

    python bench/startup.py [--repeats 3] [--epochs 2]

Run it inside a loopback-only network namespace like the tests (Ray binds to the machine's
address otherwise), never beside ``make test``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.datasets import synthetic_dataset, tiny_run_config  # noqa: E402

HOSTS = ("in_process", "ray_train")


def one_run(dataset: Path, work: Path, host: str, index: int, epochs: int) -> dict[str, float]:
    name = f"{host}-{index}"
    cfg = tiny_run_config(dataset, work / "runs", name=name, train__epochs=epochs,
                          scaling__num_workers=1, scaling__cpus_per_worker=1.0,
                          scaling__host=host)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.cli", "pretrain", str(path)], cwd=ROOT,
                   check=True, capture_output=True)
    wall = time.perf_counter() - t0
    with open(work / "runs" / name / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    epochs_s = sum(float(r["time_s"]) + float(r.get("eval_s") or 0.0) for r in rows)
    return {"wall": wall, "epochs": epochs_s, "rest": wall - epochs_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = synthetic_dataset(work / "ds")
        got: dict[str, list[dict[str, float]]] = {h: [] for h in HOSTS}
        for i in range(args.repeats):
            for host in HOSTS:  # interleaved: the machine's noise hits both alike
                got[host].append(one_run(dataset, work, host, i, args.epochs))
    print(f"## Start-up ({datetime.date.today()}, {platform.machine()}, "
          f"{args.repeats} runs each, interleaved, {args.epochs} epochs of the synthetic "
          "dataset, one CPU worker)\n")
    print("| host | wall s (median [min, max]) | epochs s | everything else s |")
    print("|---|---:|---:|---:|")
    med: dict[str, dict[str, float]] = {}
    for host, runs in got.items():
        med[host] = {k: statistics.median(r[k] for r in runs) for k in ("wall", "epochs", "rest")}
        walls = [r["wall"] for r in runs]
        print(f"| {host} | {med[host]['wall']:.1f} [{min(walls):.1f}, {max(walls):.1f}] | "
              f"{med[host]['epochs']:.1f} | {med[host]['rest']:.1f} |")
    a, b = med["in_process"], med["ray_train"]
    print(f"\nin-process / Ray Train: wall {a['wall'] / b['wall']:.2f}x, everything but the "
          f"epochs {a['rest'] / b['rest']:.2f}x")


if __name__ == "__main__":
    main()
