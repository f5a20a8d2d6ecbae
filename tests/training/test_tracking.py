"""components.training.tracking: rank 0's MLflow run (parameters, per-epoch metrics, resume into the
same run), read back with MLflow's own client; the sweep's tracker settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import ConfigError, PretrainConfig, from_dict, to_dict

mlflow = pytest.importorskip("mlflow")


def test_mlflow_run_logs_params_and_epochs_and_a_resume_continues_it(tmp_path: Path) -> None:
    from components.training.tracking import DB_FILE, RUN_ID_FILE, MLflowRun, default_uri

    cfg = from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "/d"},
                                     "loss": {"name": "xclr", "tau": 0.2, "tau_s": 0.1},
                                     "tracking": {"mlflow": True}})
    run = MLflowRun(tmp_path, "r", to_dict(cfg), uri=None, experiment="simgraph")
    for epoch in (1, 2):
        run.log_epoch({"epoch": epoch, "loss": 5.0 - epoch, "knn_top1": 0.1 * epoch,
                       "note": "not a number"})
    # the resumed run
    again = MLflowRun(tmp_path, "r", to_dict(cfg), uri=None, experiment="simgraph")
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

    root = Path(__file__).resolve().parents[2]
    space = root / "search_spaces/small_data/simclr.yaml"
    assert load_sweep(space, ["mlflow=true"]).mlflow is True
    with pytest.raises(ConfigError, match="mlflow: true with storage='s3://b/sweeps' needs "
                                          "mlflow_uri"):
        load_sweep(space, ["mlflow=true", "storage=s3://b/sweeps"])
    sweep = load_sweep(space, ["mlflow=true", "storage=s3://b/sweeps",
                               f"mlflow_uri=sqlite:///{tmp_path}/m.db"])
    from components.training.tracking import tune_callbacks

    (cb,) = tune_callbacks(sweep, tmp_path)
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    assert isinstance(cb, MLflowLoggerCallback)  # Ray's, parameters redacted
    assert tune_callbacks(load_sweep(space), tmp_path) == []
    assert yaml.safe_load(space.read_text()).get("mlflow") is None  # opt-in


def test_wandb_offline_run_logs_config_and_epochs_and_a_resume_continues_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SERVICE", "")  # wandb exports its service: not to later tests
    from components.training.tracking import WANDB_ID_FILE, WandbRun
    from tests.support.wandb_offline import offline_runs

    cfg = from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "/d"},
                                     "loss": {"name": "xclr", "tau": 0.2, "tau_s": 0.1},
                                     "tracking": {"wandb": True}})
    run = WandbRun(tmp_path, "r", to_dict(cfg), project="simgraph", mode="offline")
    for epoch in (1, 2):
        run.log_epoch({"epoch": epoch, "loss": 5.0 - epoch, "knn_top1": 0.1 * epoch,
                       "note": "not a number"})
    run.finish()
    # the resumed run
    again = WandbRun(tmp_path, "r", to_dict(cfg), project="simgraph", mode="offline")
    assert again.run_id == run.run_id and (tmp_path / WANDB_ID_FILE).exists()
    again.log_epoch({"epoch": 3, "loss": 1.5, "knn_top1": 0.35})
    again.finish()

    first, second = offline_runs(tmp_path)  # one offline-run dir per process, same run id
    assert first.run_id == second.run_id == run.run_id
    assert (first.name, first.project) == ("r", "simgraph")
    assert first.config["loss"] == to_dict(cfg)["loss"]
    assert first.config["loss"]["tau_s"] == 0.1
    rows = [r for r in first.history + second.history if "knn_top1" in r]
    assert [(r["epoch"], round(r["knn_top1"], 6)) for r in rows] == [(1, 0.1), (2, 0.2),
                                                                     (3, 0.35)]
    assert all("note" not in r for r in rows)


def test_sweep_wandb_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    from components.search_space import load_sweep
    from components.training.tracking import tune_callbacks

    root = Path(__file__).resolve().parents[2]
    space = root / "search_spaces/small_data/simclr.yaml"
    with pytest.raises(ConfigError, match="wandb_mode='cloud' is not allowed: choose one of "
                                          "offline, online"):
        load_sweep(space, ["wandb=true", "wandb_mode=cloud"])
    with pytest.raises(ConfigError, match="tracking.wandb_mode='x' is not allowed"):
        from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "/d"},
                                   "tracking": {"wandb": True, "wandb_mode": "x"}})
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (cb,) = tune_callbacks(load_sweep(space, ["wandb=true", "wandb_project=p"]), tmp_path)
    from ray.air.integrations.wandb import WandbLoggerCallback

    assert isinstance(cb, WandbLoggerCallback)  # Ray's, config redacted
    assert (cb.project, cb.group, cb.kwargs["mode"]) == ("p", "small-simclr", "offline")
    # offline runs straight into the sweep dir, not Tune's staging copy of each trial dir
    assert cb.kwargs["dir"] == str(tmp_path.resolve())
    (cb,) = tune_callbacks(load_sweep(space, ["wandb=true"]), "s3://bucket/sweeps/s")
    assert "dir" not in cb.kwargs
    import os

    assert os.environ["WANDB_MODE"] == "offline"
    cb.setup()  # Ray's callback: no API key asked for offline


def test_a_kill_before_the_run_id_is_written_continues_the_same_tracker_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow: the run exists but its id file was never written (killed after create_run):
    the next start finds it by our key, and there is one run. W&B: the id is chosen and
    written before the run starts."""
    from components.training.tracking import (
        RUN_ID_FILE,
        WANDB_ID_FILE,
        MLflowRun,
        WandbRun,
        default_uri,
    )

    cfg = to_dict(from_dict(PretrainConfig, {"name": "r", "data": {"dataset": "/d"}}))
    first = MLflowRun(tmp_path, "r", cfg, uri=None, experiment="simgraph")
    (tmp_path / RUN_ID_FILE).unlink()
    again = MLflowRun(tmp_path, "r", cfg, uri=None, experiment="simgraph")
    assert again.run_id == first.run_id
    client = mlflow.MlflowClient(default_uri(tmp_path))
    assert len(client.search_runs([client.get_experiment_by_name("simgraph").experiment_id])) == 1

    wandb = pytest.importorskip("wandb")

    def killed(**kwargs: object) -> None:
        raise KeyboardInterrupt  # the process dies inside wandb.init

    monkeypatch.setattr(wandb, "init", killed)
    with pytest.raises(KeyboardInterrupt):
        WandbRun(tmp_path, "r", cfg, project="simgraph", mode="offline")
    chosen = (tmp_path / WANDB_ID_FILE).read_text().strip()
    seen: dict[str, object] = {}
    monkeypatch.setattr(wandb, "init", lambda **kw: seen.update(kw) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        WandbRun(tmp_path, "r", cfg, project="simgraph", mode="offline")
    assert seen["id"] == chosen and seen["resume"] == "allow"
