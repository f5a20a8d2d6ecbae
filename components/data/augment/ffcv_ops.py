"""FFCV operations (CPU, numba) for SimCLR's colour jitter and grayscale; see the package
docstring for the semantics they share with the batched torch versions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.compiler import Compiler
from ffcv.pipeline.operation import Operation
from ffcv.pipeline.state import State
from numba import njit

from components.data.augment.common import (
    _INV255,
    _LB,
    _LG,
    _LR,
    _ONE_SIXTH,
    _TO_U8,
    _check_hue,
    _check_magnitude,
    _check_probability,
    _factor_range,
)

# --------------------------------------------------------------------------------------------
# numba per-image kernels: uint8 [H, W, 3] in, uint8 [H, W, 3] out (in place allowed)
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _clamp_trunc_u8(v: Any) -> np.uint8:
    """float32 → uint8 like torch's ``clamp_(0, 255).to(uint8)`` (truncation toward 0)."""
    if v < 0.0:
        v = 0.0
    elif v > 255.0:
        v = 255.0
    return np.uint8(v)


@njit(cache=True, nogil=True, inline="always")
def _luma(r: Any, g: Any, b: Any) -> np.float32:
    """float32 luma ``0.2989 r + 0.587 g + 0.114 b`` in torchvision's evaluation order."""
    return np.float32(r) * _LR + np.float32(g) * _LG + np.float32(b) * _LB


@njit(cache=True, nogil=True, inline="always")
def _fma_blend(x: Any, f: np.float32, other: np.float32, a: np.float32) -> np.float32:
    """float32 ``x * f + other * a`` with the second product fused (one rounding).

    torch evaluates ``image.mul(f).add_(other, alpha=a)`` with a vectorised fused
    multiply-add; the float32 product of two float32 values is exact in float64, so the sum
    in float64 rounded once to float32 reproduces it.
    """
    xf = np.float32(x) * f
    return np.float32(np.float64(xf) + np.float64(other) * np.float64(a))


@njit(cache=True, nogil=True)
def _adjust_brightness(img_in: np.ndarray, img_out: np.ndarray, factor: float) -> None:
    """``img_out = clamp(img_in * factor)``: torchvision ``adjust_brightness`` on uint8.

    Args:
        img_in: uint8 ``[H, W, C]`` image.
        img_out: uint8 ``[H, W, C]`` output (may be ``img_in``).
        factor: brightness factor ≥ 0 (1 = identity).
    """
    f = np.float32(factor)
    h, w, c = img_in.shape
    for y in range(h):
        for x in range(w):
            for ch in range(c):
                img_out[y, x, ch] = _clamp_trunc_u8(np.float32(img_in[y, x, ch]) * f)


@njit(cache=True, nogil=True)
def _adjust_contrast(img_in: np.ndarray, img_out: np.ndarray, factor: float) -> None:
    """Blend with the mean of the (floored) grayscale image: torchvision ``adjust_contrast``.

    Args:
        img_in: uint8 ``[H, W, 3]`` image.
        img_out: uint8 ``[H, W, 3]`` output (may be ``img_in``).
        factor: contrast factor ≥ 0 (0 = uniform grey at the mean, 1 = identity).
    """
    h, w, c = img_in.shape
    if h * w == 0:
        return
    total = 0.0
    for y in range(h):
        for x in range(w):
            total += np.floor(_luma(img_in[y, x, 0], img_in[y, x, 1], img_in[y, x, 2]))
    mean = np.float32(total / (h * w))
    f = np.float32(factor)
    a = np.float32(1.0 - factor)
    for y in range(h):
        for x in range(w):
            for ch in range(c):
                img_out[y, x, ch] = _clamp_trunc_u8(_fma_blend(img_in[y, x, ch], f, mean, a))


@njit(cache=True, nogil=True)
def _adjust_saturation(img_in: np.ndarray, img_out: np.ndarray, factor: float) -> None:
    """Blend each pixel with its (floored) grayscale value: torchvision ``adjust_saturation``.

    Args:
        img_in: uint8 ``[H, W, 3]`` image.
        img_out: uint8 ``[H, W, 3]`` output (may be ``img_in``).
        factor: saturation factor ≥ 0 (0 = grayscale, 1 = identity).
    """
    h, w, c = img_in.shape
    f = np.float32(factor)
    a = np.float32(1.0 - factor)
    for y in range(h):
        for x in range(w):
            gray = np.floor(_luma(img_in[y, x, 0], img_in[y, x, 1], img_in[y, x, 2]))
            for ch in range(c):
                img_out[y, x, ch] = _clamp_trunc_u8(_fma_blend(img_in[y, x, ch], f, gray, a))


