"""components.tracking: rank 0's MLflow run (parameters, per-epoch metrics, resume into the
same run), read back with MLflow's own client; the sweep's tracker settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import ConfigError, PretrainConfig, from_dict, to_dict

mlflow = pytest.importorskip("mlflow")


def test_mlflow_run_logs_params_and_epochs_and_a_resume_continues_it(tmp_path: Path) -> None:
    from components.tracking import DB_FILE, RUN_ID_FILE, MLflowRun, default_uri

    cfg = from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "/d"},
                                     "loss": {"name": "xclr", "tau": 0.2, "tau_s": 0.1},
                                     "tracking": {"mlflow": True}})
    run = MLflowRun(tmp_path, "r", to_dict(cfg), None, "simgraph")
    for epoch in (1, 2):
        run.log_epoch({"epoch": epoch, "loss": 5.0 - epoch, "knn_top1": 0.1 * epoch,
                       "note": "not a number"})
    again = MLflowRun(tmp_path, "r", to_dict(cfg), None, "simgraph")  # the resumed run
    assert again.run_id == run.run_id and (tmp_path / RUN_ID_FILE).exists()
    again.log_epoch({"epoch": 3, "loss": 1.5, "knn_top1": 0.35})
    again.finish()

    client = mlflow.MlflowClient(default_uri(tmp_path))
    assert (tmp_path / DB_FILE).exists()
    exp = client.get_experiment_by_name("simgraph")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "r" and runs[0].info.status == "FINISHED"
    params = runs[0].data.params
    assert params["loss.tau_s"] == "0.1" and params["loss.name"] == "xclr"
    assert params["tracking.mlflow"] == "True"
    history = client.get_metric_history(run.run_id, "knn_top1")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.35)]
    assert "note" not in runs[0].data.metrics


def test_sweep_mlflow_settings(tmp_path: Path) -> None:
    import yaml

    from components.search_space import load_sweep

    root = Path(__file__).resolve().parents[1]
    space = root / "search_spaces/small_data/simclr.yaml"
    assert load_sweep(space, ["mlflow=true"]).mlflow is True
    with pytest.raises(ConfigError, match="mlflow: true with storage='s3://b/sweeps' needs "
                                          "mlflow_uri"):
        load_sweep(space, ["mlflow=true", "storage=s3://b/sweeps"])
    sweep = load_sweep(space, ["mlflow=true", "storage=s3://b/sweeps",
                               f"mlflow_uri=sqlite:///{tmp_path}/m.db"])
    from components.tracking import tune_callbacks

    (cb,) = tune_callbacks(sweep, tmp_path)
    assert type(cb).__name__ == "MLflowLoggerCallback"
    assert tune_callbacks(load_sweep(space), tmp_path) == []
    assert yaml.safe_load(space.read_text()).get("mlflow") is None  # opt-in
