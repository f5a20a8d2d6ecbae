"""Batched torch augmentations (any device; the GPU path, and blur on CPU): ``[B, 3, H, W]``
uint8 in [0, 255] or float in [0, 1]; see the package docstring for the semantics.

Host synchronisation: the public functions check their tensor arguments (hue shifts in
[-0.5, 0.5], blur sigmas > 0), which reads one flag back from the device per call.
:class:`BatchedSimCLRAugment` validates its Python-number ranges once at construction, so
its draws lie in range by construction; it calls the unchecked kernels and reads nothing
back (no ``.item()`` / ``bool()`` per call; only a minimum sigma too small for float32 still
takes the checked path). Its draws are made on the images' device unless its ``generator``
lives elsewhere (then each draw is copied over).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from components.data.augment.common import (
    _TO_U8,
    LUMA_WEIGHTS,
    _check_hue,
    _check_kernel_fraction,
    _check_magnitude,
    _check_probability,
    _check_sigma,
    _factor_range,
    blur_kernel_size,
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


@functools.cache
def _hsv_table(device: torch.device) -> torch.Tensor:
    """:data:`_HSV_SELECT` as a [3, 6] int64 tensor on ``device``, made once per device (a
    blocking host-to-GPU copy waits for the device's queue: not once per call)."""
    return torch.tensor(_HSV_SELECT, dtype=torch.int64, device=device)


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
    table = _hsv_table(hsv.device)  # [3, 6]
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
    # Checking a tensor argument reads a flag back (a host sync); BatchedSimCLRAugment's
    # shifts are in range by construction and skip it (_adjust_hue).
    if bool(((sh < -0.5) | (sh > 0.5)).any()):
        raise ValueError("hue shifts must be in [-0.5, 0.5]")
    return _adjust_hue(images, sh)


def _adjust_hue(images: torch.Tensor, sh: torch.Tensor) -> torch.Tensor:
    """:func:`batched_adjust_hue` without the checks: ``sh`` [B, 1, 1, 1] in the work dtype,
    already in [-0.5, 0.5]."""
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
    return _color_jitter(images, brightness, contrast, saturation, hue, apply,
                         hue_in_range=False)


def _color_jitter(
    images: torch.Tensor,
    brightness: torch.Tensor | None,
    contrast: torch.Tensor | None,
    saturation: torch.Tensor | None,
    hue: torch.Tensor | None,
    apply: torch.Tensor | None,
    *,
    hue_in_range: bool,
) -> torch.Tensor:
    """:func:`batched_color_jitter`; ``hue_in_range=True`` skips the hue-range check (the
    caller drew the shifts from a validated range) and its device read."""
    _check_batch(images)
    out = images
    if brightness is not None:
        out = batched_adjust_brightness(out, brightness)
    if contrast is not None:
        out = batched_adjust_contrast(out, contrast)
    if saturation is not None:
        out = batched_adjust_saturation(out, saturation)
    if hue is not None:
        out = (_adjust_hue(out, _per_sample("shift", hue, out)) if hue_in_range
               else batched_adjust_hue(out, hue))
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
    return _gaussian_blur(images, sigma, kernel_size, apply, sigma_positive=False)


def _gaussian_blur(
    images: torch.Tensor,
    sigma: torch.Tensor,
    kernel_size: int | Sequence[int],
    apply: torch.Tensor | None,
    *,
    sigma_positive: bool,
) -> torch.Tensor:
    """:func:`batched_gaussian_blur`; ``sigma_positive=True`` skips the sigma > 0 check (the
    caller drew sigma from a validated range) and its device read."""
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
    if not sigma_positive and bool((s <= 0).any()):  # a device read: a tensor argument
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


def batched_solarize(images: torch.Tensor, threshold: float | None = None,
                     apply: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sample ``solarize``: every value ``>= threshold`` inverted (uint8 ``255 - x``, a
    bitwise not; float ``1 - x``), as torchvision's ``solarize`` /
    ``RandomSolarize(threshold)``. BYOL (Grill et al. 2020, App. B): threshold 128 of 255.

    Args:
        images: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1].
        threshold: in the images' range; ``None``: BYOL's 128 (uint8) or ``128 / 255``
            (float: the same pixels as the uint8 image / 255).
        apply: ``[B]`` bool mask; samples where it is False are returned unchanged.

    Returns:
        ``[B, 3, H, W]``, the dtype of ``images``.

    Raises:
        ValueError: wrong shapes, or a threshold above the dtype's maximum (1.0 / 255).
        TypeError: unsupported dtype.
    """
    _check_batch(images)
    bound = _bound(images)
    t = (128.0 / 255.0 if images.is_floating_point() else 128.0) if threshold is None \
        else float(threshold)
    if t > bound:
        raise ValueError(f"threshold={threshold!r} is not allowed: it must be <= {bound:g}, "
                         f"the largest {images.dtype} pixel value")
    inverted = 1.0 - images if images.is_floating_point() else images.bitwise_not()
    return _select(apply, torch.where(images >= t, inverted, images), images)


class BatchedSimCLRAugment(torch.nn.Module):
    """SimCLR colour jitter → grayscale → Gaussian blur (→ BYOL's solarization) on a device
    batch, per-sample random.

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
        solarize_p: probability of solarization per sample (:func:`batched_solarize`,
            threshold 128 of 255), after the blur as in BYOL; 0 (the default) draws nothing.
        kernel_fraction: blur kernel size as a fraction of the image side (odd, ≥ 3).
        generator: RNG for all draws (on any device; draws are moved to the images' device);
            None uses torch's default generator of the images' device.

    Input/output: ``[B, 3, H, W]`` uint8 in [0, 255] or float in [0, 1]; same dtype out.

    Raises:
        ValueError: an argument that is not a real number or lies outside its range (the
            message names value and range; :mod:`components.checks`).
    """

    def __init__(
        self,
        *,
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
        solarize_p: float = 0.0,
    ) -> None:
        super().__init__()
        self.brightness = _check_magnitude("brightness", brightness)
        self.contrast = _check_magnitude("contrast", contrast)
        self.saturation = _check_magnitude("saturation", saturation)
        self.hue = _check_hue(hue)
        self.jitter_p = _check_probability("jitter_p", jitter_p)
        self.grayscale_p = _check_probability("grayscale_p", grayscale_p)
        self.blur_p = _check_probability("blur_p", blur_p)
        self.solarize_p = _check_probability("solarize_p", solarize_p)
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
            # hue ∈ [0, 0.5] was checked at construction, so h ∈ [-0.5, 0.5]: no device check.
            out = _color_jitter(
                out,
                brightness=b if self.brightness > 0 else None,
                contrast=c if self.contrast > 0 else None,
                saturation=s if self.saturation > 0 else None,
                hue=h if self.hue > 0 else None,
                apply=apply,
                hue_in_range=True,
            )
        if self.grayscale_p > 0:
            out = batched_grayscale(out, apply=self._rand(n, dev) < self.grayscale_p)
        if self.blur_p > 0:
            apply = self._rand(n, dev) < self.blur_p
            sig = self._uniform(*self.sigma, n, dev)
            kx = blur_kernel_size(images.shape[3], self.kernel_fraction)
            ky = blur_kernel_size(images.shape[2], self.kernel_fraction)
            # sigma = (min, max) with 0 < min was checked at construction, so sig >= min > 0
            # (rounding is monotonic) unless min underflows in float32 or the images' dtype:
            # only then does the checked path read a flag back.
            tiny = max(torch.finfo(torch.float32).tiny, torch.finfo(_work_dtype(images)).tiny)
            out = _gaussian_blur(out, sig, (kx, ky), apply,
                                 sigma_positive=self.sigma[0] >= tiny)
        if self.solarize_p > 0:  # drawn last: runs without it draw what they always drew
            out = batched_solarize(out, apply=self._rand(n, dev) < self.solarize_p)
        return out

    def extra_repr(self) -> str:
        return (
            f"brightness={self.brightness}, contrast={self.contrast}, "
            f"saturation={self.saturation}, hue={self.hue}, jitter_p={self.jitter_p}, "
            f"grayscale_p={self.grayscale_p}, blur_p={self.blur_p}, sigma={self.sigma}, "
            f"solarize_p={self.solarize_p}, "
            f"kernel_fraction={self.kernel_fraction}"
        )
