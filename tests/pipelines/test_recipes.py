"""The papers' recipes (pipelines/configs/recipes/): each loads, runs 2 steps at tiny scale
in-process, and ``simgraph validate`` prints its GPU-hours by the paper estimate
(components/runs/estimate.py, docs/gpu.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.config import ConfigError, PretrainConfig, load_config
from pipelines.cli import main
from tests.support.datasets import synthetic_dataset

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "pipelines" / "configs" / "recipes").glob("*.yaml"))


def test_the_four_papers_have_a_recipe() -> None:
    assert [p.stem for p in RECIPES] == [
        "cone_imagenet_resnet50", "sincere_imagenet100_resnet50", "supcon_imagenet_resnet50",
        "xclr_cc3m_resnet50"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_states_its_paper_and_train_set(path: Path) -> None:
    cfg = load_config(path, PretrainConfig)
    header = path.read_text().split("\nname:")[0]
    assert cfg.recipe.name and cfg.recipe.paper and cfg.recipe.train_images > 0
    assert "From the paper:" in header and "arXiv:" in header
    assert cfg.model.backbone == "resnet50"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("recipes") / "ds", size=32)


# Measured on 2 shared CPU cores: the four ResNet-50 recipes took 41 s for 2 steps each (CoNe
# 19 s: its 65,536-entry bank and EMA model; SINCERE 14 s: the CIFAR stem keeps 32 px through
# layer1). A ResNet-18 keeps each recipe's stem, projector, loss and optimiser; CoNe's bank
# shrinks to 1,024 with top-64 (its structure: EMA keys, bank, top-N neighbours): 17 s for
# the four, 8 of them CoNe's, which runs first and pays the process's one-time imports.
SMALLER = ["model.backbone=resnet18", "model.projector_hidden=256"]
CONE_SMALLER = ["loss.bank_size=1024", "loss.top_n=64"]


def tiny(data: Path, storage: Path) -> list[str]:
    """Overrides that run a recipe at tiny scale: the synthetic dataset (labels, 8-d captions),
    32 px, batch 8, 2 steps of 1 epoch, in this process on CPU, a smaller ResNet
    (:data:`SMALLER`); the recipe's stem, loss, optimiser and schedule are kept."""
    return [f"storage={storage}", f"data.dataset={data}", "data.batch_size=8",
            "data.num_workers=1", "data.jit=false", "data.augment.resolution=32",
            "train.steps_per_epoch=2", "train.epochs=1", "train.amp=none",
            "knn.every_epochs=0", "scaling.num_workers=1", "scaling.use_gpu=false",
            "scaling.cpus_per_worker=1", "scaling.max_failures=0", "scaling.host=in_process",
            "checkpoint.every_epochs=1", *SMALLER]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_a_recipe_trains_two_steps_at_tiny_scale(path: Path, data: Path, tmp_path: Path) -> None:
    import csv

    from components.runs.recipe import run_pretraining

    over = tiny(data, tmp_path) + (CONE_SMALLER if "cone" in path.stem else [])
    cfg = load_config(path, PretrainConfig, over)
    run_pretraining(cfg, echo=False)
    rows = list(csv.DictReader((tmp_path / cfg.name / "metrics.csv").open()))
    assert rows and all(r.get("loss") not in (None, "", "nan") for r in rows)


def test_validate_prints_the_recipes_gpu_hours(capsys: pytest.CaptureFixture[str]) -> None:
    from components.runs.estimate import (
        count_flops,
        estimate_for,
        gpu_hours,
        hours_text,
        whole_batches,
    )

    path = ROOT / "pipelines/configs/recipes/supcon_imagenet_resnet50.yaml"
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# paper estimate:"))
    cfg = load_config(path, PretrainConfig)
    images = whole_batches(cfg, 1_281_167)
    assert images == 1_281_167 // 6144 * 6144
    flops = count_flops(cfg)
    h100 = gpu_hours(estimate_for(cfg, "H100", flops, images, ""))
    a100 = gpu_hours(estimate_for(cfg, "A100", flops, images, ""))
    m = re.match(r"# paper estimate: ([\d.,]+) GPU-hours on an H100 SXM \(([\d.,]+) on an "
                 r"A100\) for 350 epochs of ([\d,]+) images", line)
    assert m, line
    assert m.groups() == (hours_text(h100), hours_text(a100), f"{images:,}")
    # 350 epochs × 1.28 M images × 3 × 2 views × 8.2 GFLOP ÷ (0.35 × 989 TFLOPS) ≈ 17.7 h
    assert h100 == pytest.approx(350 * images * 6 * flops[0] * 1e9 / (0.35 * 989e12) / 3600,
                                 rel=0.01)
    assert a100 / h100 == pytest.approx(989 / 312)


def test_resnet50_flops_match_torchvisions_published_count() -> None:
    """torchvision's ResNet-50 card: 4.09 GFLOPS at 224 px, counted as multiply-adds;
    FlopCounterMode counts 2 FLOPs per multiply-add, and the projector adds
    2048·2048 + 2048·128 MACs (≈ 0.0045 G)."""
    from components.runs.estimate import count_flops

    cfg = load_config(ROOT / "pipelines/configs/recipes/supcon_imagenet_resnet50.yaml",
                      PretrainConfig)
    per_view, _ = count_flops(cfg)
    assert per_view == pytest.approx(2 * 4.09, rel=0.03)


def test_validate_without_dataset_or_train_images_says_what_the_estimate_needs(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "pipelines/configs/recipes/sincere_imagenet100_resnet50.yaml"
    assert main(["validate", str(path), "recipe.train_images=0"]) == 0
    assert ("# paper estimate: needs the built dataset (data.dataset) or recipe.train_images"
            in capsys.readouterr().out)


def test_validate_reads_the_train_count_from_a_built_dataset(
        data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "pipelines/configs/recipes/sincere_imagenet100_resnet50.yaml"
    assert main(["validate", str(path), f"data.dataset={data}", "data.batch_size=8",
                 "scaling.use_gpu=false", "train.amp=none"]) == 0
    out = capsys.readouterr().out
    assert "for 800 epochs of 128 images" in out  # 4 classes × 32 train images
    assert f"128 train images in {data}'s manifest" in out


def test_a_failing_flop_count_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from components.runs import estimate

    def fail(*_: object, **__: object) -> None:
        raise RuntimeError("no")

    monkeypatch.setattr(estimate, "count_flops", fail)
    path = ROOT / "pipelines/configs/recipes/sincere_imagenet100_resnet50.yaml"
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# paper estimate: not available (RuntimeError: no)" in out
    assert "Traceback" not in out


def test_a_negative_train_images_is_refused_naming_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "pipelines/configs/recipes/cone_imagenet_resnet50.yaml"
    with pytest.raises(ConfigError, match=r"recipe\.train_images=-5 is not allowed: .*>= 0"):
        load_config(path, PretrainConfig, ["recipe.train_images=-5"])
    assert main(["validate", str(path), "recipe.train_images=-5"]) == 2
    assert "recipe.train_images=-5" in capsys.readouterr().err
