"""What builds an exported encoder, and a checkpoint's encoder as plain state dicts
(``simgraph export``).

:class:`Architecture`: the model config's numbers that ``model.py``'s constants and
``config.json``'s ``architecture`` record. :func:`plain_state_dicts`: an encoder's weights
(from :func:`components.models.encoders.encoder_from_state`) under the names plain modules use
(torchvision's own keys for a ResNet).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor, nn

from components.config import ModelConfig
from components.export.formats import MODEL_PY
from components.models.encoders import Encoder


@dataclasses.dataclass(frozen=True, kw_only=True)
class Architecture:
    """What builds the exported modules (``model.py``'s constants)."""

    backbone: str
    small_images: bool
    width: int
    blocks: int
    feature_dim: int
    projector_hidden: int
    projector_dim: int
    projector_layers: int
    projector_bn: bool

    @property
    def timm(self) -> bool:
        """A timm backbone (``timm/<name>``): only TorchScript and ONNX carry it."""
        return self.backbone.startswith("timm/")

    @classmethod
    def of(cls, model: ModelConfig, feature_dim: int) -> Architecture:
        return cls(backbone=model.backbone, small_images=model.small_images,
                   width=model.width, blocks=model.blocks, feature_dim=feature_dim,
                   projector_hidden=model.projector_hidden, projector_dim=model.projector_dim,
                   projector_layers=model.projector_layers, projector_bn=model.projector_bn)

    def describe(self, with_projector: bool) -> dict[str, Any]:
        """``config.json``'s ``architecture``."""
        out: dict[str, Any] = {"backbone": self.backbone, "feature_dim": self.feature_dim}
        if self.timm:
            out.update(definition=f"timm.create_model({self.backbone[len('timm/'):]!r}, "
                                  f"pretrained=False, num_classes=0), img_size=input "
                                  f"resolution for a ViT-like one")
        elif self.backbone == "convnet":
            out.update(width=self.width, blocks=self.blocks, min_side=2**self.blocks,
                       definition=f"{MODEL_PY}: ConvNet")
        else:
            out.update(small_images=self.small_images,
                       definition=f"torchvision.models.{self.backbone}(weights=None)"
                                  + (", conv1 = Conv2d(3, 64, 3, 1, 1, bias=False), maxpool = "
                                     "Identity()" if self.small_images else "")
                                  + ", fc = Identity()")
        if with_projector:
            out["projector"] = {"layers": self.projector_layers, "hidden": self.projector_hidden,
                                "out_dim": self.projector_dim, "batch_norm": self.projector_bn,
                                "definition": f"{MODEL_PY}: build_projector (nn.Sequential)",
                                "keys": projector_keys(self)}
        return out


def projector_keys(arch: Architecture) -> list[str]:
    """The projector ``nn.Sequential``'s module layout, e.g. ``['0: Linear(512, 2048, bias=False)',
    '1: BatchNorm1d(2048)', '2: ReLU', '3: Linear(2048, 128)']``."""
    out, i, d = [], 0, arch.feature_dim
    for _ in range(arch.projector_layers - 1):
        out.append(f"{i}: Linear({d}, {arch.projector_hidden}"
                   f"{', bias=False' if arch.projector_bn else ''})")
        i += 1
        if arch.projector_bn:
            out.append(f"{i}: BatchNorm1d({arch.projector_hidden})")
            i += 1
        out.append(f"{i}: ReLU")
        i += 1
        d = arch.projector_hidden
    out.append(f"{i}: Linear({d}, {arch.projector_dim})")
    return out


# ---------------------------------------------------------------------------------------------
# From a checkpoint to plain state dicts.


def plain_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module``'s state dict as a plain module of the same structure names it, detached,
    on the CPU, contiguous in NCHW order (a ``channels_last`` run's weights included) and not
    sharing storage (as safetensors requires)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}


def plain_state_dicts(encoder: Encoder) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The backbone's (torchvision's keys for a ResNet, without ``fc``; ``features.<i>.*`` for
    the ConvNet) and the projector's (``nn.Sequential``: ``<i>.*``) state dicts."""
    return plain_state_dict(encoder.backbone), plain_state_dict(encoder.projector)
