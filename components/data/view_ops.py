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
    view_augments: Sequence[AugmentConfig] | None = None, device_crops: bool = False,
) -> dict[str, list[Any]]:
    """The FFCV operations of every output, decoder first: ``label``, ``sample_id``,
    ``caption`` (when read), ``image`` and ``image_{v}`` (extra pipelines of the stored
    ``image`` field, named by their first view ``v``). Built without a Loader, so tests can
    check what each op declares. ``view_augments`` (training only): one augmentation per view
    (its view group's crop size, scale and ops: multi-crop), in place of ``augment`` for every
    view.

    Consecutive training views of one augmentation whose FFCV pipeline is the bilinear crop
    alone (colour ops batched after the loader, or none) are one output ``[B, V, H, W, 3]``
    cropped from **one decode** per image
    (:class:`~components.data.augment.resize.BilinearRandomResizedCropViews`); otherwise each
    view is an output ``[B, 3, H, W]`` of its own. :func:`view_slots` says which is which.
    ``device_crops`` (with ``batched_augment``): such runs, of one view or more, are instead
    decoded into slots ``[B, S]`` for the crops to be made on ``device`` after the loader
    (:mod:`~components.data.augment.device_crop`: the loader decodes and draws, the device
    crops).

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

    if device_crops and not batched_augment:
        raise ValueError("device_crops needs batched_augment: FFCV's per-sample colour ops "
                         "come after a crop, which is then made after the loader")
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
    v = 0
    while v < n:
        key = "image" if v == 0 else f"image_{v}"
        a = per_view[v]
        run = 1  # consecutive views of one augmentation: one decode for all of them
        while v + run < n and per_view[v + run] == a:
            run += 1
        if device_crops and _crops_only(a, train, batched_augment):
            # [B, S] slots: each image decoded once, its views' crop and flip draws
            out[key] = [_device_crop_decode(a, run), ToTensor(), *to_dev]
            v += run
        elif run > 1 and _crops_only(a, train, batched_augment):
            # [B, run, H, W, 3]: the reader takes view k as [:, k] (no ToTorchImage: 4-d only)
            out[key] = [_multi_view_crop(a, run), ToTensor(), *to_dev]
            v += run
        else:
            out[key] = [*_image_ops(a, train, batched_augment), ToTensor(), *to_dev,
                        ToTorchImage(channels_last=True)]
            v += 1
    return out


def view_slots(ops: dict[str, list[Any]]) -> list[tuple[str, int | None]]:
    """Where each view is among :func:`pipeline_ops`'s outputs, in view order: ``(key,
    None)`` for a ``[B, 3, H, W]`` output of one view, ``(key, k)`` for view ``k`` of an
    output decoded once for ``V`` views (``[B, V, H, W, 3]``, or the device crops' slots that
    become ``[B, V, 3, H, W]`` after the loader)."""
    from components.data.augment.device_crop import DecodeForDeviceCrops
    from components.data.augment.resize import BilinearRandomResizedCropViews

    slots: list[tuple[str, int | None]] = []
    for key, key_ops in ops.items():
        if not key.startswith("image"):
            continue
        if isinstance(key_ops[0], (BilinearRandomResizedCropViews, DecodeForDeviceCrops)):
            slots.extend((key, k) for k in range(key_ops[0].views))
        else:
            slots.append((key, None))
    return slots


def _crops_only(a: AugmentConfig, train: bool, batched: bool) -> bool:
    """Whether a training view's FFCV pipeline is its bilinear crop (and flip) alone — no
    per-sample colour op after it — so several views can be cropped from one decode."""
    return train and a.interpolation == "bilinear" and (
        batched or max(a.jitter_p, a.grayscale_p) == 0)


def _device_crop_decode(a: AugmentConfig, views: int) -> Any:
    from components.data.augment.device_crop import DecodeForDeviceCrops

    return DecodeForDeviceCrops((a.resolution, a.resolution), views,
                                scale=(a.scale[0], a.scale[1]), ratio=(a.ratio[0], a.ratio[1]),
                                flip_p=a.flip_p)


def _multi_view_crop(a: AugmentConfig, views: int) -> Any:
    from components.data.augment.resize import BilinearRandomResizedCropViews

    return BilinearRandomResizedCropViews((a.resolution, a.resolution), views,
                                          scale=(a.scale[0], a.scale[1]),
                                          ratio=(a.ratio[0], a.ratio[1]), flip_p=a.flip_p)


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
