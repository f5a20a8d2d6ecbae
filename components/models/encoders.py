"""Encoders: a small-image ConvNet (the default for 28–64 px data), torchvision ResNets
(optionally with the small-image stem), timm architectures (``timm/<name>``: random init, no
classifier, global pooling; a ViT-like one sized for the run's resolution), the SupCon/SimCLR
projector MLP and a linear
classifier head (CoNe) — and the one builder of a config's encoder (:func:`build_encoder`)
and of a checkpoint's (:func:`encoder_from_state`), which training, evaluation, export and
embed all use.

``small_images=True`` swaps the ImageNet stem (7×7 stride-2 conv + max-pool) for a 3×3
stride-1 conv without pooling, the usual CIFAR recipe (SimCLR App. B.9) for 28–64 px inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from components.config.backbones import (
    BUILTIN_BACKBONES,
    is_timm,
    num_features,
    timm_kwargs,
    timm_name,
    timm_probe,
)
from components.errors import SimgraphError

if TYPE_CHECKING:
    from components.config import ModelConfig

# One of components.config.backbones.BUILTIN_BACKBONES, or "timm/<name>" (checked by
# components.config.backbones.check_backbone when a ModelConfig is made).
Backbone = str


class ConvNet(nn.Module):
    """``blocks`` × (3×3 conv → BN → ReLU → 2×2 max-pool), channels ``width · 2^i`` (capped at
    ``8 · width``), then global average pooling: ``[B, 3, H, W] -> [B, out_dim]``.

    The "Conv-4" family of small-image encoders (Vinyals et al. 2016; Snell et al. 2017),
    with doubling widths: at 28 px, 4 blocks take 28 → 14 → 7 → 3 → 1, so each output unit
    sees the whole image. Needs ``H, W >= 2^blocks``. (It replaced a 3-layer strided CNN
    without pooling whose features averaged 9×9 patches: trained, that one reached 71 %
    Fashion-MNIST kNN@20, below this net's 75 % at random init; docs/results.md.)
    """

    def __init__(self, width: int = 32, blocks: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for i in range(blocks):
            c_out = width * 2 ** min(i, 3)
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = c_in
        self.min_side = 2**blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < self.min_side:
            raise ValueError(
                f"ConvNet with {self.min_side.bit_length() - 1} blocks needs images of at "
                f"least {self.min_side} px, got {tuple(x.shape[-2:])}; lower model.blocks"
            )
        return self.features(x)


def build_timm(name: str, resolution: int | None) -> tuple[nn.Module, int]:
    """timm's ``name`` (``timm.create_model(name, pretrained=False, num_classes=0)``: random
    init, never downloads, no classifier, its global pooling on) and its feature width
    (``num_features``). A model whose constructor takes ``img_size`` (a ViT: its position
    embeddings) is built with ``img_size=resolution`` so it fits the crops (``resolution``
    None: timm's default size).

    Raises:
        ConfigError: the model cannot be built or run at ``resolution``
            (:func:`components.config.backbones.timm_probe`).
    """
    import timm

    takes = resolution is not None and timm_probe(name, resolution).takes_img_size
    net = timm.create_model(name, **timm_kwargs(resolution, takes))
    return net, num_features(net)


def build_backbone(
    name: Backbone, small_images: bool, width: int = 32, blocks: int = 4, *,
    resolution: int | None = None,
) -> tuple[nn.Module, int]:
    """The feature extractor and its output dimension (the classifier layer removed).
    ``width`` and ``blocks`` apply to ``convnet`` only, ``small_images`` to the torchvision
    ResNets only, ``resolution`` (the crops' side) to timm ViT-like models only.

    Raises:
        ValueError: an unknown backbone name.
    """
    if name == "convnet":
        net = ConvNet(width, blocks)
        return net, net.out_dim
    if is_timm(name):
        return build_timm(timm_name(name), resolution)
    from torchvision import models

    builders = {"resnet18": models.resnet18, "resnet34": models.resnet34,
                "resnet50": models.resnet50}
    if name not in builders:
        raise ValueError(
            f"model.backbone={name!r} is not one of {', '.join(BUILTIN_BACKBONES)}, "
            f"timm/<name>"
        )
    net = builders[name](weights=None)  # never downloads: random init
    if small_images:
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, dim


def projector(in_dim: int, hidden: int, out: int, layers: int = 2, bn: bool = True) -> nn.Module:
    """MLP head: (Linear → BN → ReLU) × (layers − 1) → Linear (SupCon: 2048 → 2048 → 128);
    ``bn=False``: (Linear with bias → ReLU) hidden layers, as SimCLR's original head."""
    if layers < 1:
        raise ValueError(f"model.projector_layers={layers} must be >= 1")
    mods: list[nn.Module] = []
    d = in_dim
    for _ in range(layers - 1):
        norm: list[nn.Module] = [nn.BatchNorm1d(hidden)] if bn else []
        mods += [nn.Linear(d, hidden, bias=not bn), *norm, nn.ReLU(inplace=True)]
        d = hidden
    mods.append(nn.Linear(d, out))
    return nn.Sequential(*mods)


class Encoder(nn.Module):
    """Backbone + projector (+ optional linear classifier on the backbone features).

    ``forward(x [N, 3, H, W]) -> (h [N, F], z [N, D], logits [N, C] | None)``; ``z`` is not
    normalised here (the objectives normalise).
    """

    def __init__(
        self, backbone: nn.Module, feat_dim: int, proj: nn.Module, *, num_classes: int = 0
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.feat_dim = feat_dim
        self.projector = proj
        self.classifier = nn.Linear(feat_dim, num_classes) if num_classes > 0 else None

    def add_classifier(self, num_classes: int) -> None:
        """A linear classifier ``[N, F] -> [N, num_classes]`` on the backbone features (CoNe,
        cross-entropy), drawn from the generator's state at this call."""
        self.classifier = nn.Linear(self.feat_dim, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        h = self.backbone(x)
        z = self.projector(h)
        logits = self.classifier(h) if self.classifier is not None else None
        return h, z, logits


class EncoderStateError(SimgraphError, ValueError):
    """A checkpoint's weights do not fit the model config they are loaded under (the reading
    commands re-raise it as their own error: :meth:`components.runs.run_dir.LoadedRun.encoder`)."""


def build_encoder(model: ModelConfig, resolution: int | None = None) -> Encoder:
    """``model``'s backbone and projector at their initial weights (drawn from the global
    torch generator, backbone first), without a classifier (:meth:`Encoder.add_classifier`).
    ``resolution``: the run's ``data.augment.resolution`` (a timm ViT-like backbone's position
    embeddings are sized for it; the other backbones ignore it).

    Raises:
        ValueError: an unknown backbone, or fewer than one projector layer.
    """
    backbone, dim = build_backbone(model.backbone, model.small_images, model.width,
                                   model.blocks, resolution=resolution)
    proj = projector(dim, model.projector_hidden, model.projector_dim, model.projector_layers,
                     model.projector_bn)
    return Encoder(backbone, dim, proj)


def encoder_from_state(model: ModelConfig, state_model: Mapping[str, torch.Tensor],
                       resolution: int | None = None) -> Encoder:
    """A checkpoint's backbone and projector (``state_model``: the training model's state
    dict, keys ``encoder.backbone.*`` / ``encoder.projector.*``; a classifier head and the
    objective's state are not read) as an :class:`Encoder` in eval mode on the CPU. Each part
    is loaded strictly. ``resolution``: as :func:`build_encoder`'s.

    Raises:
        EncoderStateError: the checkpoint's model does not fit ``model`` (missing, other or
            differently shaped tensors).
    """
    encoder = build_encoder(model, resolution)
    for name in ("backbone", "projector"):
        prefix = f"encoder.{name}."
        part = {k[len(prefix):]: v for k, v in state_model.items() if k.startswith(prefix)}
        try:
            getattr(encoder, name).load_state_dict(part)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise EncoderStateError(
                f"the checkpoint's {name} does not fit the run config's model section "
                f"({first[1].strip() if len(first) > 1 else first[0]})") from None
    return encoder.eval()
