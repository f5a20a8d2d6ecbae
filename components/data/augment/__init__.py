"""SimCLR colour / grayscale / blur augmentations that FFCV 1.0.2 lacks, for CPU and GPU.

SimCLR (Chen et al. 2020, "A Simple Framework for Contrastive Learning of Visual
Representations", ICML, Appendix A) augments each view with random resized crop + flip,
colour jitter (brightness, contrast, saturation, hue; applied with p=0.8), random grayscale
(p=0.2) and Gaussian blur (sigma ~ U[0.1, 2.0], kernel ≈ 10% of the image side, p=0.5).
FFCV supplies crop, flip and brightness/contrast/saturation but no hue, grayscale or blur;
this package supplies jitter and grayscale twice and blur once:

* **FFCV Operations** (CPU, numba; :mod:`.ffcv_ops`): :class:`RandomColorJitter`,
  :class:`RandomGrayscale`. They take the uint8 ``[B, H, W, 3]`` batch the RGB image
  decoders produce (place them before ``ToTensor``), draw per-image parameters with
  ``np.random`` inside the compiled code (like FFCV's own ops) and loop over the batch with
  ``Compiler.get_iterator()`` (``prange`` when FFCV runs more than one thread). The per-image
  work is done by module-level ``@njit`` kernels (``_adjust_brightness``, ``_adjust_contrast``,
  ``_adjust_saturation``, ``_adjust_hue``, ``_to_grayscale``) that read
  ``img_in`` and write ``img_out`` (both uint8 ``[H, W, 3]``; they may be the same array).
  The kernels are always numba-compiled (cached on disk), also when FFCV's
  ``Compiler.set_enabled(False)`` turns compilation of the pipeline itself off.
* **Batched torch functions** (any device, fully vectorised, per-sample parameters;
  :mod:`.batched`):
  :func:`batched_adjust_brightness`, :func:`batched_adjust_contrast`,
  :func:`batched_adjust_saturation`, :func:`batched_adjust_hue`,
  :func:`batched_color_jitter`, :func:`batched_grayscale`, :func:`batched_gaussian_blur`,
  :func:`batched_solarize` (BYOL), and the module :class:`BatchedSimCLRAugment` (jitter →
  grayscale → blur → solarize). Input is
  ``[B, 3, H, W]`` uint8 (range [0, 255]) or floating point (range [0, 1], the torchvision
  convention); the output has the input's dtype and range. On CPU the reader runs blur as
  this batched op after the loader: a numba blur inside FFCV's compiled pipeline stalled its
  worker threads at 8 px, so there is none. Solarization comes after the blur (BYOL's
  order), so on CPU it runs batched after the loader too.

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

from components.data.augment.batched import (
    BatchedSimCLRAugment,
    batched_adjust_brightness,
    batched_adjust_contrast,
    batched_adjust_hue,
    batched_adjust_saturation,
    batched_color_jitter,
    batched_gaussian_blur,
    batched_grayscale,
    batched_solarize,
)
from components.data.augment.common import LUMA_WEIGHTS, blur_kernel_size
from components.data.augment.ffcv_ops import RandomColorJitter, RandomGrayscale

__all__ = [
    "LUMA_WEIGHTS",
    "BatchedSimCLRAugment",
    "RandomColorJitter",
    "RandomGrayscale",
    "batched_adjust_brightness",
    "batched_adjust_contrast",
    "batched_adjust_hue",
    "batched_adjust_saturation",
    "batched_color_jitter",
    "batched_gaussian_blur",
    "batched_grayscale",
    "batched_solarize",
    "blur_kernel_size",
]
