"""``simgraph run CONFIG [key=value ...]``: preprocess, then several pretraining runs, then a
comparison table — the demo (``make demo``) and any "same data, several losses" study.

1. Load the pipeline config and every config it names, with every run's overrides, so a typo
   in the last run fails before any work starts.
2. Preprocess (skipped when the dataset dir is already complete and unchanged).
3. Pretrain each run in turn (each resumes if it was interrupted; a finished one is reused),
   each holding its run dir's one-writer lock as ``simgraph pretrain`` does
   (:func:`components.runs.recipe.run_pretraining`): a run another process is training is refused
   in one line naming it.
4. Print one row per run: loss, epochs, final loss, online kNN top-1, wall time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from components.config import load_pipeline

plan = load_pipeline  # the preprocess config and every run's pretrain config, validated


def run(config: str, overrides: Sequence[str] = (), echo: bool = True) -> list[dict[str, Any]]:
    from components.data.build import run as build_dataset
    from components.runs.recipe import run_pretraining
    from components.runtime.session import ray_session

    pre, runs = plan(config, overrides)
    rows = []
    with ray_session(pre.num_cpus):
        build_dataset(pre, echo=echo)
        for name, cfg in runs.items():
            if echo:
                print(f"\n=== {cfg.name}: {cfg.loss.name}, {cfg.train.epochs} epochs, "
                      f"{cfg.scaling.num_workers} workers ===")
            t0 = time.perf_counter()
            history = run_pretraining(cfg, echo=echo, command="run")
            last = history[-1]
            rows.append({"run": name, "loss": cfg.loss.name, "epochs": last["epoch"],
                         "final_loss": last["loss"], "knn_top1": last.get("knn_top1"),
                         "probe_top1": last.get("probe_top1"),
                         "wall_s": time.perf_counter() - t0})
    if echo:
        print("\n" + summary(rows))
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> str:
    probe = any(r.get("probe_top1") is not None for r in rows)  # a column when one has it
    lines = ["| run | loss | epochs | final loss | online kNN top-1 | "
             + ("online probe top-1 | " if probe else "") + "wall s |",
             "|---|---|---:|---:|---:|" + ("---:|" if probe else "") + "---:|"]

    def pct(v: float | None) -> str:
        return "—" if v is None else f"{100 * v:.1f} %"

    for r in rows:
        lines.append(f"| {r['run']} | {r['loss']} | {r['epochs']} | {r['final_loss']:.3f} | "
                     f"{pct(r['knn_top1'])} | "
                     + (f"{pct(r.get('probe_top1'))} | " if probe else "")
                     + f"{r['wall_s']:.0f} |")
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str]) -> int:
    from components.errors import run_command

    def body() -> None:
        plan(config, overrides)  # every config checked before anything runs
        run(config, overrides)

    return run_command("run", body)
