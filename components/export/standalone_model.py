"""The encoder of run RUN exported by `simgraph export`: plain PyTorch
(torchvision for the ResNets, timm for a timm backbone), no simgraph needed. See model_card.md
and config.json beside it.

    import model
    backbone, projector = model.load()  # eval mode; projector is None when not exported
    features = backbone(images)  # [N, 3, RESOLUTION, RESOLUTION] float32, RGB, normalised
"""
# This file is `simgraph export`'s model.py (components/export/model_file.py: model_source): its
# text is copied into every export with the run's name and the constants below replaced, so it
# must keep importing nothing but torch, torchvision, timm and safetensors, and stay Python 3.8-safe
# (Optional / Tuple). Everything after this comment block is exported as it is.

import os
from typing import Optional, Tuple

import torch
from torch import nn

BACKBONE = "convnet"
SMALL_IMAGES = True  # ResNets: 3x3 stride-1 stem, no max-pool
WIDTH = 32  # ConvNet only
BLOCKS = 4  # ConvNet only
FEATURE_DIM = 256
PROJECTOR_HIDDEN = 512
PROJECTOR_DIM = 128
PROJECTOR_LAYERS = 2
PROJECTOR_BN = True
TIMM_IMG_SIZE = None  # timm backbones built with img_size (ViT-like: position embeddings)
RESOLUTION = 28
MEAN = [0.5, 0.5, 0.5]  # on RGB values in [0, 1]
STD = [0.5, 0.5, 0.5]
BACKBONE_FILE = "model.safetensors"
PROJECTOR_FILE = "projector.safetensors"
HERE = os.path.dirname(os.path.abspath(__file__))


class ConvNet(nn.Module):
    """blocks x (3x3 conv -> BN -> ReLU -> 2x2 max-pool), width * 2^i channels (at most
    8 * width), then global average pooling: [N, 3, H, W] -> [N, out_dim]."""

    def __init__(self, width: int = WIDTH, blocks: int = BLOCKS) -> None:
        super().__init__()
        layers = []
        c_in = 3
        for i in range(blocks):
            c_out = width * 2 ** min(i, 3)
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = c_in
        self.min_side = 2 ** blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] < self.min_side or x.shape[-1] < self.min_side:
            raise ValueError("this ConvNet needs images of at least " + str(self.min_side)
                             + " px on each side")
        return self.features(x)


def resnet(name: str = BACKBONE, small_images: bool = SMALL_IMAGES) -> nn.Module:
    """torchvision's ResNet without its classifier (fc = Identity), optionally with the
    small-image stem."""
    import torchvision

    net = getattr(torchvision.models, name)(weights=None)
    if small_images:
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def timm_model(name: str = BACKBONE, img_size: Optional[int] = TIMM_IMG_SIZE) -> nn.Module:
    """timm's model "timm/<name>" as the run built it: random init, no classifier
    (num_classes=0: global pooling on), img_size for a ViT-like one."""
    import timm

    arch = name[len("timm/"):]
    if img_size is None:
        return timm.create_model(arch, pretrained=False, num_classes=0)
    return timm.create_model(arch, pretrained=False, num_classes=0, img_size=img_size)


def build() -> nn.Module:
    """The backbone, randomly initialised: load model.safetensors into it."""
    if BACKBONE == "convnet":
        return ConvNet(WIDTH, BLOCKS)
    if BACKBONE.startswith("timm/"):
        return timm_model(BACKBONE, TIMM_IMG_SIZE)
    return resnet(BACKBONE, SMALL_IMAGES)


def build_projector(in_dim: int = FEATURE_DIM, hidden: int = PROJECTOR_HIDDEN,
                    out: int = PROJECTOR_DIM, layers: int = PROJECTOR_LAYERS,
                    bn: bool = PROJECTOR_BN) -> nn.Sequential:
    """The projector MLP, randomly initialised: (Linear -> [BatchNorm1d] -> ReLU) x
    (layers - 1) -> Linear. Load projector.safetensors into it."""
    mods: "list[nn.Module]" = []  # (a local annotation: never evaluated, 3.8-safe)
    d = in_dim
    for _ in range(layers - 1):
        mods.append(nn.Linear(d, hidden, bias=not bn))
        if bn:
            mods.append(nn.BatchNorm1d(hidden))
        mods.append(nn.ReLU(inplace=True))
        d = hidden
    mods.append(nn.Linear(d, out))
    return nn.Sequential(*mods)


class WithProjector(nn.Module):
    """images -> (features [N, FEATURE_DIM], projection [N, PROJECTOR_DIM])."""

    def __init__(self, backbone: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.backbone(x)
        return h, self.projector(h)


def load(directory: str = HERE) -> Tuple[nn.Module, Optional[nn.Module]]:
    """The exported backbone and projector (None when not exported), weights loaded, in eval
    mode. Needs the safetensors package."""
    from safetensors.torch import load_file

    backbone = build()
    backbone.load_state_dict(load_file(os.path.join(directory, BACKBONE_FILE)))
    projector = None
    path = os.path.join(directory, PROJECTOR_FILE)
    if os.path.exists(path):
        projector = build_projector()
        projector.load_state_dict(load_file(path))
        projector.eval()
    return backbone.eval(), projector
