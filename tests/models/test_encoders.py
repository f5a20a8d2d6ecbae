"""Encoders: the small-image ConvNet's shapes and receptive field, the projector variants, and
the config check that a convnet's pooling fits the resolution."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from components.config import ConfigError, PretrainConfig, from_dict
from components.models.encoders import ConvNet, build_backbone, projector


@pytest.mark.parametrize(("side", "blocks", "width", "dim"), [
    (28, 4, 32, 256), (32, 4, 8, 64), (64, 5, 4, 32), (16, 2, 4, 8),
])
def test_convnet_shapes(side: int, blocks: int, width: int, dim: int) -> None:
    net, out = build_backbone("convnet", small_images=True, width=width, blocks=blocks)
    assert out == dim
    assert net(torch.randn(3, 3, side, side)).shape == (3, dim)


def test_convnet_sees_the_whole_image() -> None:
    """At 28 px with 4 blocks the features depend on the corners as well as the centre (the
    tiny CNN's features average 9×9 patches)."""
    torch.manual_seed(0)
    net = ConvNet(width=8, blocks=4).eval()
    x = torch.randn(1, 3, 28, 28)
    base = net(x)
    for r, c in ((0, 0), (0, 27), (27, 0), (27, 27), (14, 14)):
        poked = x.clone()
        poked[0, :, r, c] = 100.0
        assert not torch.allclose(net(poked), base), (r, c)


def test_convnet_too_small_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"at least 16 px, got \(8, 8\); lower model.blocks"):
        ConvNet(width=4, blocks=4)(torch.randn(1, 3, 8, 8))


def test_projector_without_batchnorm() -> None:
    with_bn = projector(8, 16, 4, layers=3)
    without = projector(8, 16, 4, layers=3, bn=False)
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in with_bn.modules()) == 2
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in without.modules())
    assert all(m.bias is not None for m in without.modules() if isinstance(m, torch.nn.Linear))
    assert without(torch.randn(5, 8)).shape == (5, 4)


def test_convnet_blocks_must_fit_the_resolution() -> None:
    base = {"name": "r", "data": {"dataset": "d", "augment": {"resolution": 28}},
            "model": {"backbone": "convnet", "blocks": 5}}
    with pytest.raises(ConfigError, match=r"model.blocks=5 .*resolution=28.*<= 4"):
        from_dict(PretrainConfig, base)
    base["model"]["blocks"] = 4
    assert from_dict(PretrainConfig, base).model.blocks == 4
    base["model"] = {"backbone": "resnet18", "blocks": 5}  # only the convnet pools per block
    from_dict(PretrainConfig, base)


def test_a_checkpoint_of_another_model_is_refused_naming_the_part() -> None:
    from components.config import ModelConfig
    from components.models.encoders import EncoderStateError, build_encoder, encoder_from_state

    small = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16,
                        projector_dim=8)
    state = {f"encoder.{k}": v for k, v in build_encoder(small).state_dict().items()}
    wider = dataclasses.replace(small, width=8)
    with pytest.raises(EncoderStateError, match=r"the checkpoint's backbone does not fit the "
                                                r"run config's model section \(size mismatch"):
        encoder_from_state(wider, state)
    deeper = dataclasses.replace(small, projector_layers=3)
    with pytest.raises(EncoderStateError, match=r"checkpoint's projector does not fit .*"
                                                r"Missing key"):
        encoder_from_state(deeper, state)
    no_projector = {k: v for k, v in state.items() if not k.startswith("encoder.projector.")}
    with pytest.raises(EncoderStateError, match="projector does not fit"):
        encoder_from_state(small, no_projector)


@pytest.mark.parametrize(("backbone", "dim"), [
    ("timm/resnet10t", 512), ("timm/vit_tiny_patch16_224", 192), ("timm/convnext_atto", 320),
])
def test_timm_backbones_build_without_classifier_at_the_run_resolution(backbone: str,
                                                                      dim: int) -> None:
    """A timm architecture, random init, no classifier, global pooling: features [N, F] with F
    its num_features; a ViT is built for the run's resolution (32 px: 2×2 patches of 16)."""
    from components.config import ModelConfig
    from components.models.encoders import build_encoder

    torch.manual_seed(0)
    model = ModelConfig(backbone=backbone, small_images=False, projector_hidden=32,
                        projector_dim=8)
    encoder = build_encoder(model, 32)
    assert encoder.feat_dim == dim
    assert getattr(encoder.backbone, "num_classes", 0) == 0
    h, z, logits = encoder(torch.randn(3, 3, 32, 32))
    assert h.shape == (3, dim) and z.shape == (3, 8) and logits is None
    if "vit" in backbone:
        assert encoder.backbone.pos_embed.shape[1] == 1 + (32 // 16) ** 2  # class token + 4


def test_a_timm_checkpoint_reads_back_through_encoder_from_state() -> None:
    from components.config import ModelConfig
    from components.models.encoders import build_encoder, encoder_from_state

    model = ModelConfig(backbone="timm/vit_tiny_patch16_224", projector_hidden=16,
                        projector_dim=8)
    torch.manual_seed(0)
    built = build_encoder(model, 32)
    state = {f"encoder.{k}": v for k, v in built.state_dict().items()}
    read = encoder_from_state(model, state, 32)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(read(x)[0], built.eval()(x)[0])
