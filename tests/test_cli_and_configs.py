"""Every shipped config file loads and validates; the CLI reports errors with exit code 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from components.config import LossSection, load_config
from components.objectives import ContrastiveBatch, Objective, build_objective
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
LOSS_FILES = sorted((ROOT / "pipelines" / "configs" / "losses").glob("*.yaml"))


def test_there_is_a_config_per_loss() -> None:
    names = {load_config(p, LossSection).loss.name for p in LOSS_FILES}
    assert names == {"simclr", "supcon", "xclr", "sincere", "eps_supinfonce", "cone", "ce", "clip"}


@pytest.mark.parametrize("path", LOSS_FILES, ids=lambda p: p.stem)
def test_loss_config_builds_its_objective(path: Path) -> None:
    import torch

    cfg = load_config(path, LossSection)
    objective = build_objective(
        cfg.loss, dim=128, num_classes=10, class_similarity=torch.eye(10), caption_dim=384
    )
    fields = {f.name for f in dataclasses.fields(ContrastiveBatch)}
    assert isinstance(objective, Objective) and objective.requires <= fields
    if getattr(cfg.loss, "bank_size", 0):  # a bank is filled by EMA keys: the loop must know
        assert "ema_z" in objective.requires


def test_cli_validate_prints_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["validate", str(ROOT / "pipelines/configs/losses/xclr_class.yaml"), "loss.tau_s=0.3"])
        == 0
    )
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["loss"] == {
        "tau": 0.1,
        "bank_size": 0,
        "ema_momentum": 0.996,
        "name": "xclr",
        "tau_s": 0.3,
        "graph": "class",
    }


def test_cli_validate_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "pipelines/configs/losses/sincere.yaml")
    assert main(["validate", path, "loss.tau=-1"]) == 2
    assert "loss.tau=-1.0 is not allowed: it must be a finite number > 0" in capsys.readouterr().err
    assert main(["validate", path, "loss.epsilon=0.1"]) == 2
    assert "unknown key loss.epsilon for 'sincere'" in capsys.readouterr().err
    assert main(["validate", "/nonexistent.yaml"]) == 2
    assert "No such file" in capsys.readouterr().err


DATA_FILES = sorted((ROOT / "pipelines" / "configs" / "data").glob("*.yaml"))


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: p.stem)
def test_data_configs_load(path: Path) -> None:
    from components.config import PreprocessConfig, load_config

    cfg = load_config(path, PreprocessConfig)
    assert cfg.output.startswith("data/")


def test_preprocess_cli_reports_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert DATA_FILES, "no data configs found"
    rc = main(["preprocess", str(DATA_FILES[0]), "image.write_mode=png"])
    assert rc == 2
    assert "image.write_mode='png' is not allowed" in capsys.readouterr().err


PRETRAIN_FILES = sorted((ROOT / "pipelines" / "configs" / "pretrain").glob("*.yaml"))
DATA_FILES = sorted((ROOT / "pipelines" / "configs" / "data").glob("*.yaml"))


@pytest.mark.parametrize("path", PRETRAIN_FILES + DATA_FILES, ids=lambda p: p.stem)
def test_run_and_data_configs_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.config import PreprocessConfig, PretrainConfig
    from pipelines.cli import config_class

    cls = PretrainConfig if path.parent.name == "pretrain" else PreprocessConfig
    assert config_class(str(path)) is cls
    load_config(path, cls)
    assert main(["validate", str(path)]) == 0
    assert main(["validate", str(path), "no_such_key=1"]) == 2
    assert "unknown key no_such_key" in capsys.readouterr().err
