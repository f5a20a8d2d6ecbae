"""SimCLR colour / grayscale / blur augmentations that FFCV 1.0.2 lacks, for CPU and GPU.

SimCLR (Chen et al. 2020, "A Simple Framework for Contrastive Learning of Visual
Representations", ICML, Appendix A) augments each view with random resized crop + flip,
colour jitter (brightness, contrast, saturation, hue; applied with p=0.8), random grayscale
(p=0.2) and Gaussian blur (sigma ~ U[0.1, 2.0], kernel ≈ 10% of the image side, p=0.5).
FFCV supplies crop, flip and brightness/contrast/saturation but no hue, grayscale or blur;
this module supplies all three jitter/grayscale/blur steps twice:

* **FFCV Operations** (CPU, numba): :class:`RandomColorJitter`, :class:`RandomGrayscale`,
  :class:`RandomGaussianBlur`. They take the uint8 ``[B, H, W, 3]`` batch the RGB image
  decoders produce (place them before ``ToTensor``), draw per-image parameters with
  ``np.random`` inside the compiled code (like FFCV's own ops) and loop over the batch with
  ``Compiler.get_iterator()`` (``prange`` when FFCV runs more than one thread). The per-image
  work is done by module-level ``@njit`` kernels (``_adjust_brightness``, ``_adjust_contrast``,
  ``_adjust_saturation``, ``_adjust_hue``, ``_to_grayscale``, ``_gaussian_blur``) that read
  ``img_in`` and write ``img_out`` (both uint8 ``[H, W, 3]``; they may be the same array).
  The kernels are always numba-compiled (cached on disk), also when FFCV's
  ``Compiler.set_enabled(False)`` turns compilation of the pipeline itself off.
* **Batched torch functions** (any device, fully vectorised, per-sample parameters):
  :func:`batched_adjust_brightness`, :func:`batched_adjust_contrast`,
  :func:`batched_adjust_saturation`, :func:`batched_adjust_hue`,
  :func:`batched_color_jitter`, :func:`batched_grayscale`, :func:`batched_gaussian_blur`,
  and the module :class:`BatchedSimCLRAugment` (jitter → grayscale → blur). Input is
  ``[B, 3, H, W]`` uint8 (range [0, 255]) or floating point (range [0, 1], the torchvision
  convention); the output has the input's dtype and range.

Semantics follow ``torchvision.transforms.v2.functional`` (0.29) exactly, including its uint8
behaviour: the luma weights are torchvision's ``(0.2989, 0.587, 0.114)`` (ITU-R 601-2 rounded
as torchvision and PIL do), blends are computed in float32, clamped and *truncated* back to
uint8, contrast and saturation use the floored grayscale of a uint8 image, hue goes through
HSV in float32 and back with ``x * 255.999`` truncation, and blur rounds to nearest. Each
jitter step quantises to uint8 in turn, as torchvision's ``ColorJitter`` does on uint8 input.
The colour-jitter order is fixed to brightness → contrast → saturation → hue (torchvision's
``ColorJitter`` permutes it randomly per call; SimCLR's TF code also randomises it). A
component whose magnitude is 0 is skipped entirely, as in torchvision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.compiler import Compiler
from ffcv.pipeline.operation import Operation
from ffcv.pipeline.state import State
from numba import njit

__all__ = [
    "BatchedSimCLRAugment",
    "RandomColorJitter",
    "RandomGaussianBlur",
    "RandomGrayscale",
    "batched_adjust_brightness",
    "batched_adjust_contrast",
    "batched_adjust_hue",
    "batched_adjust_saturation",
    "batched_color_jitter",
    "batched_gaussian_blur",
    "batched_grayscale",
    "blur_kernel_size",
]

# torchvision's grayscale weights (ITU-R 601-2 luma with R rounded to 0.2989, as in PIL).
LUMA_WEIGHTS: tuple[float, float, float] = (0.2989, 0.587, 0.114)
_LR = np.float32(LUMA_WEIGHTS[0])
_LG = np.float32(LUMA_WEIGHTS[1])
_LB = np.float32(LUMA_WEIGHTS[2])
_INV255 = np.float32(1.0 / 255.0)
_TO_U8 = np.float32(255.0 + 1.0 - 1e-3)  # torchvision's float -> uint8 scale (no rounding)
_ONE_SIXTH = np.float32(1.0 / 6.0)


# --------------------------------------------------------------------------------------------
# Argument validation (shared by the FFCV operations and the torch module)
# --------------------------------------------------------------------------------------------


def _as_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def _check_probability(name: str, value: object) -> float:
    v = _as_real(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return v


def _check_magnitude(name: str, value: object) -> float:
    v = _as_real(name, value)
    if not 0.0 <= v < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0 (range [0, inf)), got {value!r}")
    return v


def _check_hue(value: object) -> float:
    v = _as_real("hue", value)
    if not 0.0 <= v <= 0.5:
        raise ValueError(f"hue must be in [0, 0.5], got {value!r}")
    return v


def _check_sigma(value: object) -> tuple[float, float]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"sigma must be a (min, max) pair with 0 < min <= max, got {value!r}")
    lo = _as_real("sigma[0]", value[0])
    hi = _as_real("sigma[1]", value[1])
    if not (0.0 < lo <= hi < math.inf):
        raise ValueError(
            f"sigma must be a (min, max) pair with 0 < min <= max < inf, got {value!r}"
        )
    return lo, hi


def _check_kernel_fraction(value: object) -> float:
    v = _as_real("kernel_fraction", value)
    if not 0.0 < v <= 1.0:
        raise ValueError(f"kernel_fraction must be in (0, 1], got {value!r}")
    return v


def _factor_range(magnitude: float) -> tuple[float, float]:
    """torchvision ColorJitter's factor range for brightness/contrast/saturation."""
    return max(0.0, 1.0 - magnitude), 1.0 + magnitude