@njit(cache=True, nogil=True)
def _adjust_hue(img_in: np.ndarray, img_out: np.ndarray, shift: float) -> None:
    """Rotate the hue by ``shift`` turns in HSV: torchvision ``adjust_hue`` (float32 HSV).

    The uint8 image is scaled by 1/255, converted to HSV with torchvision's formulas (which
    follow Pillow), ``H ← (H + shift) mod 1``, converted back and scaled by 255.999 with
    truncation (torchvision's ``to_dtype(..., scale=True)``).

    Args:
        img_in: uint8 ``[H, W, 3]`` image.
        img_out: uint8 ``[H, W, 3]`` output (may be ``img_in``).
        shift: hue shift in [-0.5, 0.5] (fraction of a full turn).
    """
    h, w, _ = img_in.shape
    sh = np.float32(shift)
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for y in range(h):
        for x in range(w):
            r = np.float32(img_in[y, x, 0]) * _INV255
            g = np.float32(img_in[y, x, 1]) * _INV255
            b = np.float32(img_in[y, x, 2]) * _INV255
            maxc = max(r, max(g, b))
            minc = min(r, min(g, b))
            cr = maxc - minc
            if cr == zero:
                hue = zero
                s = zero
            else:
                s = cr / maxc
                rc = (maxc - r) / cr
                gc = (maxc - g) / cr
                bc = (maxc - b) / cr
                if maxc == r:
                    hue = bc - gc
                elif maxc == g:
                    hue = np.float32(2.0) + rc - bc
                else:
                    hue = np.float32(4.0) + gc - rc
                hue = (hue * _ONE_SIXTH + one) % one
            hue = (hue + sh) % one
            v = maxc
            h6 = hue * np.float32(6.0)
            i = np.floor(h6)
            fr = h6 - i
            sxf = s * fr
            q = min(max((one - sxf) * v, zero), one)
            t = min(max((sxf + (one - s)) * v, zero), one)
            p = min(max((one - s) * v, zero), one)
            sector = int(i) % 6
            if sector == 0:
                ro, go, bo = v, t, p
            elif sector == 1:
                ro, go, bo = q, v, p
            elif sector == 2:
                ro, go, bo = p, v, t
            elif sector == 3:
                ro, go, bo = p, q, v
            elif sector == 4:
                ro, go, bo = t, p, v
            else:
                ro, go, bo = v, p, q
            img_out[y, x, 0] = np.uint8(ro * _TO_U8)
            img_out[y, x, 1] = np.uint8(go * _TO_U8)
            img_out[y, x, 2] = np.uint8(bo * _TO_U8)


@njit(cache=True, nogil=True)
def _to_grayscale(img_in: np.ndarray, img_out: np.ndarray) -> None:
    """torchvision ``rgb_to_grayscale(num_output_channels=3)`` on uint8 (luma truncated).

    Args:
        img_in: uint8 ``[H, W, 3]`` image.
        img_out: uint8 ``[H, W, 3]`` output (may be ``img_in``); all channels equal.
    """
    h, w, _ = img_in.shape
    for y in range(h):
        for x in range(w):
            v = np.uint8(_luma(img_in[y, x, 0], img_in[y, x, 1], img_in[y, x, 2]))
            img_out[y, x, 0] = v
            img_out[y, x, 1] = v
            img_out[y, x, 2] = v


@njit(cache=True, nogil=True)
def _color_jitter(
    img: np.ndarray,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float,
    do_brightness: bool,
    do_contrast: bool,
    do_saturation: bool,
    do_hue: bool,
) -> None:
    """In-place colour jitter of one uint8 ``[H, W, 3]`` image, order b → c → s → h."""
    if do_brightness:
        _adjust_brightness(img, img, brightness)
    if do_contrast:
        _adjust_contrast(img, img, contrast)
    if do_saturation:
        _adjust_saturation(img, img, saturation)
    if do_hue:
        _adjust_hue(img, img, hue)


# --------------------------------------------------------------------------------------------
# FFCV operations
# --------------------------------------------------------------------------------------------


def _check_image_state(op: str, state: State) -> None:
    shape = tuple(state.shape)
    if not state.jit_mode or np.dtype(state.dtype) != np.uint8 or len(shape) != 3 or (
        shape[2] != 3
    ):
        raise TypeError(
            f"{op} needs uint8 [H, W, 3] numpy images (place it after an RGB image decoder and "
            f"before ToTensor); got jit_mode={state.jit_mode}, dtype={state.dtype}, "
            f"shape={shape}"
        )


