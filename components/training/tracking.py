"""Opt-in experiment trackers (``tracking:`` in a pretrain config, ``mlflow:`` / ``wandb:`` in a
sweep file).

MLflow through its own client API: :class:`MLflowRun` is rank 0's run of one pretraining run
(the flattened config as parameters — never the credentials of a URI in it, see
:func:`components.io.storage.redacted` —, every epoch's metrics at step = epoch, the MLflow run id
kept in the run dir so a resumed run continues the same MLflow run); sweeps use Ray Tune's own
``MLflowLoggerCallback`` (:func:`tune_callbacks`). The default store is SQLite in the run or
sweep dir (MLflow 3 refuses its old file store), readable with ``mlflow ui
--backend-store-uri sqlite:///<dir>/mlflow.db`` or ``mlflow.MlflowClient``.

Weights & Biases the same way: :class:`WandbRun` is rank 0's run (config, every epoch's
metrics against ``epoch``, the run id kept in the run dir so a resume continues it), sweeps
use Ray Tune's ``WandbLoggerCallback``. Offline mode (the default) needs no account or
network: runs are written under ``<run dir>/wandb/`` (a sweep's under each trial dir) and
``wandb sync <dir>`` uploads them later.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, cast

from components.errors import SimgraphError
from components.io.files import write_text

MLFLOW_RUN_ID = "mlflow_run_id"  # in a run dir: the MLflow run a resume continues
MLFLOW_RUN_KEY = "mlflow_run_key"  # written before that run is created: a kill in between
# finds it again by this key (a tag) instead of creating a second one
WANDB_RUN_ID = "wandb_run_id"  # the W&B run id a resume continues

RUN_ID_FILE = MLFLOW_RUN_ID
RUN_KEY_FILE = MLFLOW_RUN_KEY  # ours, written before the MLflow run is created
RUN_KEY_TAG = "simgraph.run_key"
DB_FILE = "mlflow.db"
WANDB_ID_FILE = WANDB_RUN_ID


class TrackingError(SimgraphError, RuntimeError):
    """A tracker was asked for but cannot be used; the message says how to fix it."""


def require_mlflow(what: str) -> None:
    """Raises :class:`TrackingError` (before any work starts) when MLflow is missing."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise TrackingError(f"{what} needs MLflow: pip install mlflow-skinny (or the project's "
                            "'tracking' extra: pip install -e '.[tracking]')") from None


