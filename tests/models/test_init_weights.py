"""``model.init`` key mapping and loading (components/models/init_weights.py): a torchvision
ResNet-18, a timm ResNet-10t, a simgraph export and checkpoint, DDP / DINO wrappers load into
the backbone tensor for tensor; a shape mismatch, a file that matches nothing, a missing or
unreadable file are refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from components.config import ModelConfig
from components.config.checks import ConfigError
from components.models.encoders import build_encoder
from components.models.init_weights import (
    InitWeightsError,
    check_init,
    check_init_path,
    load_init,
    read_state_dict,
)

SMALL = {"projector_hidden": 32, "projector_dim": 16}


def _equal(module: torch.nn.Module, tensors: dict[str, torch.Tensor], prefix: str = "") -> None:
    state = module.state_dict()
    assert state, "nothing to compare"
    for k, v in state.items():
        assert torch.equal(v, tensors[prefix + k].to(v.dtype)), k


def _resnet18_file(tmp_path: Path, wrap: Any = None) -> tuple[Path, dict[str, torch.Tensor]]:
    from torchvision import models

    torch.manual_seed(1)
    state = models.resnet18(weights=None).state_dict()
    path = tmp_path / "r18.pth"
    torch.save(state if wrap is None else wrap(state), path)
    return path, state


def test_a_torchvision_resnet18_state_dict_loads_into_the_backbone(tmp_path: Path) -> None:
    path, state = _resnet18_file(tmp_path)
    model = ModelConfig(backbone="resnet18", small_images=False, **SMALL)
    encoder = build_encoder(model, 32)
    plan = load_init(encoder, str(path), model.backbone)
    _equal(encoder.backbone, state)
    assert plan.summary() == (f"{path}: 120 of 120 backbone tensors (projector: random); "
                              "ignored: fc.weight, fc.bias")
    # the driver's check (meta device) maps the same way
    assert check_init(str(path), model, 32) == plan


def test_a_ddp_module_prefixed_dict_under_model_loads(tmp_path: Path) -> None:
    path, state = _resnet18_file(
        tmp_path, lambda s: {"model": {f"module.{k}": v for k, v in s.items()}, "epoch": 3})
    encoder = build_encoder(ModelConfig(backbone="resnet18", small_images=False, **SMALL), 32)
    plan = load_init(encoder, str(path), "resnet18")
    _equal(encoder.backbone, state)
    assert plan.ignored == ["module.fc.weight", "module.fc.bias"] and not plan.unexpected


def test_a_dino_teacher_checkpoint_takes_its_backbone_and_lists_the_head(tmp_path: Path) -> None:
    def dino(s: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {"teacher": {**{f"backbone.{k}": v for k, v in s.items() if not k.startswith("fc")},
                            "head.mlp.0.weight": torch.zeros(3, 512)}}

    path, state = _resnet18_file(tmp_path, dino)
    encoder = build_encoder(ModelConfig(backbone="resnet18", small_images=False, **SMALL), 32)
    plan = load_init(encoder, str(path), "resnet18")
    _equal(encoder.backbone, state)
    assert plan.unexpected == ["head.mlp.0.weight"]  # not under the backbone's prefix

    flat = tmp_path / "flat.pth"  # student and teacher side by side: the teacher's is taken
    torch.save({f"{who}.backbone.{k}": v * (1 if who == "teacher" else 0)
                for who in ("student", "teacher") for k, v in state.items()}, flat)
    encoder = build_encoder(ModelConfig(backbone="resnet18", small_images=False, **SMALL), 32)
    plan = load_init(encoder, str(flat), "resnet18")
    _equal(encoder.backbone, state)
    assert plan.unexpected[0].startswith("student.backbone.")


def test_a_timm_resnet10t_state_dict_loads(tmp_path: Path) -> None:
    import timm

    torch.manual_seed(2)
    state = timm.create_model("resnet10t", pretrained=False).state_dict()
    path = tmp_path / "resnet10t.safetensors"
    save_file(state, str(path))
    model = ModelConfig(backbone="timm/resnet10t", **SMALL)
    encoder = build_encoder(model, 32)
    plan = load_init(encoder, str(path), model.backbone)
    _equal(encoder.backbone, state)
    assert plan.backbone_total == len(plan.backbone) and not plan.missing
    assert sorted(plan.ignored) == ["fc.bias", "fc.weight"]


def _convnet() -> ModelConfig:
    return ModelConfig(backbone="convnet", width=8, blocks=2, **SMALL)


def test_a_simgraph_export_loads_and_a_checkpoint_brings_its_projector(tmp_path: Path) -> None:
    torch.manual_seed(3)
    trained = build_encoder(_convnet(), 16)
    export = tmp_path / "model.safetensors"  # simgraph export's model.safetensors: its keys
    save_file(trained.backbone.state_dict(), str(export))
    torch.manual_seed(4)
    fresh = build_encoder(_convnet(), 16)
    plan = load_init(fresh, str(export), "convnet")
    _equal(fresh.backbone, trained.backbone.state_dict())
    assert plan.summary().startswith(f"{export}: 12 of 12 backbone tensors (projector: random)")

    ckpt = tmp_path / "ckpt.pt"  # a checkpoint's model state: the projector comes too
    torch.save({"model": {f"encoder.{k}": v for k, v in trained.state_dict().items()}
                | {"objective.bank": torch.zeros(4)}}, ckpt)
    torch.manual_seed(5)
    other = build_encoder(_convnet(), 16)
    plan = load_init(other, str(ckpt), "convnet")
    _equal(other, {k: v for k, v in trained.state_dict().items()})
    assert "(projector: from the file); unexpected: objective.bank" in plan.summary()


def test_a_shape_mismatch_is_refused_naming_the_tensor_and_both_shapes(tmp_path: Path) -> None:
    path, _ = _resnet18_file(tmp_path)
    model = ModelConfig(backbone="resnet18", small_images=True, **SMALL)  # a 3x3 stem
    with pytest.raises(InitWeightsError) as e:
        check_init(str(path), model, 32)
    assert str(e.value) == (
        f"model.init={str(path)!r}: tensor conv1.weight has shape [64, 3, 7, 7] but "
        "resnet18's conv1.weight has shape [64, 3, 3, 3] (another architecture or size: "
        "match model.backbone, model.width / blocks, small_images and "
        "data.augment.resolution to the file's)")


def test_a_file_that_matches_nothing_is_refused(tmp_path: Path) -> None:
    path, _ = _resnet18_file(tmp_path)
    with pytest.raises(InitWeightsError) as e:
        load_init(build_encoder(_convnet(), 16), str(path), "convnet")
    msg = str(e.value)
    assert msg.startswith(f"model.init={str(path)!r}: 0 of 12 tensors matched: is this a "
                          "convnet state dict? (its keys: conv1.weight, bn1.weight,")
    assert "\n" not in msg and "(117 more)" in msg


def test_missing_unreadable_and_remote_files_are_refused_in_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone.pth"
    with pytest.raises(InitWeightsError, match=r"^model.init='.*gone.pth': no such file$"):
        check_init_path(str(gone))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(InitWeightsError) as e:
        load_init(build_encoder(_convnet(), 16), str(bad), "convnet")
    assert str(e.value).startswith(f"model.init={str(bad)!r} cannot be read (")
    assert "\n" not in str(e.value)
    with pytest.raises(InitWeightsError, match="only local files are read"):
        check_init_path("s3://bucket/r18.pth")
    with pytest.raises(InitWeightsError, match=r"give a .safetensors / .pth / .pt file"):
        check_init_path(str(tmp_path / "r18.bin"))


def test_the_config_field_defaults_to_random_init() -> None:
    assert ModelConfig().init is None
    with pytest.raises(ConfigError, match="model.init=''"):
        ModelConfig(init="")


def test_a_timm_vit_tiny_loads_at_its_size_and_is_refused_at_another(tmp_path: Path) -> None:
    import timm

    torch.manual_seed(6)
    state = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32).state_dict()
    path = tmp_path / "vit.safetensors"
    save_file(state, str(path))
    model = ModelConfig(backbone="timm/vit_tiny_patch16_224", small_images=False, **SMALL)
    encoder = build_encoder(model, 32)
    plan = load_init(encoder, str(path), model.backbone)
    _equal(encoder.backbone, state)
    assert sorted(plan.ignored) == ["head.bias", "head.weight"] and not plan.missing
    assert not plan.resampled
    # a position embedding that is no square grid after the class token cannot be resampled
    bad = dict(state, pos_embed=state["pos_embed"][:, :4])
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(InitWeightsError, match=r"tensor pos_embed has shape \[1, 4, 192\] but "
                       r"timm/vit_tiny_patch16_224's pos_embed has shape \[1, 5, 192\]"):
        check_init(str(tmp_path / "bad.safetensors"), model, 32)


def test_a_vit_made_at_224_px_starts_a_32_px_run_with_its_position_embeddings_resampled(
        tmp_path: Path) -> None:
    """An ImageNet-size file (14 × 14 patches + the class token) into a ViT built for 32-px
    crops (2 × 2): ``pos_embed`` resampled by timm's own function, the class token's row kept,
    every other tensor copied; the plan says so, the driver's check accepts it."""
    import timm
    from timm.layers import resample_abs_pos_embed

    torch.manual_seed(7)
    state = timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict()
    assert state["pos_embed"].shape == (1, 197, 192)
    path = tmp_path / "vit224.safetensors"
    save_file(state, str(path))
    model = ModelConfig(backbone="timm/vit_tiny_patch16_224", small_images=False, **SMALL)
    checked = check_init(str(path), model, 32)  # the driver's check, on the meta device
    assert checked.resampled == {"pos_embed": ((14, 14), (2, 2))}
    encoder = build_encoder(model, 32)
    plan = load_init(encoder, str(path), model.backbone)
    assert plan.resampled == {"pos_embed": ((14, 14), (2, 2))} and not plan.missing
    assert "pos_embed resampled from 14x14 to 2x2 patches" in plan.summary()
    got = encoder.backbone.state_dict()
    want = resample_abs_pos_embed(state["pos_embed"], new_size=[2, 2], old_size=[14, 14],
                                  num_prefix_tokens=1)
    assert got["pos_embed"].shape == (1, 5, 192) and torch.equal(got["pos_embed"], want)
    assert torch.equal(got["pos_embed"][:, 0], state["pos_embed"][:, 0])  # the class token's
    _equal(encoder.backbone, {**state, "pos_embed": want})


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_bytes_read_elsewhere_load_as_the_file_does(tmp_path: Path, suffix: str) -> None:
    """A Ray Train worker on another node gets the driver's bytes, not the file."""
    torch.manual_seed(0)
    state = {"conv.weight": torch.randn(4, 3, 3, 3), "bn.running_mean": torch.randn(4)}
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"state_dict": state}, path)
    data = path.read_bytes()
    from_file = read_state_dict(str(path))
    path.unlink()
    from_bytes = read_state_dict(str(path), data)
    assert from_bytes.keys() == from_file.keys() == state.keys()
    for k in state:
        assert torch.equal(from_bytes[k], state[k])
    with pytest.raises(InitWeightsError, match="cannot be read"):
        read_state_dict(str(path), b"not a state dict")
