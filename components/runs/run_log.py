"""Rank 0's per-epoch record of a run (:class:`RunLog`): ``metrics.csv``, TensorBoard events
under ``tb/`` and the configured trackers (MLflow, W&B), written locally and published to a URI
run dir after every epoch."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from components.config import PretrainConfig, to_dict
from components.io.files import atomic_open
from components.runs.run_dir import METRICS_CSV


def read_history(run_dir: str | Path) -> list[dict[str, float | None]] | None:
    """A local run dir's ``metrics.csv`` as rows (numbers as floats, an empty cell None): the
    run's whole per-epoch history, as :class:`RunLog` rewrites it from the checkpointed
    history every epoch (a resumed run's earlier epochs too); ``None`` when there is none."""
    path = Path(run_dir) / METRICS_CSV
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return None

    def number(v: str | None) -> float | None:
        try:
            return float(v) if v not in (None, "") else None
        except ValueError:
            return None

    return [{k: number(v) for k, v in row.items() if k is not None} for row in rows] or None


class RunLog:
    """Rank 0's ``metrics.csv`` (rewritten from the history, so a resumed run never keeps rows
    of epochs it redid) and TensorBoard events (purged from the resume epoch on), written
    locally and published to a URI run dir after every epoch (:class:`LocalMirror`)."""

    def __init__(self, run_dir: str, start_epoch: int, cfg: PretrainConfig) -> None:
        from tensorboardX import SummaryWriter

        from components.io.storage import LocalMirror

        self.mirror = LocalMirror(run_dir)
        self.tb = SummaryWriter(str(self.mirror.local / "tb"), purge_step=start_epoch + 1)
        self.mlflow = None
        t = cfg.tracking
        if t.mlflow:
            from components.training.tracking import MLflowRun

            self.mlflow = MLflowRun(self.mirror.local, cfg.name, to_dict(cfg), uri=t.mlflow_uri,
                                    experiment=t.mlflow_experiment)
        self.wandb = None
        if t.wandb:
            from components.training.tracking import WandbRun

            self.wandb = WandbRun(self.mirror.local, cfg.name, to_dict(cfg),
                                  project=t.wandb_project, mode=t.wandb_mode)

    def write(self, history: list[dict[str, Any]]) -> None:
        keys: list[str] = []
        for row in history:
            keys += [k for k in row if k not in keys]
        with atomic_open(self.mirror.local / METRICS_CSV, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(history)
        row = history[-1]
        for k, v in row.items():
            if k != "epoch" and isinstance(v, int | float):
                self.tb.add_scalar(k, v, row["epoch"])
        self.tb.flush()
        if self.mlflow is not None:
            self.mlflow.log_epoch(row)
        if self.wandb is not None:
            self.wandb.log_epoch(row)
        self.mirror.sync()

    def close(self) -> None:
        """After the last epoch (the recipe's cleanup; a failed run never gets here, so its
        MLflow run stays RUNNING until a resume finishes it)."""
        if self.mlflow is not None:
            self.mlflow.finish()
        if self.wandb is not None:
            self.wandb.finish()
        self.tb.close()
        self.mirror.close()
