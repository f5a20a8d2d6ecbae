"""What both augmentation implementations share: torchvision's constants and the argument
checks (so the FFCV operations and the torch module refuse the same values)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

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
