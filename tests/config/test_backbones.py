"""model.backbone: the built-in names or timm/<name>, checked when the config is made, and the
per-family checks of a timm backbone against the run (components/config/backbones.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from components.config import ConfigError, ModelConfig, PretrainConfig, from_dict
from components.config.backbones import timm_probe


def _run(backbone: str, resolution: int, **model: Any) -> dict[str, Any]:
    return {"name": "r", "data": {"dataset": "d", "augment": {"resolution": resolution}},
            "model": {"backbone": backbone, **model}}


def test_builtin_and_timm_names_are_accepted() -> None:
    for name in ("convnet", "resnet18", "resnet34", "resnet50", "timm/resnet50",
                 "timm/vit_small_patch16_224", "timm/convnext_tiny"):
        assert ModelConfig(backbone=name).backbone == name


def test_a_misspelt_timm_name_gets_one_line_with_close_matches() -> None:
    with pytest.raises(ConfigError) as e:
        ModelConfig(backbone="timm/vit_smal_patch16_224")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("model.backbone='timm/vit_smal_patch16_224' is not a timm model; "
                          "close matches: vit_small_patch16_224")
    assert msg.endswith("(timm.list_models)")
    with pytest.raises(ConfigError, match=r"'timm/zzqqxx' is not a timm model; no close match"):
        ModelConfig(backbone="timm/zzqqxx")


def test_an_unknown_plain_name_lists_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"model.backbone='vgg16' is not allowed: choose one of "
                                          r"convnet, resnet18, resnet34, resnet50, or timm/<name>"):
        ModelConfig(backbone="vgg16")


def test_a_loaded_config_checks_the_name_too() -> None:
    with pytest.raises(ConfigError, match="is not a timm model"):
        from_dict(PretrainConfig, _run("timm/resnet5O", 32))


def test_vit_resolution_must_be_a_multiple_of_the_patch() -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(PretrainConfig, _run("timm/vit_tiny_patch16_224", 40))
    assert str(e.value) == (
        "data.augment.resolution=40 is not a multiple of timm/vit_tiny_patch16_224's patch "
        "size 16: set the resolution to a multiple of it (e.g. 32 or 48)")
    assert from_dict(PretrainConfig, _run("timm/vit_tiny_patch16_224", 32)).model.backbone
    # a CNN has no patch: any resolution
    from_dict(PretrainConfig, _run("timm/resnet10t", 40))


def test_a_size_the_architecture_cannot_run_is_one_line() -> None:
    """CrossViT-Ti/240's two branches (12- and 16-px patches) must agree on their token
    counts: built at 224 px it fails in its forward; found by running the model on meta
    tensors, before anything runs."""
    with pytest.raises(ConfigError, match=r"^timm/crossvit_tiny_240 at data.augment.resolution="
                                          r"224 cannot run on 224x224 crops \(") as e:
        from_dict(PretrainConfig, _run("timm/crossvit_tiny_240", 224))
    assert "\n" not in str(e.value)
    assert from_dict(PretrainConfig, _run("timm/crossvit_tiny_240", 240)).model.backbone


def test_small_images_default_is_accepted_for_timm() -> None:
    """The default small_images=true has no effect on a timm backbone (documented in
    ModelConfig): a stored run config writes every field, so a timm run must load with it."""
    for small in (True, False):
        cfg = from_dict(PretrainConfig, _run("timm/resnet10t", 32, small_images=small))
        assert cfg.model.small_images is small


def test_the_checks_are_cheap() -> None:
    """The probe builds on the meta device (no weights): ViT-B/16 in well under a second."""
    timm_probe("resnet10t", 32)  # timm imported
    start = time.perf_counter()
    info = timm_probe("vit_base_patch16_224", 64)
    assert time.perf_counter() - start < 1.0
    assert info.patch_size == (16, 16) and info.num_features == 768 and info.takes_img_size
    assert timm_probe("resnet10t", 32).takes_img_size is False


def test_the_example_config_uses_a_timm_backbone() -> None:
    from components.config import load_config

    path = Path(__file__).parents[2] / "pipelines/configs/pretrain/timm_vit_small.yaml"
    cfg = load_config(path, PretrainConfig)
    assert cfg.model.backbone == "timm/vit_small_patch16_224"


@pytest.mark.parametrize(("name", "patch", "dim"), [
    ("vit_small_patch16_224", (16, 16), 384), ("vit_base_patch16_224", (16, 16), 768),
    ("convnext_tiny", None, 768), ("resnet50", None, 2048), ("resnet101", None, 2048),
    ("resnet200", None, 2048),
])
def test_the_issues_architectures_at_224_px(name: str, patch: tuple[int, int] | None,
                                            dim: int) -> None:
    """Issue 43's tested architectures pass the config's checks at ImageNet size (shape-only:
    0.1–0.5 s each here) with the feature width the encoder gets."""
    info = timm_probe(name, 224)
    assert (info.patch_size, info.num_features) == (patch, dim)
    assert info.takes_img_size is (patch is not None)
    assert from_dict(PretrainConfig, _run(f"timm/{name}", 224)).model.backbone == f"timm/{name}"
