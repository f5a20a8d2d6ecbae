"""The FFCV operations of each output of a :class:`~components.data.reader.ViewLoader`:
decoders and crops, flips, FFCV's per-sample colour ops (CPU), ``ToDevice`` (CUDA), and the
``PipelineSpec`` of an extra view of the stored ``image`` field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from components.config import AugmentConfig


def pipeline_ops(
    fields: Sequence[str], *, augment: AugmentConfig, train: bool, views: int,
    device: torch.device, batched_augment: bool, with_captions: bool,
    view_augments: Sequence[AugmentConfig] | None = None,
) -> dict[str, list[Any]]:
    """The FFCV operations of every output, decoder first: ``label``, ``sample_id``,
    ``caption`` (when read), ``image`` and ``image_1`` … ``image_{V-1}`` (extra views of the
    stored ``image`` field). Built without a Loader, so tests can check what each op declares.
    ``view_augments`` (training only): one augmentation per view (its view group's crop size,
    scale and ops: multi-crop), in place of ``augment`` for every view.

    For a CUDA ``device`` every output ends on the device: ``ToDevice`` copies the batch, and
    every op after it allocates there. ``ToTorchImage`` comes after ``ToDevice`` as a view
    (``channels_last=True``: ``[B, 3, H, W]`` over the copied ``[B, H, W, 3]`` buffer). With
    ``channels_last=False`` it would declare a buffer of no device, i.e. pinned *host* memory,
    and copy the CUDA batch back into it. On CPU too it is a view over FFCV's ``[B, H, W, 3]``
    buffer: the reader normalises from that layout into the batch's new NCHW tensor in one
    pass (:mod:`components.data.normalise`) instead of FFCV copying every view into NCHW
    first.
    """
    from ffcv.fields.decoders import IntDecoder, NDArrayDecoder
    from ffcv.transforms import Squeeze, ToDevice, ToTensor, ToTorchImage

    on_gpu = device.type == "cuda"
    to_dev = [ToDevice(device, non_blocking=True)] if on_gpu else []
    # [B, 1] -> [B]: only the per-sample dim. A bare Squeeze() also dropped B when a batch held
    # one image (0-d labels broke torch.cat in feature extraction, and ToDevice's copy).
    out: dict[str, list[Any]] = {
        "label": [IntDecoder(), ToTensor(), Squeeze(1), *to_dev],
        "sample_id": [IntDecoder(), ToTensor(), Squeeze(1), *to_dev],
    }
    if with_captions and "caption" in fields:
        out["caption"] = [NDArrayDecoder(), ToTensor(), *to_dev]
    n = views if train else 1
    per_view = list(view_augments) if train and view_augments is not None else [augment] * n
    if len(per_view) != n:
        raise ValueError(f"view_augments has {len(per_view)} entries for {n} views")
    for v, key in enumerate(["image"] + [f"image_{v}" for v in range(1, n)]):
        out[key] = [*_image_ops(per_view[v], train, batched_augment), ToTensor(), *to_dev,
                    ToTorchImage(channels_last=True)]
    return out


def _image_ops(a: AugmentConfig, train: bool, batched: bool) -> list[Any]:
    """Decoder (crop) and the per-sample ops FFCV runs; ``batched``: colour ops are left to
    the batched torch ops after the loader."""
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.transforms import RandomHorizontalFlip

    from components.data.augment.resize import BilinearCenterCrop, BilinearRandomResizedCrop

    size = (a.resolution, a.resolution)
    bilinear = a.interpolation == "bilinear"
    if not train:
        centre = BilinearCenterCrop if bilinear else CenterCropRGBImageDecoder
        return [centre(size, ratio=a.eval_crop_ratio)]
    ops: list[Any]
    if bilinear:  # the flip fused into the crop's resize: no copy of every view
        ops = [BilinearRandomResizedCrop(size, scale=(a.scale[0], a.scale[1]),
                                         ratio=(a.ratio[0], a.ratio[1]), flip_p=a.flip_p)]
    else:
        ops = [RandomResizedCropRGBImageDecoder(size, scale=tuple(a.scale),
                                                ratio=tuple(a.ratio))]
        if a.flip_p > 0:
            ops.append(RandomHorizontalFlip(flip_prob=a.flip_p))
    if batched or max(a.jitter_p, a.grayscale_p) == 0:
        return ops
    from components.data.augment import RandomColorJitter, RandomGrayscale

    if a.jitter_p > 0:
        ops.append(RandomColorJitter(brightness=a.brightness, contrast=a.contrast,
                                     saturation=a.saturation, hue=a.hue, p=a.jitter_p))
    if a.grayscale_p > 0:
        ops.append(RandomGrayscale(p=a.grayscale_p))
    # Blur runs as a batched torch op after the loader (ViewLoader._cpu_blur): a numba blur inside
    # the compiled pipeline stalled FFCV's worker threads at 8 px, so there is none.
    return ops


def field_spec(field: str, ops: list[Any]) -> Any:
    from ffcv.pipeline import PipelineSpec

    return PipelineSpec(field, decoder=ops[0], transforms=ops[1:])
