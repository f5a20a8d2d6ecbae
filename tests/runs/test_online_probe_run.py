"""The online linear probe in a run (:class:`components.runs.worker.PretrainRecipe`,
in-process, one CPU worker, the synthetic dataset, ``data.jit: false``): ``probe_top1`` and its
standard error every epoch in ``metrics.csv``, the console line and the run's table; the
probe in every checkpoint; a run resumed from its epoch-1 checkpoint ends with the
uninterrupted run's weights, probe and history (``probe_top1`` included); a checkpoint
without probe state (older, or saved with the probe off) resumes with a fresh probe and one
line saying so."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import PretrainConfig, from_dict
from components.runs.checkpoint import TrainingState, load_state
from components.runs.recipe import history_table, run_pretraining
from components.runtime.console import epoch_line
from tests.support.datasets import synthetic_dataset, tiny_run_config

TIMING = {"samples_per_s", "data_wait", "time_s", "eval_s"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("probe") / "ds", train_per_class=8,
                             val_per_class=4)  # 32 train images: 2 steps of 16 per epoch


def _cfg(dataset: Path, storage: Path, **over: Any) -> PretrainConfig:
    return from_dict(PretrainConfig, tiny_run_config(
        dataset, storage, train__epochs=2, probe={"every_epochs": 1, "lr": 0.01},
        scaling={"num_workers": 1, "cpus_per_worker": 1.0, "host": "in_process"}, **over))


def _history(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in state["history"]]


@pytest.fixture(scope="module")
def straight(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 2-epoch run with the probe on, every checkpoint kept."""
    storage = tmp_path_factory.mktemp("straight")
    run_pretraining(_cfg(dataset, storage), echo=False)
    return storage / "run"


def test_a_run_reports_probe_top1_with_its_standard_error(straight: Path) -> None:
    with open(straight / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    for r in rows:
        p, se, n = float(r["probe_top1"]), float(r["probe_top1_se"]), int(r["probe_queries"])
        assert 0.0 <= p <= 1.0 and n == 16  # the val split: 4 classes x 4
        assert se == pytest.approx(math.sqrt(p * (1 - p) / n))
        assert math.isfinite(float(r["probe_loss"])) and float(r["probe_loss"]) > 0
        assert 0.0 <= float(r["knn_top1"]) <= 1.0  # the kNN beside it, as before
    state = load_state(straight / "epoch_00002")
    assert state["probe"]["linear"]["weight"].shape == (4, 16)  # classes x convnet features
    assert state["probe"]["optimizer"]["state"]  # AdamW's moments
    row = state["history"][-1]
    assert f"probe {100 * row['probe_top1']:.1f} ± {100 * row['probe_top1_se']:.1f} %" \
        in epoch_line(row, 2, None)
    assert "probe_top1" in history_table(state["history"]).splitlines()[0]
    assert "probe_top1" not in history_table([{k: v for k, v in row.items()
                                               if not k.startswith("probe")}])


def _resume_from_epoch_1(straight: Path, storage: Path, strip_probe: bool = False) -> Path:
    """The straight run's dir as a run killed in epoch 2 leaves it: epoch 1's checkpoint
    only (and its metrics); ``strip_probe``: that checkpoint saved without probe state."""
    run_dir = storage / "run"
    shutil.copytree(straight, run_dir)
    shutil.rmtree(run_dir / "epoch_00002")
    if strip_probe:
        state = TrainingState.load(run_dir / "epoch_00001")
        state.probe = None
        state.save(run_dir / "epoch_00001")
    return run_dir


def test_a_resumed_run_ends_as_the_uninterrupted_one_probe_included(
        dataset: Path, straight: Path, tmp_path: Path) -> None:
    run_dir = _resume_from_epoch_1(straight, tmp_path)
    run_pretraining(_cfg(dataset, tmp_path), echo=False)
    a, b = load_state(straight / "epoch_00002"), load_state(run_dir / "epoch_00002")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in a["probe"]["linear"]:
        assert torch.equal(a["probe"]["linear"][key], b["probe"]["linear"][key]), key
    assert repr(a["probe"]["optimizer"]) == repr(b["probe"]["optimizer"])
    assert _history(a) == _history(b)  # probe_top1, its SE and probe_loss of both epochs


def test_a_checkpoint_without_probe_state_resumes_with_a_fresh_probe(
        dataset: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
        ) -> None:
    run_dir = _resume_from_epoch_1(straight, tmp_path, strip_probe=True)
    capsys.readouterr()
    run_pretraining(_cfg(dataset, tmp_path), echo=False)
    out = capsys.readouterr().out
    assert out.count("checkpoint epoch_00001 holds no online probe (saved before the probe "
                     "existed or with probe.every_epochs 0): the probe starts fresh") == 1
    a, b = load_state(straight / "epoch_00002"), load_state(run_dir / "epoch_00002")
    for key in a["model"]:  # the encoder does not depend on the probe
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert not torch.equal(a["probe"]["linear"]["weight"], b["probe"]["linear"]["weight"])
    assert 0.0 <= b["history"][-1]["probe_top1"] <= 1.0


def test_a_checkpoint_holds_the_probe_checked_and_without_it_loads_as_none() -> None:
    from components.runs.checkpoint import CheckpointError

    base = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 1, "step": 2,
            "history": [], "config": {}}
    assert TrainingState.from_dict(base).probe is None  # a checkpoint older than the probe
    probe = {"linear": {"weight": torch.tensor([[float("nan")]]), "bias": torch.zeros(1)},
             "optimizer": {"state": {}, "param_groups": []}}
    state = TrainingState.from_dict({**base, "probe": probe})
    assert state.nonfinite() == ["probe.linear.weight"]  # refused before it is saved
    with pytest.raises(CheckpointError, match=r"holds probe of the wrong type"):
        TrainingState.from_dict({**base, "probe": {"linear": {}}})
