"""Backbone names a config may give (``model.backbone``) and what the config checks need to know
about a timm one before anything runs.

* :data:`BUILTIN_BACKBONES`: simgraph's ConvNet and the torchvision ResNets.
* ``timm/<name>``: any architecture ``timm.list_models()`` knows, built by
  :func:`components.models.encoders.build_backbone` with ``timm.create_model(name,
  pretrained=False, num_classes=0)`` (no classifier, global pooling on; never downloads).

timm is imported only when a config names a timm backbone (its import takes seconds).
:func:`timm_probe` builds the model on PyTorch's ``meta`` device and runs it on a meta batch
(shapes only, no memory, no weights drawn: 0.05–0.8 s for ResNet-10t … CaiT-XXS on this
project's CPU box) to learn its patch size, whether it takes ``img_size`` and its feature
width, and that it runs at the config's resolution, without building the real model.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any

from components.config.checks import ConfigError
from components.errors import clip

BUILTIN_BACKBONES: tuple[str, ...] = ("convnet", "resnet18", "resnet34", "resnet50")
TIMM_PREFIX = "timm/"


def is_timm(backbone: str) -> bool:
    """``backbone`` names a timm architecture (``timm/<name>``)."""
    return backbone.startswith(TIMM_PREFIX)


def timm_name(backbone: str) -> str:
    """The timm architecture name of ``timm/<name>``."""
    return backbone[len(TIMM_PREFIX):]


@functools.cache
def _timm_models() -> frozenset[str]:
    import timm

    return frozenset(timm.list_models())


def check_backbone(backbone: object) -> None:
    """``backbone`` is one of :data:`BUILTIN_BACKBONES` or ``timm/`` + a name timm knows.

    Raises:
        ConfigError: one line naming the value and what is allowed (close timm names, by
            :mod:`difflib`, for a misspelt one).
    """
    if not isinstance(backbone, str):
        raise ConfigError(f"model.backbone={clip(backbone)} is not allowed: give a string")
    if backbone in BUILTIN_BACKBONES:
        return
    if not is_timm(backbone):
        raise ConfigError(
            f"model.backbone={clip(backbone)} is not allowed: choose one of "
            f"{', '.join(BUILTIN_BACKBONES)}, or timm/<name> for a timm architecture "
            f"(e.g. timm/resnet50, timm/vit_small_patch16_224)")
    name, known = timm_name(backbone), _timm_models()
    if name in known:
        return
    close = difflib.get_close_matches(name, sorted(known), n=5, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise ConfigError(f"model.backbone={clip(backbone)} is not a timm model; {hint} "
                      f"(timm.list_models)")


@dataclasses.dataclass(frozen=True)
class TimmInfo:
    """What a timm architecture is, from a shape-only build and forward at the run's size."""

    patch_size: tuple[int, int] | None  # ViT-like (a ``patch_embed`` with a patch size)
    takes_img_size: bool  # built with ``img_size=resolution`` (ViTs and other fixed-size nets)
    num_features: int


def timm_kwargs(resolution: int | None, takes_img_size: bool) -> dict[str, Any]:
    """``timm.create_model``'s arguments for a backbone: random init (never downloads), no
    classifier, and, for a model that takes it (a ViT: its position embeddings), ``img_size``
    = the crops' side."""
    kwargs: dict[str, Any] = {"pretrained": False, "num_classes": 0}
    if takes_img_size and resolution is not None:
        kwargs["img_size"] = resolution
    return kwargs


def num_features(net: object) -> int:
    """A timm model's feature width (``num_features``: the pooled features' size once the
    classifier is removed)."""
    value = getattr(net, "num_features", None)
    if not isinstance(value, int):
        raise TypeError(f"{type(net).__name__} has no integer num_features: not a timm model")
    return value


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:160]


@functools.cache
def timm_probe(name: str, resolution: int) -> TimmInfo:
    """timm's ``name`` built on the ``meta`` device (shapes only: no memory, no weights drawn)
    with ``img_size=resolution`` where its constructor takes it, and run on a meta batch of
    ``resolution``-px images — what the real build and forward will do, at no cost.

    Raises:
        ConfigError: a ViT-like model's patch size does not divide ``resolution``, or the model
            cannot be built or run at that size (one line naming the values and the fix).
    """
    import timm
    import torch

    where = f"timm/{name} at data.augment.resolution={resolution}"
    with torch.device("meta"):
        takes = True
        try:
            net = timm.create_model(name, **timm_kwargs(resolution, True))
        except TypeError as e:
            if "img_size" not in str(e):
                raise ConfigError(f"{where} cannot be built ({_first_line(e)})") from None
            takes = False
            net = timm.create_model(name, **timm_kwargs(None, False))
        except Exception as e:  # noqa: BLE001 - timm's own checks of the size
            raise ConfigError(f"{where} cannot be built ({_first_line(e)}); choose a "
                              f"resolution the architecture accepts") from None
        raw = getattr(getattr(net, "patch_embed", None), "patch_size", None)
        patch = ((int(raw), int(raw)) if isinstance(raw, int)
                 else (int(raw[0]), int(raw[1])) if isinstance(raw, tuple | list) else None)
        if patch is not None and (resolution % patch[0] or resolution % patch[1]):
            side = patch[0] if patch[0] == patch[1] else patch
            step = max(patch)  # every timm ViT has square patches
            near = [m for m in ((resolution // step) * step, (resolution // step + 1) * step)
                    if m]
            raise ConfigError(
                f"data.augment.resolution={resolution} is not a multiple of timm/{name}'s "
                f"patch size {side}: set the resolution to a multiple of it (e.g. "
                f"{' or '.join(map(str, near))})")
        try:
            net(torch.empty(2, 3, resolution, resolution))
        except Exception as e:  # noqa: BLE001 - the architecture's own limits
            raise ConfigError(f"{where} cannot run on {resolution}x{resolution} crops "
                              f"({_first_line(e)}); choose a resolution the architecture "
                              f"accepts") from None
    return TimmInfo(patch, takes, num_features(net))
