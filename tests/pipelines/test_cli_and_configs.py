"""Every shipped config file loads and validates; the CLI reports errors with exit code 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from components.config import LossSection, load_config
from components.objectives import ContrastiveBatch, Objective, build_objective
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]
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


def test_overrides_may_follow_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """``simgraph preprocess cfg.yaml --overwrite split.seed=1``: an override after a flag
    is an override (was "unrecognized arguments"); an unknown flag is still refused."""
    path = str(ROOT / "pipelines/configs/losses/xclr_class.yaml")
    assert main(["validate", path, "-v", "loss.tau_s=0.3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["loss"]["tau_s"] == 0.3
    assert main(["validate", "-v", path, "loss.tau_s=0.2", "--verbose", "loss.tau=0.5"]) == 0
    loss = yaml.safe_load(capsys.readouterr().out)["loss"]
    assert (loss["tau_s"], loss["tau"]) == (0.2, 0.5)
    with pytest.raises(SystemExit) as e:
        main(["validate", path, "--no-such-flag", "loss.tau_s=0.3"])
    assert e.value.code == 2 and "unrecognized arguments: --no-such-flag" in (
        capsys.readouterr().err)


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


PRETRAIN_FILES = sorted((ROOT / "pipelines" / "configs" / "pretrain").glob("*.yaml")) + sorted(
    (ROOT / "pipelines" / "configs" / "recipes").glob("*.yaml"))
DATA_FILES = sorted((ROOT / "pipelines" / "configs" / "data").glob("*.yaml"))


@pytest.mark.parametrize("path", PRETRAIN_FILES + DATA_FILES, ids=lambda p: p.stem)
def test_run_and_data_configs_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.config import PreprocessConfig, PretrainConfig
    from pipelines.cli import config_class

    cls = PretrainConfig if path.parent.name in ("pretrain", "recipes") else PreprocessConfig
    assert config_class(str(path)) is cls
    load_config(path, cls)
    assert main(["validate", str(path)]) == 0
    assert main(["validate", str(path), "no_such_key=1"]) == 2
    assert "unknown key no_such_key" in capsys.readouterr().err


SWEEP_FILES = sorted((ROOT / "search_spaces").rglob("*.yaml"))


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_validate_knows_sweep_files(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``simgraph validate`` on a sweep file checks it as ``simgraph sweep`` would (every
    branch built) instead of failing on it as a loss section."""
    if "cmaes" in path.read_text():
        pytest.importorskip("cmaes")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# simgraph validate: sweep," in out and "every branch builds" in out
    assert main(["validate", str(path), "num_samples=0"]) == 2
    assert "num_samples=0 is not allowed" in capsys.readouterr().err


def test_validate_names_the_kinds_it_knows(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "odd.yaml"
    odd.write_text("epochs: 3\n")
    assert main(["validate", str(odd)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which kind of config" in err and "['epochs']" in err
    assert all(k in err for k in ("sweep (", "run (", "preprocess (", "pretrain (", "loss ("))
    assert main(["validate", str(ROOT / "pipelines/configs/demo.yaml")]) == 0
    assert "run config, 3 pretraining runs, all valid" in capsys.readouterr().out


def test_validate_checks_a_pretrain_config_against_its_dataset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the dataset built, validate prints the run summary pretrain would (effective LR,
    steps) and its warnings; a dataset the loss cannot use is refused as pretrain would."""
    from tests.support.datasets import synthetic_dataset

    ds = synthetic_dataset(tmp_path / "ds")  # 4 classes × 32 train, 8 val
    path = str(ROOT / "pipelines/configs/pretrain/small_data.yaml")
    common = [f"data.dataset={ds}", "data.augment.resolution=16", "model.blocks=2",
              "data.batch_size=32", f"storage={tmp_path / 'runs'}"]
    assert main(["validate", path, *common, "optim.name=sgd", "optim.lr=0.1",
                 "optim.lr_scaling=linear", "optim.reference_batch=256"]) == 0
    out = capsys.readouterr().out
    assert "# simgraph pretrain: run 'small-simclr'" in out
    assert "peak LR 0.0125 = optim.lr 0.1 × 32/256 (lr_scaling linear)" in out
    assert "4 steps/epoch x 15 epochs = 60 steps" in out and "warning" not in out
    assert "  precision train.amp auto -> " in out  # the recipe's bf16-where-native, resolved
    assert main(["validate", path, *common, "loss.name=cone", "loss.bank_size=1024",
                 "loss.tau_sup=5"]) == 0
    out = capsys.readouterr().out
    assert "warning loss.bank_size=1024 is larger than the 128 training samples" in out
    assert "warning loss.tau_sup=5 lies outside [0.01, 1]" in out
    assert main(["validate", path, *common, "data.batch_size=256"]) == 1  # a RunError
    assert "fewer than one global batch" in capsys.readouterr().err


def test_validate_checks_model_init_against_the_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``model.init``: validate maps the file onto the model as pretrain's fresh start does,
    prints its summary line, and refuses a file that does not fit in one line."""
    import torch
    from safetensors.torch import save_file

    from components.config import ModelConfig
    from components.models.encoders import build_encoder
    from tests.support.datasets import synthetic_dataset

    ds = synthetic_dataset(tmp_path / "ds")
    init = tmp_path / "start.safetensors"
    torch.manual_seed(0)
    save_file(build_encoder(ModelConfig(backbone="convnet", blocks=2, width=256), 16)
              .backbone.state_dict(), str(init))
    path = str(ROOT / "pipelines/configs/pretrain/small_data.yaml")
    common = [f"data.dataset={ds}", "data.augment.resolution=16", "model.blocks=2",
              "data.batch_size=32", f"storage={tmp_path / 'runs'}", f"model.init={init}"]
    assert main(["validate", path, *common, "model.width=256"]) == 0
    assert f"#   init    {init}: 12 of 12 backbone tensors (projector: random)" in (
        capsys.readouterr().out)
    assert main(["validate", path, *common, "model.width=128"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"simgraph validate: model.init={str(init)!r}: tensor "
                          "features.0.weight has shape [256, 3, 3, 3] but convnet's")
    assert len(err.strip().splitlines()) == 1