class RandomColorJitter(Operation):
    """SimCLR colour jitter for FFCV: brightness, contrast, saturation and hue, with prob. p.

    With probability ``p`` per image, factors are drawn like torchvision's ``ColorJitter``
    (brightness/contrast/saturation ~ U[max(0, 1-x), 1+x], hue shift ~ U[-hue, hue]) and
    applied in the fixed order brightness → contrast → saturation → hue with
    torchvision.transforms.v2.functional semantics (see the module docstring). Components with
    magnitude 0 are skipped. SimCLR (Chen et al. 2020, App. A) uses strength s=1:
    ``(0.8s, 0.8s, 0.8s, 0.2s)`` with p=0.8; the defaults here are the common
    ``(0.4, 0.4, 0.4, 0.1)``.

    Operates on uint8 ``[B, H, W, 3]`` numpy batches (after an RGB image decoder, before
    ``ToTensor``); parallel over the batch.

    Args:
        brightness: brightness magnitude ≥ 0.
        contrast: contrast magnitude ≥ 0.
        saturation: saturation magnitude ≥ 0.
        hue: hue magnitude in [0, 0.5].
        p: probability of jittering an image, in [0, 1].

    Raises:
        ValueError: a magnitude or ``p`` that is not a real number or lies outside its range.
        TypeError: (in the pipeline) input that is not uint8 ``[H, W, 3]`` numpy images.
    """

    def __init__(
        self,
        *,
        brightness: float = 0.4,
        contrast: float = 0.4,
        saturation: float = 0.4,
        hue: float = 0.1,
        p: float = 0.8,
    ) -> None:
        super().__init__()
        self.brightness = _check_magnitude("brightness", brightness)
        self.contrast = _check_magnitude("contrast", contrast)
        self.saturation = _check_magnitude("saturation", saturation)
        self.hue = _check_hue(hue)
        self.p = _check_probability("p", p)

    def generate_code(self) -> Callable[..., Any]:
        my_range = Compiler.get_iterator()
        p = self.p
        b_lo, b_hi = _factor_range(self.brightness)
        c_lo, c_hi = _factor_range(self.contrast)
        s_lo, s_hi = _factor_range(self.saturation)
        hue = self.hue
        do_b = self.brightness > 0
        do_c = self.contrast > 0
        do_s = self.saturation > 0
        do_h = self.hue > 0
        jitter = _color_jitter

        def color_jitter(images: np.ndarray, dst: np.ndarray) -> np.ndarray:
            n: int = images.shape[0]
            apply = np.random.rand(n) < p
            bf = np.random.uniform(b_lo, b_hi, n)
            cf = np.random.uniform(c_lo, c_hi, n)
            sf = np.random.uniform(s_lo, s_hi, n)
            hf = np.random.uniform(-hue, hue, n)
            for i in my_range(n):
                dst[i] = images[i]
                if apply[i]:
                    jitter(dst[i], bf[i], cf[i], sf[i], hf[i], do_b, do_c, do_s, do_h)
            return dst[:n]

        color_jitter.is_parallel = True  # type: ignore[attr-defined]
        return color_jitter

    def declare_state_and_memory(
        self, previous_state: State
    ) -> tuple[State, AllocationQuery | None]:
        _check_image_state(type(self).__name__, previous_state)
        return (
            replace(previous_state, jit_mode=True),
            AllocationQuery(previous_state.shape, previous_state.dtype),
        )


class RandomGrayscale(Operation):
    """Convert images to grayscale with probability ``p`` (SimCLR: p=0.2), for FFCV.

    Luma ``0.2989 R + 0.587 G + 0.114 B`` truncated to uint8 and replicated to the three
    channels, as torchvision's ``RandomGrayscale`` / ``rgb_to_grayscale``. Operates on uint8
    ``[B, H, W, 3]`` numpy batches; parallel over the batch.

    Args:
        p: probability of converting an image, in [0, 1].

    Raises:
        ValueError: ``p`` not a real number in [0, 1].
        TypeError: (in the pipeline) input that is not uint8 ``[H, W, 3]`` numpy images.
    """

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.p = _check_probability("p", p)

    def generate_code(self) -> Callable[..., Any]:
        my_range = Compiler.get_iterator()
        p = self.p
        gray = _to_grayscale

        def grayscale(images: np.ndarray, dst: np.ndarray) -> np.ndarray:
            n: int = images.shape[0]
            apply = np.random.rand(n) < p
            for i in my_range(n):
                if apply[i]:
                    gray(images[i], dst[i])
                else:
                    dst[i] = images[i]
            return dst[:n]

        grayscale.is_parallel = True  # type: ignore[attr-defined]
        return grayscale

    def declare_state_and_memory(
        self, previous_state: State
    ) -> tuple[State, AllocationQuery | None]:
        _check_image_state(type(self).__name__, previous_state)
        return (
            replace(previous_state, jit_mode=True),
            AllocationQuery(previous_state.shape, previous_state.dtype),
        )
