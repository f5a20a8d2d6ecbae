"""``simgraph sweep``: a 4-trial sweep on tiny data, killed after 2 trials and resumed without
re-running them, then confirmed; a repeats sweep in S3; results, best config and the Optuna
study; failed trials stay failed."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from ray.train import WorkerGroupError

from components.config import ConfigError, PretrainConfig, load_config
from components.search_space import load_sweep
from components.sweep.results import markdown, trial_rows
from components.training.step import NonFiniteLossError
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.helpers import tensorboard_events
from tests.support.procs import kill_session, session_pids

ROOT = Path(__file__).resolve().parents[2]


def _space(tmp: Path) -> Path:
    synthetic_dataset(tmp / "ds")
    # relative dataset and storage paths: they must mean the driver's working directory (tmp),
    # not the directory Tune runs each trial in
    base = tiny_run_config(Path("ds"), Path("unused"), name="base", train__epochs=2,
                           scaling={"num_workers": 1, "cpus_per_worker": 1.0},
                           loss={"name": "simclr", "tau": 0.2})
    (tmp / "base.yaml").write_text(yaml.safe_dump(base))
    space = {
        "name": "s", "storage": "sweeps", "base": str(tmp / "base.yaml"),
        "metric": "knn_top1", "mode": "max", "num_samples": 4, "max_concurrent": 1,
        "resources": {"workers": 1, "cpus_per_worker": 1.0, "gpus_per_worker": 0.0},
        "searcher": {"name": "random", "seed": 0},
        "scheduler": {"name": "fifo"},
        "study_storage": f"sqlite:///{tmp / 'study.db'}",
        "mlflow": True,  # Ray Tune's MLflowLoggerCallback, into sweeps/s/mlflow.db
        "wandb": True,  # Ray Tune's WandbLoggerCallback, offline, under each trial dir
        "space": {"loss.name": {"choice": ["simclr", "xclr"]},
                  "optim.lr": {"loguniform": [0.01, 0.5]}},
        "conditional": {"loss.name": {"xclr": {"loss.tau_s": {"loguniform": [0.05, 1.0]}}}},
    }
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def _done(trials: Path) -> list[Path]:
    return [d for d in trials.glob("*") if (d / "epoch_00002" / "meta.json").exists()]


@pytest.mark.slow
def test_sweep_killed_after_two_trials_resumes_the_rest_and_confirms(tmp_path: Path) -> None:
    """Killed after two trials; an edit before --resume is refused; --resume runs the rest and
    then ``confirm: {top: 2, seeds: 2}``: the two best settings retrained with fresh seeds,
    scored on the test split; confirm.md / .csv, trials.md and best.yaml say the confirmed
    best. Then ``--confirm`` on the finished sweep resumes: the finished runs are not trained
    again. Results reach trials.csv, Optuna's study, MLflow, TensorBoard and W&B."""
    import json

    space = _space(tmp_path)
    synthetic_dataset(tmp_path / "ds", test_per_class=6)  # the same images + a test split
    spec = yaml.safe_load(space.read_text())
    spec["confirm"] = {"top": 2, "seeds": 2}
    space.write_text(yaml.safe_dump(spec))
    log = open(tmp_path / "sweep.log", "a")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "sweep", str(space)],
                            cwd=tmp_path, start_new_session=True, stdout=log,
                            stderr=subprocess.STDOUT)
    trials = tmp_path / "sweeps" / "s" / "trials"
    deadline = time.time() + 400
    try:
        while len(_done(trials)) < 2:
            assert proc.poll() is None, (tmp_path / "sweep.log").read_text()[-4000:]
            assert time.time() < deadline, (tmp_path / "sweep.log").read_text()[-4000:]
            time.sleep(0.2)
    finally:
        kill_session(proc.pid)
    assert not session_pids(proc.pid)
    first = {d.name: (d / "workers" / "rank0.json").read_text() for d in _done(trials)}
    assert len(first) in (2, 3)

    # An edit between the kill and the resume is refused before anything runs: Tune would
    # restore the old searcher's trials and build new ones from the edited files.
    base_text = (tmp_path / "base.yaml").read_text()
    edited = yaml.safe_load(base_text)
    edited["train"]["epochs"] = 3
    (tmp_path / "base.yaml").write_text("# edited\n" + yaml.safe_dump(edited))
    before = sorted(p.name for p in (tmp_path / "sweeps" / "s").rglob("*"))
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "sweep", str(space), "--resume"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.strip().endswith(
        f"--resume: base config {tmp_path / 'base.yaml'}: train.epochs changed since sweep 's' "
        "started; resuming would mix two experiments. Restore those files (and overrides), or "
        "start a new sweep with name=<another name>"), out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sweeps" / "s").rglob("*")) == before
    (tmp_path / "base.yaml").write_text("# comments and layout do not count\n" + base_text)

    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "sweep", str(space), "--resume"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with open(tmp_path / "sweeps" / "s" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"finished"}
    assert {int(r["epochs"]) for r in rows} == {2}
    assert len({r["trial"] for r in rows}) == 4
    # the finished trials were not re-run: their workers never started again
    for name, info in first.items():
        assert (trials / name / "workers" / "rank0.json").read_text() == info
    for r in rows:  # conditional parameter only where the loss has it
        assert (r["loss.tau_s"] != "") == (r["loss.name"] == "xclr")
    sweep_dir = tmp_path / "sweeps" / "s"
    confirmed = json.loads((sweep_dir / "confirm.json").read_text())
    assert [r["confirmed_rank"] for r in confirmed] == [1, 2]
    assert sorted(r["sweep_rank"] for r in confirmed) == [1, 2]
    assert all(r["split"] == "test" and len(r["seed_scores"]) == 2 for r in confirmed)
    reruns = sorted(p.name for p in (sweep_dir / "confirm").iterdir()
                  if p.is_dir())  # beside each: its run dir's lock, .<run>.lock
    assert reruns == ["rank01-seed0", "rank01-seed1", "rank02-seed0", "rank02-seed1"]
    seeds = {load_config(sweep_dir / "confirm" / r / "config.yaml", PretrainConfig).train.seed
             for r in reruns}
    assert seeds == {1000, 1001}  # fresh: the sweep's trials used seed 0
    top = confirmed[0]
    header, *_ = (sweep_dir / "best.yaml").read_text().splitlines()
    assert header.startswith(f"# confirmed best of sweep s (sweep rank {top['sweep_rank']}): "
                             f"test kNN top-1 {100 * top['score']:.1f} % [")
    best = load_config(sweep_dir / "best.yaml", PretrainConfig)
    assert best.name == "s-best" and best.loss.name == top["params"]["loss.name"]
    assert best.optim.lr == pytest.approx(top["params"]["optim.lr"])
    assert "## Confirmation" in (sweep_dir / "trials.md").read_text()
    assert f"confirmed best (sweep rank {top['sweep_rank']}): test kNN top-1" in out.stdout
    import optuna

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(study.trials) == 4
    assert (tmp_path / "sweeps" / "s" / "knn_top1_vs_optim.lr.png").exists()
    assert (tmp_path / "sweeps" / "s" / "learning_curves.png").exists()
    assert "best trial " in out.stdout and "best.yaml" in out.stdout
    # MLflow: every trial a run of experiment "s", with its per-epoch kNN
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'sweeps' / 's' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    by_name = {r.info.run_name: r for r in runs if r.info.status == "FINISHED"}
    # every trial of the result finished its MLflow run with its kNN (a trial the driver
    # started after Tune's last snapshot before the kill may have left a run of its own)
    for r in rows:
        run = by_name.get(f"trial_fn_{r['trial']}")
        assert run is not None, (r["trial"], sorted(by_name))
        assert "knn_top1" in run.data.metrics
    # TensorBoard (components/sweep/tune_loggers.py): each trial's Tune dir holds its reported kNN
    for r in rows:
        (tune_dir,) = (tmp_path / "sweeps" / "s").glob(f"trial_fn_{r['trial']}_*")
        knn = [v for tag, _, v in tensorboard_events(tune_dir) if tag == "ray/tune/knn_top1"]
        assert knn and knn[-1] == pytest.approx(float(r["knn_top1"]), abs=1e-5), (r, knn)
    # W&B (offline): every trial of the result has an offline run (dir named by its trial id),
    # the runs hold the trials' kNN per epoch, and a run's last kNN is its trial's final one.
    # Not more: a logger killed with the driver loses unflushed records, and after --resume
    # Ray's WandbLoggerCallback may not log a trial that was in flight at the kill again.
    from tests.support.wandb_offline import offline_runs

    wb_dirs = list((tmp_path / "sweeps" / "s").glob("**/wandb/offline-run-*"))
    for r in rows:
        assert any(d.name.endswith(f"-{r['trial']}") for d in wb_dirs), (r["trial"], wb_dirs)
    wb = offline_runs(tmp_path / "sweeps" / "s")
    final = {f"trial_fn_{r['trial']}": float(r["knn_top1"]) for r in rows}
    complete = 0
    for w in wb:
        knn = [h["knn_top1"] for h in w.history if "knn_top1" in h]
        if knn and w.history[-1].get("epoch") == 2:
            assert w.name not in final or knn[-1] == pytest.approx(final[w.name]), (w.name, knn)
        complete += len(knn) == 2
    assert complete >= 1, [(w.name, len(w.history)) for w in wb]

    stamps = {r: (sweep_dir / "confirm" / r / "epoch_00002" / "state.pt").stat().st_mtime_ns
              for r in reruns}
    again = subprocess.run([sys.executable, "-m", "pipelines.cli", "sweep", str(space),
                            "--confirm"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads((sweep_dir / "confirm.json").read_text()) == confirmed
    assert stamps == {r: (sweep_dir / "confirm" / r / "epoch_00002" / "state.pt")
                      .stat().st_mtime_ns for r in reruns}


def test_failed_trials_are_reported_failed_never_with_a_value(tmp_path: Path) -> None:
    sweep = load_sweep(_space(tmp_path))
    good = SimpleNamespace(config={"loss.name": "simclr", "optim.lr": 0.1}, error=None,
                           metrics={"trial_id": "a"}, path="x/a",
                           metrics_dataframe=_df([0.5, 0.7]))
    bad = SimpleNamespace(config={"loss.name": "xclr", "optim.lr": 0.3, "loss.tau_s": 0.1},
                          error=WorkerGroupError("rank 0 failed", {0: NonFiniteLossError(
                              "epoch 1 step 3: the loss is nan")}),
                          metrics={"trial_id": "b"}, path="x/b", metrics_dataframe=_df([0.9]))
    rows = trial_rows([bad, good], sweep)
    assert [r["trial"] for r in rows] == ["a", "b"]
    assert rows[0]["best_knn_top1"] == 0.7 and rows[0]["status"] == "finished"
    assert rows[0]["score"] == pytest.approx(0.6)  # mean of the last 3 (here 2) evaluations
    assert rows[1]["status"] == "failed" and rows[1]["best_knn_top1"] is None
    assert rows[1]["knn_top1"] is None and "NonFiniteLossError" in rows[1]["error"]
    table = markdown(rows, sweep)
    assert "| b | failed (NonFiniteLossError: epoch 1 step 3: the loss is nan)" in table
    assert "0.9" not in table


def test_results_files_and_plots_of_a_small_sweep(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """trials.csv / .md, best.yaml and every plot from trial results (no Ray): the metric
    against each parameter with a readable log axis, learning curves of all trials, Optuna's
    history / slice / contour views. No importances: 5 settings cannot rank 3 parameters
    (importance_support wants max(4, 2 × 3) = 6; fANOVA's forest on 5 points ranks where they
    happen to lie) — test_importances_only_where_the_data_supports_them has the written case."""
    from components.sweep.results import _write_results

    sweep = load_sweep(_space(tmp_path))
    results = []
    for i, (loss, lr, tau_s) in enumerate([("simclr", 0.02, None), ("xclr", 0.3, 0.1),
                                           ("simclr", 0.1, None), ("xclr", 0.05, 0.5),
                                           ("xclr", 0.2, 0.2)]):
        config = {"loss.name": loss, "optim.lr": lr, **({"loss.tau_s": tau_s} if tau_s else {})}
        curve = [0.3 + 0.1 * i * e / 3 for e in (1, 2, 3)]
        results.append(SimpleNamespace(config=config, error=None, metrics={"trial_id": f"t{i}"},
                                       path=f"x/t{i}", metrics_dataframe=_df(curve)))
    rows = trial_rows(results, sweep)
    assert rows[0]["trial"] == "t4" and rows[0]["curve"] == [(1, pytest.approx(0.3 + 0.4 / 3)),
                                                             (2, pytest.approx(0.3 + 0.8 / 3)),
                                                             (3, pytest.approx(0.7))]
    out = tmp_path / "out"
    out.mkdir()
    _write_results(sweep, rows, out)
    pngs = {p.name for p in out.glob("*.png")}
    assert {"knn_top1_vs_optim.lr.png", "knn_top1_vs_loss.tau_s.png", "best_per_loss.png",
            "learning_curves.png", "optuna_history.png", "optuna_slice.png",
            "optuna_contour.png"} <= pngs, pngs
    # importances skipped, saying why in one line
    assert "optuna_importances.png" not in pngs and not (out / "param_importances.yaml").exists()
    assert ("simgraph sweep: no parameter importances (param_importances.yaml, "
            "optuna_importances.png): 5 finished settings for 3 swept parameters: importances "
            "need at least 6 (max(4, 2 × parameters))\n") in capsys.readouterr().err
    assert ("# best trial of sweep s (trial t4): mean of the last 3 knn_top1 evaluations = "
            "0.5667" in (out / "best.yaml").read_text())
    csv_rows = list(csv.DictReader((out / "trials.csv").read_text().splitlines()))
    assert float(csv_rows[0]["score"]) == pytest.approx(0.3 + 0.4 * 6 / 9)
    assert float(csv_rows[0]["best_knn_top1"]) == pytest.approx(0.7)
    # one seed per setting: each point's bar is its curve's spread, sd of the last 3 / √3
    # (t0's curve is flat: 0; t2's rises by 0.2/3 an epoch: sd 0.2/3)
    from components.sweep.plots import setting_points

    assert setting_points(rows, sweep, "optim.lr")[:2] == [
        (0.02, pytest.approx(0.3), pytest.approx(0.0), "simclr"),
        (0.1, pytest.approx(0.3 + 0.4 / 3), pytest.approx(0.2 / 3 / 3 ** 0.5), "simclr")]
    # A log axis with labels that do not collide: no minor-tick labels.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from components.sweep.plots import _log_axis

    fig, ax = plt.subplots()
    ax.scatter([0.05, 0.1, 0.3, 0.5], [1, 2, 3, 4])
    _log_axis(ax)
    fig.canvas.draw()
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    major = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert 2 <= len(major) <= 6, major
    plt.close(fig)


def _df(values: list[float]) -> Any:
    import pandas as pd

    return pd.DataFrame({"knn_top1": values, "epoch": list(range(1, len(values) + 1))})


def test_every_shipped_search_space_validates() -> None:
    for path in sorted((ROOT / "search_spaces").rglob("*.yaml")):
        sweep = load_sweep(path)
        assert sweep.num_samples >= 1, path


def test_study_export_never_replaces_a_study_it_did_not_write(tmp_path: Path) -> None:
    import optuna

    from components.search_space import load_sweep
    from components.sweep.layout import SweepError
    from components.sweep.study import check_study_storage, export_study, study_owner

    sweep = load_sweep(_space(tmp_path))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    rows = [{"trial": "t1", "params": {"loss.name": "simclr", "optim.lr": 0.1},
             "best_knn_top1": 0.5, "score": 0.5, "setting_mean": 0.5}]
    check_study_storage(sweep)  # nothing there yet
    export_study(sweep, rows)
    export_study(sweep, rows)  # its own study: written again, not doubled
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1
    check_study_storage(sweep)

    optuna.delete_study(study_name="s", storage=url)
    hand = optuna.create_study(study_name="s", storage=url)
    hand.enqueue_trial({"x": 1})
    with pytest.raises(SweepError, match=r"already holds a study named 's' written by someone "
                                         r"else \(not a simgraph sweep\); exporting this sweep "
                                         r"would replace it"):
        check_study_storage(sweep)
    with pytest.raises(SweepError, match="not replaced"):
        export_study(sweep, rows)
    assert study_owner(optuna.storages.RDBStorage(url), "s") == ""
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 1  # the hand-made one


@pytest.mark.parametrize(("name", "now"), [("trial_fn", "components.sweep.tuner"),
                                           ("confirm_fn", "components.sweep.confirm_runs")])
def test_a_pickle_naming_pipelines_sweep_loads_in_a_fresh_interpreter(name: str,
                                                                      now: str) -> None:
    """A sweep dir from before the engine moved to ``components/sweep/`` holds Tune state
    that names ``pipelines.sweep.trial_fn``; a ``--resume`` unpickles it in a new process."""
    import importlib
    import pickle

    fn = getattr(importlib.import_module(now), name)
    data = pickle.dumps(fn, protocol=0)  # protocol 0: module and name as text lines
    assert f"c{now}\n{name}\n".encode() in data
    old = data.replace(f"c{now}\n".encode(), b"cpipelines.sweep\n")
    code = f"import pickle; f = pickle.loads({old!r}); print(f.__module__, f.__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [now, name]


def test_each_statistic_on_a_hand_made_history() -> None:
    from components.search_space import Statistic, score_history

    noisy = [0.30, 0.52, 0.41, 0.47, 0.44]
    assert Statistic("last").score(noisy, "max") == 0.44
    assert Statistic("best").score(noisy, "max") == 0.52
    assert Statistic("best").score(noisy, "min") == 0.30
    assert Statistic("mean_last", 3).score(noisy, "max") == pytest.approx((0.41 + 0.47 + 0.44) / 3)
    assert Statistic("mean_last", 10).score(noisy, "max") == pytest.approx(sum(noisy) / 5)
    assert Statistic().score([float("nan"), 0.5], "max") == 0.5
    assert Statistic().score([], "max") is None
    # per epoch, from the rows that hold the metric (kNN every 2 epochs here)
    rows = [{"epoch": 1}, {"epoch": 2, "knn_top1": 0.4}, {"epoch": 3},
            {"epoch": 4, "knn_top1": 0.6}]
    spec = {"metric": "knn_top1", "mode": "max", "name": "mean_last", "k": 3}
    assert score_history(rows, spec) == [None, 0.4, 0.4, pytest.approx(0.5)]
    with pytest.raises(ConfigError, match=r"statistic.name='max' is not allowed: choose one of "
                                          r"mean_last, last, best"):
        Statistic("max")  # type: ignore[arg-type]


def test_sweep_start_notes_say_how_trials_are_scored_and_warn_about_a_small_val_split(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.search_space import load_sweep
    from components.sweep.driver import start_notes

    monkeypatch.chdir(tmp_path)  # the base config's relative dataset path, as a user runs it

    notes = start_notes(load_sweep(_space(tmp_path)))
    assert notes[0].startswith("[simgraph] trials are scored by the mean of the last 3 "
                               "knn_top1 evaluations (statistic: mean_last, k: 3)")
    assert notes[0].endswith("; set statistic.name=best to score them by the best epoch's "
                             "value instead")
    assert "2026" not in notes[0]  # what is true now, not the change history
    assert notes[1] == (
        "[simgraph] warning: the kNN is scored on 32 val images: one image is 3.1 points and an "
        "accuracy near 50 % has a standard error of ±8.8 points, so trials closer than ~18 "
        "points cannot be told apart; a larger split (preprocess split.val) or statistic.k > 1 "
        "helps")
    best = load_sweep(_space(tmp_path), ["statistic.name=best"])
    assert start_notes(best)[0].endswith("the best epoch's knn_top1 (statistic: best)")


def test_a_probe_top1_sweep_warns_about_its_split_and_has_error_bars_as_the_knn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``metric: probe_top1``: the small-split warning names the probe's split, and one
    seed's error bar is its curve's spread (an accuracy on a held-out split, as
    ``knn_top1``)."""
    from components.search_space import load_sweep
    from components.sweep.driver import start_notes
    from components.sweep.plots import setting_se

    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(_space(tmp_path), ["metric=probe_top1",
                                          "overrides=[probe.every_epochs=1]"])
    assert start_notes(sweep)[1].startswith(
        "[simgraph] warning: the online linear probe is scored on 32 val images: one image is "
        "3.1 points")
    row = {"params": {"optim.lr": 0.1}, "score": 0.5, "setting_mean": 0.5, "setting_sd": None,
           "setting_n": 1, "curve": [(1, 0.40), (2, 0.50), (3, 0.45), (4, 0.55)]}
    assert setting_se([row], sweep) == (pytest.approx(0.05 / 3 ** 0.5), "curve")


def test_repeats_train_each_setting_with_seeds_and_rank_settings_by_their_mean(
        tmp_path: Path) -> None:
    """``repeats: 2``: each suggestion trains with train.seed + 0 and + 1 (Tune's Repeater
    index); tables, best.yaml and the exported study use each setting's mean."""
    import optuna

    from components.search_space import REPEAT_INDEX, load_sweep, trial_config
    from components.sweep.results import _write_results
    from components.sweep.study import export_study

    space = _space(tmp_path)
    with pytest.raises(ConfigError, match=r"repeats=2 with scheduler.name='asha' is not "
                                          r"allowed: .*use scheduler: \{name: fifo\}"):
        load_sweep(space, ["repeats=2", "scheduler.name=asha"])
    sweep = load_sweep(space, ["repeats=2"])
    setting = {"loss.name": "simclr", "optim.lr": 0.1}
    seeds = [trial_config(sweep, {**setting, REPEAT_INDEX: i}, name="t", storage="/s").train.seed
             for i in (0, 1)]
    assert seeds[1] == seeds[0] + 1
    results = []
    for i, (lr, index, last) in enumerate([(0.1, 0, 0.60), (0.1, 1, 0.50), (0.3, 0, 0.58),
                                           (0.3, 1, 0.56)]):
        config = {"loss.name": "simclr", "optim.lr": lr, REPEAT_INDEX: index}
        results.append(SimpleNamespace(config=config, error=None,
                                       metrics={"trial_id": f"t{i}"}, path=f"x/t{i}",
                                       metrics_dataframe=_df([last])))
    rows = trial_rows(results, sweep)
    # lr 0.3 wins on its mean (0.57 > 0.55), although lr 0.1 has the single best trial
    assert [(r["trial"], r["repeat"]) for r in rows] == [("t2", 0), ("t3", 1), ("t0", 0),
                                                         ("t1", 1)]
    assert rows[0]["setting_mean"] == pytest.approx(0.57) and rows[0]["setting_n"] == 2
    assert rows[2]["setting_sd"] == pytest.approx(0.0707, abs=1e-4)
    assert all(REPEAT_INDEX not in r["params"] for r in rows)
    table = markdown(rows, sweep)
    assert "| setting: mean ± sd (n) | seed + |" in table and "0.57 ± 0.014 (n=2)" in table
    out = tmp_path / "out"
    out.mkdir()
    _write_results(sweep, rows, out)
    best = (out / "best.yaml").read_text()
    assert best.startswith("# best setting of sweep s (trial t2): mean of the last 3 knn_top1 "
                           "evaluations = 0.57 ± 0.014 (n=2)")
    assert load_config(out / "best.yaml", PretrainConfig).optim.lr == 0.3
    export_study(sweep, rows)
    study = optuna.load_study(study_name="s", storage=sweep.study_storage)
    assert sorted(t.value for t in study.trials) == pytest.approx([0.55, 0.57])


def _repeat_rows(tmp_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    """Two settings × 2 seeds: lr 0.1 scores 0.60, 0.50 (mean 0.55, sd 0.0707, standard error
    0.05); lr 0.3 scores 0.58, 0.56 (mean 0.57, sd 0.01414, standard error 0.01)."""
    from components.search_space import REPEAT_INDEX

    sweep = load_sweep(_space(tmp_path), ["repeats=2"])
    results = []
    for i, (lr, index, last) in enumerate([(0.1, 0, 0.60), (0.1, 1, 0.50), (0.3, 0, 0.58),
                                           (0.3, 1, 0.56)]):
        config = {"loss.name": "simclr", "optim.lr": lr, REPEAT_INDEX: index}
        results.append(SimpleNamespace(config=config, error=None, metrics={"trial_id": f"t{i}"},
                                       path=f"x/t{i}", metrics_dataframe=_df([last])))
    return sweep, trial_rows(results, sweep)


def test_with_repeats_the_error_bars_are_the_standard_errors_of_the_setting_means(
        tmp_path: Path) -> None:
    """The metric-vs-parameter plot (and best per loss) draws each setting at its mean ± sd/√n
    over its seeds, the seeds as faint dots behind it, and says so in its caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer

    from components.sweep.plots import best_per_loss_figure, param_figure, setting_points

    sweep, rows = _repeat_rows(tmp_path)
    assert setting_points(rows, sweep, "optim.lr") == [
        (0.1, pytest.approx(0.55), pytest.approx(0.05), "simclr"),
        (0.3, pytest.approx(0.57), pytest.approx(0.01), "simclr")]

    fig = param_figure(sweep, rows, "optim.lr")
    (ax,) = fig.axes
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    marker, _caps, (vertical,) = bars.lines
    assert marker.get_xydata().ravel().tolist() == pytest.approx([0.1, 0.55, 0.3, 0.57])
    segments = [s.ravel().tolist() for s in vertical.get_segments()]  # [x, low, x, high]
    assert segments[0] == pytest.approx([0.1, 0.50, 0.1, 0.60])  # 0.55 ± 0.05
    assert segments[1] == pytest.approx([0.3, 0.56, 0.3, 0.58])  # 0.57 ± 0.01
    (dots,) = [c for c in ax.collections if isinstance(c, PathCollection)]  # the seeds
    assert sorted(dots.get_offsets()[:, 1].tolist()) == pytest.approx([0.50, 0.56, 0.58, 0.60])
    assert dots.get_alpha() < 0.5
    caption = ax.get_title().replace("\n", " ")
    assert "standard error of the mean over seeds (sd/√n)" in caption, caption
    assert "faint dots: each seed" in caption
    assert ax.get_xscale() == "log"  # optim.lr is loguniform
    plt.close(fig)

    fig = best_per_loss_figure(sweep, rows)  # simclr's best setting: lr 0.3, 0.57 ± 0.01
    (ax,) = fig.axes
    (bar,) = ax.patches
    assert bar.get_height() == pytest.approx(0.57)
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    (vertical,) = bars.lines[2]
    assert vertical.get_segments()[0][:, 1].tolist() == pytest.approx([0.56, 0.58])
    plt.close(fig)


def test_confirmed_settings_are_marked_with_their_intervals(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    from components.sweep.confirmation import Candidate, summarise
    from components.sweep.plots import param_figure

    sweep, rows = _repeat_rows(tmp_path)
    hits = {1: [np.array([1, 1, 1, 0] * 10)], 2: [np.array([1, 0, 1, 0] * 10)]}
    conf = summarise(hits, [Candidate(1, {"optim.lr": 0.3}, 0.57),
                            Candidate(2, {"optim.lr": 0.1}, 0.55)], "test", True)
    fig = param_figure(sweep, rows, "optim.lr", confirmed=conf)
    (ax,) = fig.axes
    diamonds = [c for c in ax.containers if isinstance(c, ErrorbarContainer)
                and c.lines[0].get_marker() == "D"]
    assert [d.lines[0].get_xydata().ravel().tolist() for d in diamonds] == [
        pytest.approx([0.3, 0.75]), pytest.approx([0.1, 0.5])]
    best_bar = diamonds[0].lines[2][0].get_segments()[0][:, 1].tolist()
    assert best_bar == pytest.approx([conf.best.score.low, conf.best.score.high])
    assert diamonds[0].lines[0].get_markerfacecolor() != "none"
    assert diamonds[1].lines[0].get_markerfacecolor() == "none"
    assert "diamonds: confirmed on the test split" in ax.get_title().replace("\n", " ")
    plt.close(fig)


def test_one_seed_per_setting_has_its_own_error_bar_where_one_is_known(tmp_path: Path) -> None:
    """One seed: for knn_top1 the spread of its curve's last k evaluations / √k; a single
    evaluation, or a metric whose epoch-to-epoch moves are trend (loss), gets no bar."""
    from components.sweep.plots import _se_caption, setting_se

    sweep = load_sweep(_space(tmp_path))  # knn_top1, mean_last, k = 3

    def row(curve: list[float], **extra: Any) -> dict[str, Any]:
        return {"params": {"loss.name": "simclr", "optim.lr": 0.1}, "score": curve[-1],
                "setting_mean": curve[-1], "setting_sd": None, "setting_n": 1,
                "curve": list(enumerate(curve, 1)), **extra}

    noisy = row([0.40, 0.50, 0.45, 0.55])  # last 3: sd 0.05
    assert setting_se([noisy], sweep) == (pytest.approx(0.05 / 3 ** 0.5), "curve")
    # a row's binomial knn_top1_se is not the bar: the settings share the val split
    assert setting_se([row([0.5, 0.6], knn_top1_se=0.04)], sweep) == setting_se(
        [row([0.5, 0.6])], sweep)
    assert setting_se([row([0.5])], sweep) == (None, None)
    # a short curve: the sd of what there is, over √(the evaluations its score averages)
    assert setting_se([row([0.5, 0.6])], sweep)[0] == pytest.approx(0.1 / 2 ** 0.5 / 2 ** 0.5)
    # statistic last: the score is one evaluation, its error the evaluations' sd
    last = load_sweep(_space(tmp_path), ["statistic.name=last"])
    assert setting_se([noisy], last)[0] == pytest.approx(0.05)
    assert setting_se([noisy], load_sweep(_space(tmp_path), ["metric=loss", "mode=min"])) == (
        None, None)
    assert _se_caption(sweep, [[noisy]]) == (
        "error bars: one seed: ± sd/√3 of its last 3 knn_top1 evaluations")
    assert _se_caption(sweep, [[row([0.5])]]) == (
        "no error bars: one seed per setting and no estimate of its noise")


def test_importances_only_where_the_data_supports_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """param_importances.yaml / optuna_importances.png need max(4, 2 × parameters) finished
    settings (a setting's repeats count once) whose means spread by more than 2 × their
    median standard error; otherwise one line says why and neither is written."""
    from components.sweep.results import _write_results
    from components.sweep.study import importance_support, param_importances

    sweep = load_sweep(_space(tmp_path))  # 3 swept parameters: 6 settings needed

    def rows_of(means: list[float], wobble: float) -> list[dict[str, Any]]:
        results = []
        for i, m in enumerate(means):
            loss = ("simclr", "xclr")[i % 2]
            config = {"loss.name": loss, "optim.lr": 0.01 * 1.6 ** i,
                      **({"loss.tau_s": 0.05 * 1.5 ** i} if loss == "xclr" else {})}
            results.append(SimpleNamespace(  # curve sd: wobble; standard error wobble/√3
                config=config, error=None, metrics={"trial_id": f"t{i}"}, path=f"x/t{i}",
                metrics_dataframe=_df([m - wobble, m + wobble, m])))
        return trial_rows(results, sweep)

    # 8 settings, means 0.30 .. 0.65 (sd 0.12), each known to ±0.006: written
    clear = rows_of([0.30 + 0.05 * i for i in range(8)], wobble=0.01)
    assert importance_support(sweep, clear) is None
    out = tmp_path / "out"
    out.mkdir()
    _write_results(sweep, clear, out)
    importances = yaml.safe_load((out / "param_importances.yaml").read_text())
    assert importances and set(importances) <= {"loss.name", "optim.lr", "loss.tau_s"}
    assert (out / "optuna_importances.png").exists()
    assert (out / "optuna_contour.png").exists()
    assert "no parameter importances" not in capsys.readouterr().err

    # 8 settings whose means (0.50 .. 0.57, sd 0.024) differ less than their noise (±0.12)
    noise = rows_of([0.50 + 0.01 * i for i in range(8)], wobble=0.2)
    assert param_importances(sweep, noise) == {}
    err = capsys.readouterr().err
    assert err.startswith("simgraph sweep: no parameter importances (param_importances.yaml, "
                          "optuna_importances.png): the 8 settings' means spread by sd 0.0245, "
                          "within 2 × their median standard error 0.115: their differences "
                          "are noise"), err

    # repeats count once: 4 trials are 2 settings
    _, repeated = _repeat_rows(tmp_path)
    assert importance_support(sweep, repeated) == (
        "2 finished settings for 3 swept parameters: importances need at least 6 "
        "(max(4, 2 × parameters))")


@pytest.mark.slow
def test_a_repeats_sweep_in_s3_trains_seeds_and_the_searcher_sees_their_mean(
        s3_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``repeats: 2``: each setting trains with seeds 0 and 1, settings are ranked by their
    mean, and Optuna (behind Tune's Repeater) is told that mean. The dataset, the sweep dir and
    every trial's run dir live in S3 (moto, tests/support/s3.py): the trials stage the dataset,
    checkpoint into S3, and nothing goes to a local look-alike path; a second start must say
    --resume; --resume accepts Tune's state as the sweep left it and refuses a changed one."""
    import pickle

    from components.io import storage
    from components.runs.checkpoints import latest_complete

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the state record's key
    dataset = storage.join(s3_uri, "datasets", "syn")
    storage.upload_dir(synthetic_dataset(tmp_path / "syn"), dataset)
    base = tiny_run_config(dataset, tmp_path / "unused", name="base", train__epochs=1,
                           data__stage_dir=str(tmp_path / "stage"), knn__every_epochs=0,
                           loss={"name": "simclr", "tau": 0.2})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweeps = storage.join(s3_uri, "sweeps")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "name": "s", "storage": sweeps, "base": str(tmp_path / "base.yaml"),
        "metric": "loss", "mode": "min", "num_samples": 2, "repeats": 2, "max_concurrent": 2,
        "resources": {"workers": 1, "cpus_per_worker": 1.0, "gpus_per_worker": 0.0},
        "searcher": {"name": "random", "seed": 0}, "scheduler": {"name": "fifo"},
        "space": {"optim.lr": {"loguniform": [0.01, 0.5]}},
    }))

    def sweep(*args: str, rc: int = 0) -> str:
        out = subprocess.run([sys.executable, "-m", "pipelines.cli", "sweep", str(space), *args],
                             cwd=tmp_path, capture_output=True, text=True, timeout=400)
        assert out.returncode == rc, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout + out.stderr

    sweep()
    sweep_dir = storage.join(sweeps, "s")
    names = set(storage.list_dir(sweep_dir))
    assert {"trials.csv", "trials.md", "best.yaml", "trials", "state_digest.json"} <= names, names
    rows = list(csv.DictReader(storage.read_text(storage.join(sweep_dir, "trials.csv"))
                               .splitlines()))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"finished"}, rows
    assert {r["setting_n"] for r in rows} == {"2"}
    settings: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        settings.setdefault(r["optim.lr"], []).append(r)
    assert len(settings) == 2
    for members in settings.values():  # seeds 0 and 1 of each setting, different scores
        seeds = sorted(yaml.safe_load(storage.read_text(storage.join(
            sweep_dir, "trials", m["trial"], "config.yaml")))["train"]["seed"] for m in members)
        assert seeds == [0, 1] and sorted(m["repeat"] for m in members) == ["0", "1"]
        scores = [float(m["score"]) for m in members]
        assert scores[0] != scores[1]
        assert float(members[0]["setting_mean"]) == pytest.approx(sum(scores) / 2)
    # the searcher (Optuna, behind Tune's Repeater) was told each setting's mean
    (state,) = [n for n in names if n.startswith("searcher-state-") and n.endswith(".pkl")]
    study = pickle.loads(storage.read_bytes(storage.join(sweep_dir, state)))["_ot_study"]
    assert sorted(t.value for t in study.trials) == pytest.approx(
        sorted(float(m[0]["setting_mean"]) for m in settings.values()))
    for r in rows:  # every trial's run dir, checkpoint included, is in S3
        done = latest_complete(storage.join(sweep_dir, "trials", r["trial"]))
        assert done is not None and done[0] == 1
    assert not (tmp_path / "s3:").exists()

    # The sweep dir in S3 is seen as taken: a second start must say --resume.
    assert "already holds a sweep: add --resume" in sweep(rc=1)
    # Tune's state as the sweep left it, signed: --resume accepts it; a changed file is refused.
    sweep("--resume")
    storage.write_bytes(storage.join(sweep_dir, "tuner.pkl"), b"not Tune's")
    out = sweep("--resume", rc=1)
    assert "tuner.pkl" in out and "changed since the last sweep run recorded it" in out, out
