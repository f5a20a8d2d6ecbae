"""Opt-in experiment trackers (``tracking:`` in a pretrain config, ``mlflow:`` in a sweep file).

MLflow through its own client API: :class:`MLflowRun` is rank 0's run of one pretraining run
(the flattened config as parameters, every epoch's metrics at step = epoch, the MLflow run id
kept in the run dir so a resumed run continues the same MLflow run); sweeps use Ray Tune's own
``MLflowLoggerCallback`` (:func:`tune_callbacks`). The default store is SQLite in the run or
sweep dir (MLflow 3 refuses its old file store), readable with ``mlflow ui
--backend-store-uri sqlite:///<dir>/mlflow.db`` or ``mlflow.MlflowClient``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from components.errors import SimgraphError

RUN_ID_FILE = "mlflow_run_id"
DB_FILE = "mlflow.db"


class TrackingError(SimgraphError, RuntimeError):
    """A tracker was asked for but cannot be used; the message says how to fix it."""


def require_mlflow(what: str) -> None:
    """Raises :class:`TrackingError` (before any work starts) when MLflow is missing."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise TrackingError(f"{what} needs MLflow: pip install mlflow-skinny (or the project's "
                            "'tracking' extra: pip install -e '.[tracking]')") from None


def default_uri(local_dir: str | Path) -> str:
    return f"sqlite:///{Path(local_dir).resolve() / DB_FILE}"


def _quiet() -> None:
    from components.console import verbose

    if not verbose():  # "Updating database tables", "Creating a new experiment", ...
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)


class MLflowRun:
    """Rank 0's MLflow run for the pretraining run in ``local_dir`` (the run dir, or its local
    mirror when the run dir is a URI)."""

    def __init__(self, local_dir: Path, name: str, config: dict[str, Any],
                 uri: str | None, experiment: str) -> None:
        _quiet()
        from mlflow import MlflowClient
        from mlflow.entities import Param

        from components.config import flatten

        self.uri = uri or default_uri(local_dir)
        self.client = MlflowClient(self.uri)
        id_file = local_dir / RUN_ID_FILE
        if id_file.exists():  # a resumed run: the same MLflow run
            self.run_id = id_file.read_text().strip()
            return
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
            experiment)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(config).items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        id_file.write_text(self.run_id + "\n")

    def log_epoch(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["epoch"])
        metrics = [Metric(k, float(v), now, step) for k, v in row.items()
                   if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


def tune_callbacks(sweep: Any, sweep_dir: str | Path) -> list[Any]:
    """Ray Tune callbacks for a sweep's trackers: MLflow's, one MLflow run per trial in
    experiment ``<sweep name>``, when the sweep file says ``mlflow: true``. Without
    ``mlflow_uri`` the store is SQLite in ``sweep_dir`` (local: the sweep config refuses a URI
    storage without ``mlflow_uri``), created here since Tune has not made the dir yet."""
    if not sweep.mlflow:
        return []
    require_mlflow("mlflow: true in the sweep file")
    _quiet()
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    uri = sweep.mlflow_uri
    if uri is None:
        Path(sweep_dir).mkdir(parents=True, exist_ok=True)
        uri = default_uri(sweep_dir)
    return [MLflowLoggerCallback(tracking_uri=uri, experiment_name=sweep.name,
                                 save_artifact=False)]


__all__ = ["DB_FILE", "MLflowRun", "RUN_ID_FILE", "TrackingError", "default_uri",
           "require_mlflow", "tune_callbacks"]
