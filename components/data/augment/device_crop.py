"""Random resized crops made on the device: the loader decodes, the GPU crops.

On a GPU node the CPU cores feed the GPU, and a 224-px view costs them a half JPEG decode
(two views share one, :class:`~components.data.augment.resize.BilinearRandomResizedCropViews`)
plus a bilinear crop that costs as much again or more (docs/benchmarks.md, "224-px views
through the reader"). Here the loader's work per image is the decode, one copy of the decoded
rows into a fixed-size slot, and each view's crop and flip *draw*; the crops themselves are
two batched matrix products on the device (:func:`crop_views`) — the same separable
antialiased triangle filter as the CPU kernel (:func:`~components.data.augment.resize.
triangle_weights`), in float32, rounded to uint8 as the CPU kernel's output is (within one
grey level of it: its fixed point rounds each pass).

One FFCV output per run of views, ``[B, S]`` uint8 (:class:`DecodeForDeviceCrops`): each
image's decoded rows at a stride of the file's widest image (``[Hmax, Wmax, 3]``, rows and
columns past the image's own size left as they were), padded to a multiple of 4 bytes, then
int32 little-endian ``height, width`` and per view ``top, left, crop height, crop width,
flipped`` (:func:`slot_bytes`). The draws are FFCV's: its crop generator (so the same
distribution as the CPU path) and a flip draw after each view's crop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.state import State

FIELDS_PER_VIEW = 5  # top, left, crop height, crop width, flipped


def pixel_bytes(max_h: int, max_w: int) -> int:
    """Bytes of a slot's image part: ``max_h * max_w * 3`` rounded up to a multiple of 4 (the
    int32 trailer after it is then aligned)."""
    return (max_h * max_w * 3 + 3) // 4 * 4


def slot_bytes(max_h: int, max_w: int, views: int) -> int:
    """Bytes per image of :class:`DecodeForDeviceCrops`' output."""
    return pixel_bytes(max_h, max_w) + 4 * (2 + FIELDS_PER_VIEW * views)


def _put(out: np.ndarray, at: np.int64, value: np.int64) -> None:
    """``value`` (0 ≤ value < 2**31) as int32 little-endian at ``out[at:at + 4]``. Compiled
    into each decoder's code by FFCV's ``Compiler`` (a dispatcher of its own per loader, as
    FFCV's own helpers are: one shared by loaders whose threads compile at once lost an
    overload — numba's ``KeyError`` in ``nopython_signatures``)."""
    v = np.int64(value)
    out[at] = v & 255
    out[at + 1] = (v >> 8) & 255
    out[at + 2] = (v >> 16) & 255
    out[at + 3] = (v >> 24) & 255


