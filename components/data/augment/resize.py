"""Crop-and-resize decoders for FFCV with torchvision's interpolation (bilinear, antialiased).

FFCV 1.0.2's ``RandomResizedCropRGBImageDecoder`` and ``CenterCropRGBImageDecoder`` resize
every crop with OpenCV's ``INTER_AREA`` (hard-coded in ``libffcv``). Shrinking, that is an
area average; *enlarging* — a 0.5–1 scale crop of a 28 px image brought back to 28 px — it
is close to nearest-neighbour: blocky views. torchvision's ``RandomResizedCrop`` (and every
paper's recipe) enlarges bilinearly. On Fashion-MNIST SimCLR (12 seeds, docs/results.md) a
plain PyTorch loop given ``INTER_AREA`` crops gains what the FFCV pipeline gains, and 15 %
less in kNN@20 than with bilinear crops — the one parity gap of issue 13.

:class:`BilinearRandomResizedCrop` / :class:`BilinearCenterCrop` are FFCV's decoders (same
crop parameters, same random stream, JPEG and raw storage, variable image sizes) with the
resize replaced by :func:`resize_crop_bilinear`: separable, antialiased bilinear in float32
(PIL's / ``torch.nn.functional.interpolate(antialias=True)``'s triangle filter, support
widened by the scale when shrinking, weights renormalised at the borders), rounded to uint8.
It agrees with ``torchvision.transforms.v2.functional.resized_crop(..., antialias=True)`` on
uint8 images to within 1 grey level (torch's uint8 kernel uses fixed-point weights).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from numba import njit


@njit(cache=True, nogil=True)
def _weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: first input index, tap count, and [n_out, taps] float32 weights of
    the antialiased triangle filter (half-pixel centres)."""
    scale = n_in / n_out
    support = max(scale, 1.0)  # bilinear support 1, widened when shrinking
    taps = int(np.ceil(support)) * 2 + 1
    first = np.zeros(n_out, np.int64)
    count = np.zeros(n_out, np.int64)
    w = np.zeros((n_out, taps), np.float32)
    inv = 1.0 / support
    for o in range(n_out):
        centre = (o + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), n_in)
        total = 0.0
        for k in range(hi - lo):
            x = (k + lo - centre + 0.5) * inv
            v = max(0.0, 1.0 - abs(x))
            w[o, k] = v
            total += v
        if total > 0.0:
            for k in range(hi - lo):
                w[o, k] /= total
        first[o], count[o] = lo, hi - lo
    return first, count, w


@njit(cache=True, nogil=True)
def _resize_bilinear(src: np.ndarray, top: int, bottom: int, left: int, right: int,
                     dst: np.ndarray) -> None:
    """``src[top:bottom, left:right]`` (uint8 [H, W, 3]) resized into ``dst`` (uint8
    [h, w, 3]): horizontal pass, then vertical, in float32; rounded, clamped."""
    h_in, w_in = bottom - top, right - left
    h_out, w_out = dst.shape[0], dst.shape[1]
    fx, cx, wx = _weights(w_in, w_out)
    fy, cy, wy = _weights(h_in, h_out)
    rows = np.zeros((h_in, w_out, 3), np.float32)
    for r in range(h_in):
        for o in range(w_out):
            for c in range(3):
                acc = np.float32(0.0)
                for k in range(cx[o]):
                    acc += wx[o, k] * np.float32(src[top + r, left + fx[o] + k, c])
                rows[r, o, c] = acc
    for o in range(h_out):
        for x in range(w_out):
            for c in range(3):
                acc = np.float32(0.0)
                for k in range(cy[o]):
                    acc += wy[o, k] * rows[fy[o] + k, x, c]
                v = np.floor(acc + np.float32(0.5))
                dst[o, x, c] = np.uint8(min(max(v, 0.0), 255.0))


def resize_crop_bilinear(source: np.ndarray, start_row: int, end_row: int, start_col: int,
                         end_col: int, destination: np.ndarray) -> None:
    """``libffcv.resize_crop``'s signature, bilinear with antialias (FFCV compiles this
    wrapper into its pipeline; the kernel itself is always numba-compiled)."""
    _resize_bilinear(source, start_row, end_row, start_col, end_col, destination)


def _with_bilinear_resize(generate: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """Run FFCV's ``generate_code`` with its module-level ``resize_crop`` (which it compiles
    into the decode function when the code is generated) replaced by ours."""
    import ffcv.fields.rgb_image as rgb_image

    original = rgb_image.resize_crop
    rgb_image.resize_crop = resize_crop_bilinear
    try:
        return generate()
    finally:
        rgb_image.resize_crop = original


class BilinearRandomResizedCrop(RandomResizedCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV's random resized crop decoder (its crop parameters and random stream), resized
    bilinearly with antialias as torchvision's ``RandomResizedCrop``."""

    def generate_code(self) -> Callable[..., Any]:
        return _with_bilinear_resize(super().generate_code)


class BilinearCenterCrop(CenterCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV's centre crop decoder, resized bilinearly with antialias as torchvision's
    ``Resize``."""

    def generate_code(self) -> Callable[..., Any]:
        return _with_bilinear_resize(super().generate_code)