def blur_kernel_size(side: int, kernel_fraction: float = 0.1) -> int:
    """Odd Gaussian kernel size for an image side, as in SimCLR's reference code.

    ``k = floor(kernel_fraction * side)``, made odd as ``2 * (k // 2) + 1`` and at least 3
    (SimCLR, Chen et al. 2020, App. A: "kernel size is 10% of the image height/width";
    224 px → 23, 96 px → 9, 32 px → 3).

    Args:
        side: image height or width in pixels (≥ 1).
        kernel_fraction: fraction of the side, in (0, 1].

    Returns:
        The odd kernel size (≥ 3).
    """
    k = int(side * kernel_fraction)
    k = (k // 2) * 2 + 1
    return max(k, 3)


_blur_kernel_size_nb = njit(cache=True, nogil=True)(blur_kernel_size)


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
def _gaussian_kernel1d(ksize: int, sigma: float) -> np.ndarray:
    """Normalised float32 weights ``exp(-d² / 2σ²)``, d = -(k-1)/2 … (k-1)/2."""
    radius = (ksize - 1) / 2.0
    out = np.empty(ksize, np.float64)
    total = 0.0
    for i in range(ksize):
        d = (i - radius) / sigma
        out[i] = math.exp(-0.5 * d * d)
        total += out[i]
    return (out / total).astype(np.float32)


@njit(cache=True, nogil=True, inline="always")
def _reflect(i: int, n: int) -> int:
    """Index ``i`` reflected into ``[0, n)`` without repeating the edge (numpy/torch 'reflect')."""
    if n == 1:
        return 0
    period = 2 * (n - 1)
    i = i % period
    if i >= n:
        i = period - i
    return i


@njit(cache=True, nogil=True)
def _gaussian_blur(
    img_in: np.ndarray, img_out: np.ndarray, sigma: float, ksize_x: int, ksize_y: int
) -> None:
    """Separable Gaussian blur with reflect padding: torchvision ``gaussian_blur`` on uint8.

    Horizontal then vertical pass in float32, rounded half-to-even to uint8 (torchvision
    convolves once with the 2-D outer-product kernel; the results agree up to float32
    rounding). Reflection is repeated when the kernel radius exceeds the image side (torch's
    reflect padding refuses that case).

    Args:
        img_in: uint8 ``[H, W, C]`` image.
        img_out: uint8 ``[H, W, C]`` output (may be ``img_in``).
        sigma: standard deviation in pixels (> 0), the same along both axes.
        ksize_x: odd kernel size along the width.
        ksize_y: odd kernel size along the height.
    """
    h, w, c = img_in.shape
    wx = _gaussian_kernel1d(ksize_x, sigma)
    wy = _gaussian_kernel1d(ksize_y, sigma)
    rx = ksize_x // 2
    ry = ksize_y // 2
    ix = np.empty(w + 2 * rx, np.int64)
    for j in range(w + 2 * rx):
        ix[j] = _reflect(j - rx, w)
    iy = np.empty(h + 2 * ry, np.int64)
    for j in range(h + 2 * ry):
        iy[j] = _reflect(j - ry, h)
    # Horizontal pass: gather one reflect-padded row as float32, then convolve it.
    tmp = np.empty((h, w, c), np.float32)
    row = np.empty((w + 2 * rx, c), np.float32)
    for y in range(h):
        for j in range(w + 2 * rx):
            for ch in range(c):
                row[j, ch] = np.float32(img_in[y, ix[j], ch])
        flat_in = row.reshape(-1)
        flat_out = tmp[y].reshape(-1)
        flat_out[:] = 0.0
        for k in range(ksize_x):
            wk = wx[k]
            off = k * c
            for j in range(w * c):
                flat_out[j] += wk * flat_in[j + off]
    # Vertical pass: accumulate whole rows (contiguous, vectorisable), same summation order.
    acc_row = np.empty((w, c), np.float32)
    acc_flat = acc_row.reshape(-1)
    for y in range(h):
        acc_flat[:] = 0.0
        for k in range(ksize_y):
            wk = wy[k]
            src = tmp[iy[y + k]].reshape(-1)
            for j in range(w * c):
                acc_flat[j] += wk * src[j]
        for x in range(w):
            for ch in range(c):
                v = np.rint(acc_row[x, ch])
                if v < 0.0:
                    v = 0.0
                elif v > 255.0:
                    v = 255.0
                img_out[y, x, ch] = np.uint8(v)


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
        ValueError: a magnitude or ``p`` outside its range.
        TypeError: an argument that is not a real number; (in the pipeline) input that is not
            uint8 ``[H, W, 3]`` numpy images.
    """

    def __init__(
        self,
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
        ValueError: ``p`` outside [0, 1].
        TypeError: ``p`` not a real number; (in the pipeline) input that is not uint8
            ``[H, W, 3]`` numpy images.
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


class RandomGaussianBlur(Operation):
    """Gaussian blur with probability ``p`` and sigma ~ U[sigma[0], sigma[1]], for FFCV.

    SimCLR (Chen et al. 2020, App. A): p=0.5, sigma ∈ [0.1, 2.0], kernel size 10% of the image
    side. The kernel size per axis is :func:`blur_kernel_size` of that side (odd, ≥ 3);
    padding reflects like torchvision's ``gaussian_blur``. Separable, float32, rounded to
    uint8. Operates on uint8 ``[B, H, W, 3]`` numpy batches; parallel over the batch.

    Args:
        p: probability of blurring an image, in [0, 1].
        sigma: ``(min, max)`` standard deviation in pixels, ``0 < min <= max``.
        kernel_fraction: kernel size as a fraction of the image side, in (0, 1].

    Raises:
        ValueError: ``p``, ``sigma`` or ``kernel_fraction`` outside its range.
        TypeError: an argument that is not a real number; (in the pipeline) input that is not
            uint8 ``[H, W, 3]`` numpy images.
    """

    def __init__(
        self,
        p: float = 0.5,
        sigma: tuple[float, float] = (0.1, 2.0),
        kernel_fraction: float = 0.1,
    ) -> None:
        super().__init__()
        self.p = _check_probability("p", p)
        self.sigma = _check_sigma(sigma)
        self.kernel_fraction = _check_kernel_fraction(kernel_fraction)

    def generate_code(self) -> Callable[..., Any]:
        my_range = Compiler.get_iterator()
        p = self.p
        lo, hi = self.sigma
        frac = self.kernel_fraction
        blur = _gaussian_blur
        ksize = _blur_kernel_size_nb

        def gaussian_blur(images: np.ndarray, dst: np.ndarray) -> np.ndarray:
            n: int = images.shape[0]
            kx = ksize(images.shape[2], frac)
            ky = ksize(images.shape[1], frac)
            apply = np.random.rand(n) < p
            sigmas = np.random.uniform(lo, hi, n)
            for i in my_range(n):
                if apply[i]:
                    blur(images[i], dst[i], sigmas[i], kx, ky)
                else:
                    dst[i] = images[i]
            return dst[:n]

        gaussian_blur.is_parallel = True  # type: ignore[attr-defined]
        return gaussian_blur

    def declare_state_and_memory(
        self, previous_state: State
    ) -> tuple[State, AllocationQuery | None]:
        _check_image_state(type(self).__name__, previous_state)
        return (
            replace(previous_state, jit_mode=True),
            AllocationQuery(previous_state.shape, previous_state.dtype),
        )


# --------------------------------------------------------------------------------------------
# Batched torch versions (GPU path): [B, 3, H, W], uint8 in [0, 255] or float in [0, 1]
# --------------------------------------------------------------------------------------------


def _check_batch(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must have shape [B, 3, H, W], got {tuple(images.shape)}")
    if images.dtype != torch.uint8 and not images.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")


def _work_dtype(images: torch.Tensor) -> torch.dtype:
    return images.dtype if images.is_floating_point() else torch.float32


def _per_sample_f64(name: str, values: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Validate a per-sample ``[B]`` tensor; float64 ``[B, 1, 1, 1]`` on the images' device."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{name} must be a [B] tensor, got {type(values).__name__}")
    if values.shape != (images.shape[0],):
        raise ValueError(
            f"{name} must have shape [B] = [{images.shape[0]}], got {tuple(values.shape)}"
        )
    dtype = torch.float32 if images.device.type == "mps" else torch.float64
    return values.to(device=images.device, dtype=dtype).view(-1, 1, 1, 1)


def _per_sample(name: str, values: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Validate a per-sample ``[B]`` tensor and shape it ``[B, 1, 1, 1]`` in the work dtype."""
    return _per_sample_f64(name, values, images).to(_work_dtype(images))


def _bound(images: torch.Tensor) -> float:
    return 1.0 if images.is_floating_point() else 255.0


def _finish(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Clamp to the value range and (for uint8) truncate, like torchvision's ``_blend``."""
    out = out.clamp_(0.0, _bound(like))
    return out if like.is_floating_point() else out.to(like.dtype)


def _gray(images: torch.Tensor) -> torch.Tensor:
    """Float luma ``[B, 1, H, W]`` in the work dtype (not floored, not cast)."""
    x = images.to(_work_dtype(images))
    r, g, b = x.unbind(dim=1)
    return (
        r.mul(LUMA_WEIGHTS[0]).add_(g, alpha=LUMA_WEIGHTS[1]).add_(b, alpha=LUMA_WEIGHTS[2])
    ).unsqueeze(1)


def _blend(images: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``images * ratio + other * (1 - ratio)``, clamped; ``ratio`` float64 ``[B, 1, 1, 1]``.

    ``1 - ratio`` is formed in float64 before the cast and the second product is fused
    (``addcmul``), as torchvision's ``image.mul(r).add_(other, alpha=1 - r)`` with a Python
    float ``r``.
    """
    dt = _work_dtype(images)
    x = images.to(dt)
    return _finish(torch.addcmul(x * ratio.to(dt), other, (1.0 - ratio).to(dt)), images)


def batched_adjust_brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Per-sample ``adjust_brightness``: ``clamp(x * factor[b])``.

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        factor: ``[B]`` brightness factors ≥ 0.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes. TypeError: unsupported dtype or non-tensor arguments.
    """
    _check_batch(images)
    f = _per_sample("factor", factor, images)
    return _finish(images.to(_work_dtype(images)) * f, images)


def batched_adjust_contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Per-sample ``adjust_contrast``: blend with the mean of each image's grayscale.

    For uint8 the grayscale is floored before the mean, as in torchvision.

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        factor: ``[B]`` contrast factors ≥ 0.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes. TypeError: unsupported dtype or non-tensor arguments.
    """
    _check_batch(images)
    f = _per_sample_f64("factor", factor, images)
    gray = _gray(images)
    if not images.is_floating_point():
        gray = gray.floor_()
    mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(images, mean, f)


def batched_adjust_saturation(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Per-sample ``adjust_saturation``: blend each pixel with its grayscale value.

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        factor: ``[B]`` saturation factors ≥ 0 (0 = grayscale).

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes. TypeError: unsupported dtype or non-tensor arguments.
    """
    _check_batch(images)
    f = _per_sample_f64("factor", factor, images)
    gray = _gray(images)
    if not images.is_floating_point():
        gray = gray.floor_()
    return _blend(images, gray, f)


def _rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` RGB in [0, 1] → HSV (torchvision's formulas)."""
    r, g, b = x.unbind(dim=1)
    maxc, _ = x.max(dim=1)
    minc, _ = x.min(dim=1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = torch.ones_like(maxc)
    s = cr / torch.where(eqc, ones, maxc)
    div = torch.where(eqc, ones, cr)
    rc = (maxc - r) / div
    gc = (maxc - g) / div
    bc = (maxc - b) / div
    is_r = maxc == r
    is_g = (maxc == g) & ~is_r
    is_b = ~is_r & ~is_g
    h = (bc - gc) * is_r + (2.0 + rc - bc) * is_g + (4.0 + gc - rc) * is_b
    h = (h * (1.0 / 6.0) + 1.0).fmod(1.0)
    return torch.stack((h, s, maxc), dim=1)


# HSV sector i -> index into (v, p, q, t) for r, g, b (torchvision's table).
_HSV_SELECT = ((0, 2, 1, 1, 3, 0), (3, 0, 0, 2, 1, 1), (1, 1, 3, 0, 0, 2))


def _hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` HSV → RGB in [0, 1] (torchvision's formulas)."""
    h, s, v = hsv.unbind(dim=1)
    h6 = h * 6.0
    i = torch.floor(h6)
    f = h6 - i
    sector = i.to(torch.int64).remainder(6)
    sxf = s * f
    q = ((1.0 - sxf) * v).clamp(0.0, 1.0)
    t = ((sxf + (1.0 - s)) * v).clamp(0.0, 1.0)
    p = ((1.0 - s) * v).clamp(0.0, 1.0)
    vpqt = torch.stack((v, p, q, t), dim=1)  # [B, 4, H, W]
    table = torch.tensor(_HSV_SELECT, dtype=torch.int64, device=hsv.device)  # [3, 6]
    select = table[:, sector].movedim(0, 1)  # [B, 3, H, W]
    return vpqt.gather(1, select)


def batched_adjust_hue(images: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Per-sample ``adjust_hue``: ``H ← (H + shift[b]) mod 1`` in HSV.

    uint8 input is scaled by 1/255 and converted back with ``x * 255.999`` truncation, as
    torchvision does.

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        shift: ``[B]`` hue shifts in [-0.5, 0.5].

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes, or a shift outside [-0.5, 0.5]. TypeError: unsupported dtype
            or non-tensor arguments.
    """
    _check_batch(images)
    sh = _per_sample("shift", shift, images)
    if bool(((sh < -0.5) | (sh > 0.5)).any()):
        raise ValueError("hue shifts must be in [-0.5, 0.5]")
    x = images.to(_work_dtype(images))
    if not images.is_floating_point():
        x = x.mul_(1.0 / 255.0)
    hsv = _rgb_to_hsv(x)
    h = (hsv[:, 0:1] + sh).remainder_(1.0)
    out = _hsv_to_rgb(torch.cat((h, hsv[:, 1:]), dim=1))
    if images.is_floating_point():
        return out
    return out.mul_(float(_TO_U8)).to(images.dtype)


def _select(apply: torch.Tensor | None, out: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    if apply is None:
        return out
    if not isinstance(apply, torch.Tensor) or apply.shape != (images.shape[0],):
        raise ValueError(f"apply must be a [B] = [{images.shape[0]}] bool tensor")
    mask = apply.to(device=images.device, dtype=torch.bool).view(-1, 1, 1, 1)
    return torch.where(mask, out, images)


def batched_color_jitter(
    images: torch.Tensor,
    brightness: torch.Tensor | None = None,
    contrast: torch.Tensor | None = None,
    saturation: torch.Tensor | None = None,
    hue: torch.Tensor | None = None,
    apply: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sample colour jitter in the fixed order brightness → contrast → saturation → hue.

    Each factor is a ``[B]`` tensor (``None`` skips that component); on uint8 input every
    step is quantised to uint8, as torchvision's ``ColorJitter`` on uint8 images.
    SimCLR (Chen et al. 2020, App. A).

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        brightness: ``[B]`` brightness factors ≥ 0, or None.
        contrast: ``[B]`` contrast factors ≥ 0, or None.
        saturation: ``[B]`` saturation factors ≥ 0, or None.
        hue: ``[B]`` hue shifts in [-0.5, 0.5], or None.
        apply: ``[B]`` bool mask; samples where it is False are returned unchanged.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes or hue shifts outside [-0.5, 0.5]. TypeError: unsupported
            dtype or non-tensor arguments.
    """
    _check_batch(images)
    out = images
    if brightness is not None:
        out = batched_adjust_brightness(out, brightness)
    if contrast is not None:
        out = batched_adjust_contrast(out, contrast)
    if saturation is not None:
        out = batched_adjust_saturation(out, saturation)
    if hue is not None:
        out = batched_adjust_hue(out, hue)
    return _select(apply, out, images)


def batched_grayscale(images: torch.Tensor, apply: torch.Tensor | None = None) -> torch.Tensor:
    """``rgb_to_grayscale(num_output_channels=3)`` per sample (luma 0.2989/0.587/0.114).

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        apply: ``[B]`` bool mask; samples where it is False are returned unchanged.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images`` (uint8 luma truncated, as torchvision).

    Raises:
        ValueError: wrong shapes. TypeError: unsupported dtype.
    """
    _check_batch(images)
    gray = _gray(images).to(images.dtype).repeat(1, 3, 1, 1)
    return _select(apply, gray, images)


def _reflect_index(n: int, radius: int, device: torch.device) -> torch.Tensor:
    """Indices of a reflect-padded axis of length n (repeated reflection for any radius)."""
    i = torch.arange(-radius, n + radius, device=device)
    if n == 1:
        return torch.zeros_like(i)
    period = 2 * (n - 1)
    i = i.remainder(period)
    return torch.where(i >= n, period - i, i)


def _gaussian_weights(sigma: torch.Tensor, ksize: int) -> torch.Tensor:
    """``[B, ksize]`` normalised Gaussian weights for per-sample ``sigma`` ``[B]``."""
    d = torch.arange(ksize, device=sigma.device, dtype=sigma.dtype) - (ksize - 1) / 2.0
    w = torch.exp(-0.5 * (d[None, :] / sigma[:, None]) ** 2)
    return w / w.sum(dim=1, keepdim=True)


def batched_gaussian_blur(
    images: torch.Tensor,
    sigma: torch.Tensor,
    kernel_size: int | Sequence[int],
    apply: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sample separable Gaussian blur with reflect padding (torchvision ``gaussian_blur``).

    Both passes are one depthwise ``conv2d`` over all ``B * 3`` channels (per-sample weights
    as groups). uint8 results are rounded to nearest. SimCLR (Chen et al. 2020, App. A).

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        sigma: ``[B]`` standard deviations in pixels (> 0).
        kernel_size: odd size, or ``(kx, ky)`` = (along width, along height) — torchvision's
            order. Use :func:`blur_kernel_size` for SimCLR's 10%-of-the-side rule.
        apply: ``[B]`` bool mask; samples where it is False are returned unchanged.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes, even/non-positive kernel sizes or non-positive sigma.
        TypeError: unsupported dtype or non-tensor arguments.
    """
    _check_batch(images)
    if isinstance(kernel_size, int):
        kx = ky = kernel_size
    else:
        if len(kernel_size) != 2:
            raise ValueError(f"kernel_size must be an int or (kx, ky), got {kernel_size!r}")
        kx, ky = int(kernel_size[0]), int(kernel_size[1])
    if kx < 1 or ky < 1 or kx % 2 == 0 or ky % 2 == 0:
        raise ValueError(f"kernel sizes must be odd and positive, got {kernel_size!r}")
    s = _per_sample("sigma", sigma, images).view(-1)
    if bool((s <= 0).any()):
        raise ValueError("sigma must be > 0 for every sample")
    bsz, ch, h, w = images.shape
    x = images.to(_work_dtype(images))
    x = x.index_select(3, _reflect_index(w, kx // 2, images.device))
    x = x.index_select(2, _reflect_index(h, ky // 2, images.device))
    x = x.reshape(1, bsz * ch, h + 2 * (ky // 2), w + 2 * (kx // 2))
    wx = _gaussian_weights(s, kx).repeat_interleave(ch, dim=0).view(bsz * ch, 1, 1, kx)
    wy = _gaussian_weights(s, ky).repeat_interleave(ch, dim=0).view(bsz * ch, 1, ky, 1)
    x = F.conv2d(x, wx, groups=bsz * ch)
    x = F.conv2d(x, wy, groups=bsz * ch)
    out = x.view(bsz, ch, h, w)
    if not images.is_floating_point():
        out = out.round_().clamp_(0.0, 255.0).to(images.dtype)
    return _select(apply, out, images)


class BatchedSimCLRAugment(torch.nn.Module):
    """SimCLR colour jitter → grayscale → Gaussian blur on a device batch, per-sample random.

    Every sample draws its own Bernoulli gates and factors (torchvision ``ColorJitter``
    ranges; jitter order fixed to brightness → contrast → saturation → hue), all in a few
    vectorised tensor ops — no per-sample Python loop. Runs under ``torch.no_grad``.
    Reference: SimCLR, Chen et al. 2020, Appendix A.

    Args:
        brightness: brightness magnitude ≥ 0 (factor ~ U[max(0, 1-x), 1+x]).
        contrast: contrast magnitude ≥ 0.
        saturation: saturation magnitude ≥ 0.
        hue: hue magnitude in [0, 0.5] (shift ~ U[-hue, hue]).
        jitter_p: probability of colour jitter per sample.
        grayscale_p: probability of grayscale per sample.
        blur_p: probability of blur per sample.
        sigma: ``(min, max)`` blur standard deviation in pixels.
        kernel_fraction: blur kernel size as a fraction of the image side (odd, ≥ 3).
        generator: RNG for all draws (on any device; draws are moved to the images' device);
            None uses torch's default generator of the images' device.

    Input/output: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1]; same dtype out.

    Raises:
        ValueError: an argument outside its range (the message names value and range).
        TypeError: an argument that is not a real number.
    """

    def __init__(
        self,
        brightness: float = 0.4,
        contrast: float = 0.4,
        saturation: float = 0.4,
        hue: float = 0.1,
        jitter_p: float = 0.8,
        grayscale_p: float = 0.2,
        blur_p: float = 0.5,
        sigma: tuple[float, float] = (0.1, 2.0),
        kernel_fraction: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.brightness = _check_magnitude("brightness", brightness)
        self.contrast = _check_magnitude("contrast", contrast)
        self.saturation = _check_magnitude("saturation", saturation)
        self.hue = _check_hue(hue)
        self.jitter_p = _check_probability("jitter_p", jitter_p)
        self.grayscale_p = _check_probability("grayscale_p", grayscale_p)
        self.blur_p = _check_probability("blur_p", blur_p)
        self.sigma = _check_sigma(sigma)
        self.kernel_fraction = _check_kernel_fraction(kernel_fraction)
        self.generator = generator

    def _rand(self, n: int, device: torch.device) -> torch.Tensor:
        gen = self.generator
        dev = gen.device if gen is not None else device
        return torch.rand(n, generator=gen, device=dev).to(device)

    def _uniform(self, lo: float, hi: float, n: int, device: torch.device) -> torch.Tensor:
        return lo + (hi - lo) * self._rand(n, device)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Augment ``images`` ``[B, 3, H, W]`` (uint8 or float in [0, 1]); same dtype out.

        Raises:
            ValueError: images not shaped ``[B, 3, H, W]``.
            TypeError: images neither uint8 nor floating point.
        """
        _check_batch(images)
        n, dev = images.shape[0], images.device
        out = images
        if self.jitter_p > 0:
            apply = self._rand(n, dev) < self.jitter_p
            b = self._uniform(*_factor_range(self.brightness), n, dev)
            c = self._uniform(*_factor_range(self.contrast), n, dev)
            s = self._uniform(*_factor_range(self.saturation), n, dev)
            h = self._uniform(-self.hue, self.hue, n, dev)
            out = batched_color_jitter(
                out,
                brightness=b if self.brightness > 0 else None,
                contrast=c if self.contrast > 0 else None,
                saturation=s if self.saturation > 0 else None,
                hue=h if self.hue > 0 else None,
                apply=apply,
            )
        if self.grayscale_p > 0:
            out = batched_grayscale(out, apply=self._rand(n, dev) < self.grayscale_p)
        if self.blur_p > 0:
            apply = self._rand(n, dev) < self.blur_p
            sig = self._uniform(*self.sigma, n, dev)
            kx = blur_kernel_size(images.shape[3], self.kernel_fraction)
            ky = blur_kernel_size(images.shape[2], self.kernel_fraction)
            out = batched_gaussian_blur(out, sig, (kx, ky), apply=apply)
        return out

    def extra_repr(self) -> str:
        return (
            f"brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue}, jitter_p={self.jitter_p}, "
            f"grayscale_p={self.grayscale_p}, blur_p={self.blur_p}, sigma={self.sigma}, "
            f"kernel_fraction={self.kernel_fraction}"
        )