class DecodeForDeviceCrops(RandomResizedCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV decoder: each image decoded once into its slot, with ``views`` crop and flip
    draws for :func:`crop_views` (module docstring: the slot's layout). ``output_size`` is
    the views' size, used by :func:`crop_views` (kept here so one object describes the run).

    Raises:
        ValueError: ``views`` < 1, or ``flip_p`` outside [0, 1].
    """

    def __init__(self, output_size: tuple[int, int], views: int,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float = 0.0) -> None:
        super().__init__(output_size, scale=scale, ratio=ratio)
        if views < 1:
            raise ValueError(f"views={views!r} is not allowed: give at least 1 view")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p={flip_p!r} is not allowed: give a probability in [0, 1]")
        self.views, self.flip_p = int(views), float(flip_p)
        self.max_hw = (0, 0)

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, Any]:
        state, (_, temp) = super().declare_state_and_memory(previous_state)
        self.max_hw = (int(self.max_height), int(self.max_width))
        shape = (slot_bytes(*self.max_hw, self.views),)
        return replace(state, shape=shape), (AllocationQuery(shape, np.dtype("<u1")), temp)

    def generate_code(self) -> Callable[..., Any]:
        from ffcv.fields.rgb_image import IMAGE_MODES
        from ffcv.libffcv import imdecode
        from ffcv.pipeline.compiler import Compiler

        jpg = IMAGE_MODES["jpg"]
        mem_read = self.memory_read
        my_range = Compiler.get_iterator()
        imdecode_c = Compiler.compile(imdecode)
        get_crop_c = Compiler.compile(self.get_crop_generator)
        put = Compiler.compile(_put)
        scale, ratio = np.array(self.scale), np.array(self.ratio)
        views, flip_p = self.views, self.flip_p
        stride = np.int64(self.max_hw[1] * 3)
        meta = np.int64(pixel_bytes(*self.max_hw))

        def decode(batch_indices: Any, my_storage: Any, metadata: Any,
                   storage_state: Any) -> Any:
            destination, temp_storage = my_storage
            for dst_ix in my_range(len(batch_indices)):
                field = metadata[batch_indices[dst_ix]]
                image_data = mem_read(field["data_ptr"], storage_state)
                height, width = np.uint32(field["height"]), np.uint32(field["width"])
                out = destination[dst_ix]
                row = width * 3
                if field["mode"] == jpg:
                    src = temp_storage[dst_ix]
                    imdecode_c(image_data, src, height, width, height, width, 0, 0, 1, 1,
                               False, False)
                else:
                    src = image_data
                for r in range(height):
                    out[r * stride:r * stride + row] = src[r * row:(r + 1) * row]
                put(out, meta, np.int64(height))
                put(out, meta + 4, np.int64(width))
                for v in range(views):
                    i, j, h, w = get_crop_c(height, width, scale, ratio)
                    flip = 1 if flip_p > 0 and np.random.rand() < flip_p else 0
                    at = meta + np.int64(8 + 4 * FIELDS_PER_VIEW * v)
                    put(out, at, np.int64(i))
                    put(out, at + 4, np.int64(j))
                    put(out, at + 8, np.int64(h))
                    put(out, at + 12, np.int64(w))
                    put(out, at + 16, np.int64(flip))
            return destination[:len(batch_indices)]

        decode.is_parallel = True  # type: ignore[attr-defined]
        return decode


def _triangle(start: torch.Tensor, length: torch.Tensor, n_out: int, n_max: int
              ) -> torch.Tensor:
    """``[N, n_out, n_max]`` float32: row ``o`` of item ``n`` holds the weights output ``o``
    gives to input ``start + k`` of a crop of ``length`` (zero outside it) — the
    antialiased triangle filter of :func:`~components.data.augment.resize.triangle_weights`
    (half-pixel centres, support widened by the scale when shrinking, renormalised at the
    crop's borders)."""
    dev = start.device
    scale = length.to(torch.float64) / n_out  # [N]
    support = scale.clamp(min=1.0)
    o = torch.arange(n_out, device=dev, dtype=torch.float64)
    centre = (o[None] + 0.5) * scale[:, None]  # [N, n_out]
    lo = torch.floor(centre - support[:, None] + 0.5).clamp(min=0)
    hi = torch.minimum(torch.floor(centre + support[:, None] + 0.5),
                       length[:, None].to(torch.float64))
    # input index relative to the crop's first: [N, 1, n_max]
    k = (torch.arange(n_max, device=dev, dtype=torch.float64)[None, None]
         - start[:, None, None].to(torch.float64))
    w = (1.0 - ((k - centre[..., None] + 0.5) / support[:, None, None]).abs()).clamp(min=0.0)
    w = w * ((k >= lo[..., None]) & (k < hi[..., None]))
    return (w / w.sum(-1, keepdim=True).clamp(min=1e-12)).to(torch.float32)


def crop_views(slots: torch.Tensor, *, views: int, size: tuple[int, int],
               max_hw: tuple[int, int]) -> torch.Tensor:
    """The ``views`` crops of each image of a :class:`DecodeForDeviceCrops` output ``slots``
    ``[B, S]`` uint8 (on any device), resized to ``size`` and flipped as drawn: ``[B, views,
    3, H, W]`` uint8 on ``slots``' device (what the CPU path's crops are, as NCHW).

    Raises:
        ValueError: ``slots`` is not ``[B, slot_bytes(*max_hw, views)]`` uint8.
    """
    b = slots.shape[0]
    want = slot_bytes(*max_hw, views)
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.shape[1] != want:
        raise ValueError(f"slots of shape {tuple(slots.shape)} and dtype {slots.dtype}: "
                         f"expected [B, {want}] uint8 for {views} views of images up to "
                         f"{max_hw[0]}x{max_hw[1]}")
    (mh, mw), (oh, ow) = max_hw, size
    at = pixel_bytes(mh, mw)
    meta = slots[:, at:].contiguous().view(torch.int32).to(torch.int64)  # [B, 2 + 5V]
    box = meta[:, 2:].reshape(b * views, FIELDS_PER_VIEW)
    top, left, ch, cw, flip = box.unbind(1)
    wy = _triangle(top, ch, oh, mh).view(b, views, 1, oh, mh)
    wx = _triangle(left, cw, ow, mw)
    wx = torch.where(flip.bool()[:, None, None], wx.flip(1), wx).view(b, views, 1, ow, mw)
    image = slots[:, :mh * mw * 3].view(b, 1, mh, mw, 3).permute(0, 1, 4, 2, 3).float()
    rows = torch.matmul(wy, image)  # [B, V, 3, oh, mw]
    out = torch.matmul(rows, wx.transpose(-1, -2))  # [B, V, 3, oh, ow]
    return out.round_().clamp_(0, 255).to(torch.uint8)