def require_wandb(what: str) -> None:
    """Raises :class:`TrackingError` (before any work starts) when wandb is missing."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise TrackingError(f"{what} needs Weights & Biases: pip install wandb (or the "
                            "project's 'tracking' extra: pip install -e '.[tracking]')") from None


def _wandb_settings() -> Any:
    """No console capture (rank 0's stdout is forwarded by Ray line by line), and wandb's
    banner lines only with ``--verbose``."""
    import wandb

    from components.runtime.console import verbose

    return wandb.Settings(console="off", quiet=not verbose(), silent=not verbose())


def default_uri(local_dir: str | Path) -> str:
    return f"sqlite:///{Path(local_dir).resolve() / DB_FILE}"


def _quiet() -> None:
    from components.runtime.console import verbose

    if not verbose():  # "Updating database tables", "Creating a new experiment", ...
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)


class MLflowRun:
    """Rank 0's MLflow run for the pretraining run in ``local_dir`` (the run dir, or its local
    mirror when the run dir is a URI)."""

    def __init__(self, local_dir: Path, name: str, config: dict[str, Any], *,
                 uri: str | None, experiment: str) -> None:
        _quiet()
        from mlflow import MlflowClient
        from mlflow.entities import Param

        from components.config import flatten
        from components.io.storage import redacted

        self.uri = uri or default_uri(local_dir)
        self.client = MlflowClient(self.uri)
        id_file = local_dir / RUN_ID_FILE
        if id_file.exists():  # a resumed run: the same MLflow run
            self.run_id = id_file.read_text().strip()
            return
        # MLflow names the run only once it exists: a key of ours, written first and set as
        # a tag, finds a run created by a process killed before it wrote its id file.
        key_file = local_dir / RUN_KEY_FILE
        if not key_file.exists():
            write_text(key_file, uuid.uuid4().hex + "\n")
        key = key_file.read_text().strip()
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
            experiment)
        found = self.client.search_runs([exp_id], f"tags.`{RUN_KEY_TAG}` = '{key}'")
        if found:
            self.run_id = found[0].info.run_id
        else:
            self.run_id = self.client.create_run(exp_id, run_name=name,
                                                 tags={RUN_KEY_TAG: key}).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(redacted(config)).items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        write_text(id_file, self.run_id + "\n")

    def log_epoch(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["epoch"])
        metrics = [Metric(k, float(v), now, step) for k, v in row.items()
                   if k != "epoch" and isinstance(v, int | float) and not isinstance(v, bool)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbRun:
    """Rank 0's W&B run for the pretraining run in ``local_dir`` (the run dir, or its local
    mirror when the run dir is a URI): files under ``local_dir/wandb/``."""

    def __init__(self, local_dir: Path, name: str, config: dict[str, Any], *, project: str,
                 mode: str) -> None:
        import wandb

        from components.io.storage import redacted

        # A wandb-core service inherited from a parent process (wandb exports WANDB_SERVICE)
        # is not ours: a killed run's stream stays registered there and its resume would be
        # refused ("run ID ... is in use"). This process starts its own.
        os.environ.pop("WANDB_SERVICE", None)
        id_file = local_dir / WANDB_ID_FILE
        if not id_file.exists():  # chosen here: written before the run starts, atomically
            write_text(id_file, uuid.uuid4().hex[:12] + "\n")
        run_id = id_file.read_text().strip()
        self.run = wandb.init(project=project, name=name, id=run_id, resume="allow",
                              mode=cast(Any, mode), dir=str(local_dir), config=redacted(config),
                              settings=_wandb_settings(), reinit="create_new")
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")
        self.run_id = run_id

    def log_epoch(self, row: dict[str, Any]) -> None:
        self.run.log({k: float(v) for k, v in row.items()
                      if isinstance(v, int | float) and not isinstance(v, bool)})

    def finish(self) -> None:
        """Finish the run and wait until wandb's service has written it out: ``run.finish()``
        returns once the service has the exit record, before its writer has flushed the run
        file (a test read it without its run record, under load), and a Ray worker may be
        killed right after its run ends."""
        import wandb

        self.run.finish()
        wandb.teardown()


def prepare_sweep_trackers(sweep: Any) -> None:
    """What a sweep's trackers need in the driver, for a new sweep and for a resumed one
    (whose callbacks Tune unpickles): the packages, and ``WANDB_MODE=offline`` for an
    offline W&B sweep (Ray's ``WandbLoggerCallback.setup`` asks for an API key otherwise)."""
    if sweep.mlflow:
        require_mlflow("mlflow: true in the sweep file")
    if sweep.wandb:
        require_wandb("wandb: true in the sweep file")
        if sweep.wandb_mode == "offline":
            os.environ["WANDB_MODE"] = "offline"


def tune_callbacks(sweep: Any, sweep_dir: str | Path) -> list[Any]:
    """Ray Tune callbacks for a sweep's trackers (Ray's, logging the trials' parameters
    without URI credentials: :mod:`components.training.tune_trackers`). ``mlflow: true``: MLflow's,
    one MLflow run per trial in experiment ``<sweep name>``; without ``mlflow_uri`` the store
    is SQLite in ``sweep_dir`` (local: the sweep config refuses a URI storage without
    ``mlflow_uri``), created here since Tune has not made the dir yet. ``wandb: true``:
    W&B's, one run per trial in project ``wandb_project``, group ``<sweep name>``; offline (see
    :func:`prepare_sweep_trackers`) its runs are ``<sweep_dir>/wandb/offline-run-*-<trial id>``
    for a local ``sweep_dir``. Not Ray's default, each Tune trial dir: that is Tune's driver
    staging copy, whose last sync to the sweep dir runs before Tune waits for the logging
    actors, so a trial ending with the sweep could leave its W&B run in Ray's session dir
    (seen in CI). With a URI ``sweep_dir`` the runs stay under each trial dir."""
    prepare_sweep_trackers(sweep)
    callbacks: list[Any] = []
    if sweep.mlflow:
        _quiet()
        from components.training.tune_trackers import RedactingMLflowLoggerCallback

        uri = sweep.mlflow_uri
        if uri is None:
            Path(sweep_dir).mkdir(parents=True, exist_ok=True)
            uri = default_uri(sweep_dir)
        callbacks.append(RedactingMLflowLoggerCallback(
            tracking_uri=uri, experiment_name=sweep.name, save_artifact=False))
    if sweep.wandb:
        from components.io.paths import is_uri
        from components.training.tune_trackers import RedactingWandbLoggerCallback

        where: dict[str, Any] = {}
        if not is_uri(sweep_dir):
            Path(sweep_dir).mkdir(parents=True, exist_ok=True)  # wandb.init needs it to exist
            where["dir"] = str(Path(sweep_dir).resolve())
        callbacks.append(RedactingWandbLoggerCallback(
            project=sweep.wandb_project, group=sweep.name, mode=sweep.wandb_mode,
            settings=_wandb_settings(), **where))
    return callbacks


__all__ = ["DB_FILE", "MLflowRun", "RUN_ID_FILE", "TrackingError", "WANDB_ID_FILE", "WandbRun",
           "default_uri", "prepare_sweep_trackers", "require_mlflow", "require_wandb",
           "tune_callbacks"]
