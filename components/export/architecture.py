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
from components.config.backbones import is_timm, timm_name, timm_probe
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
    # A timm backbone built with ``img_size`` (a ViT-like one: its position embeddings are
    # sized for the run's resolution): that size; None for the others.
    timm_img_size: int | None = None

    @property
    def timm(self) -> bool:
        """A timm backbone (``timm/<name>``): its weights are timm's own state dict."""
        return is_timm(self.backbone)

    @property
    def timm_model_name(self) -> str:
        """The timm architecture name of a timm backbone (``timm/<name>`` → ``<name>``)."""
        return timm_name(self.backbone)

    @classmethod
    def of(cls, model: ModelConfig, feature_dim: int, resolution: int) -> Architecture:
        """The architecture of ``model``'s encoder at the run's ``resolution`` (what a timm
        ViT-like backbone was built for)."""
        img_size = None
        if is_timm(model.backbone) and timm_probe(timm_name(model.backbone),
                                                  resolution).takes_img_size:
            img_size = resolution
        return cls(backbone=model.backbone, small_images=model.small_images,
                   width=model.width, blocks=model.blocks, feature_dim=feature_dim,
                   projector_hidden=model.projector_hidden, projector_dim=model.projector_dim,
                   projector_layers=model.projector_layers, projector_bn=model.projector_bn,
                   timm_img_size=img_size)

    def timm_kwargs(self) -> dict[str, Any]:
        """``timm.create_model``'s arguments besides the name that rebuild the run's backbone
        (weights aside): ``num_classes=0`` and, for a ViT-like one, ``img_size``."""
        return {"num_classes": 0,
                **({} if self.timm_img_size is None else {"img_size": self.timm_img_size})}

    def describe(self, with_projector: bool) -> dict[str, Any]:
        """``config.json``'s ``architecture`` (``simgraph_architecture`` for a timm backbone's
        safetensors export, whose ``architecture`` is timm's: ``export_dir.timm_section``)."""
        out: dict[str, Any] = {"backbone": self.backbone, "feature_dim": self.feature_dim}
        if self.timm:
            args = "".join(f", {k}={v!r}" for k, v in self.timm_kwargs().items())
            out.update(definition=f"timm.create_model({self.timm_model_name!r}, "
                                  f"pretrained=False{args})")
            if self.timm_img_size is not None:
                out["img_size"] = self.timm_img_size
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
    the ConvNet; a timm model's own keys, those of ``timm.create_model(name, num_classes=0)``:
    the encoder holds the timm module itself, unwrapped) and the projector's
    (``nn.Sequential``: ``<i>.*``) state dicts."""
    return plain_state_dict(encoder.backbone), plain_state_dict(encoder.projector)
