"""What both augmentation implementations share: torchvision's constants and the argument
checks (so the FFCV operations and the torch module refuse the same values; the checks are
:mod:`components.checks`' with these arguments' ranges)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from components import checks

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


def _check_probability(name: str, value: object) -> float:
    return checks.in_range(name, value, 0.0, 1.0)


def _check_magnitude(name: str, value: object) -> float:
    return checks.non_negative(name, value)


def _check_hue(value: object) -> float:
    return checks.in_range("hue", value, 0.0, 0.5)


def _check_sigma(value: object) -> tuple[float, float]:
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"sigma={value!r} is not allowed: it must be a (min, max) pair with "
                         "0 < min <= max")
    lo, hi = checks.positive("sigma[0]", value[0]), checks.positive("sigma[1]", value[1])
    if lo > hi:
        raise ValueError(f"sigma={value!r} is not allowed: it must be a (min, max) pair with "
                         "0 < min <= max")
    return lo, hi


def _check_kernel_fraction(value: object) -> float:
    return checks.in_range("kernel_fraction", value, 0.0, 1.0, low_open=True)


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
