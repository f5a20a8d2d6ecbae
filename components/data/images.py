"""Decode any image the preprocess pipeline meets into an RGB ``uint8`` array.

``decode_image`` is the one entry point. It accepts encoded bytes (any format Pillow reads) or
an already-decoded ``numpy`` array (built-in datasets), converts every mode to RGB the way a
user expects, applies EXIF orientation, and shrinks the longer side to ``max_side``:

* grey (``L``, ``1``) → replicated channels; ``LA``/``RGBA``/``PA`` and palette images with a
  transparent colour → alpha-composited on white (transparent pixels are not black);
* ``CMYK`` and ``YCbCr`` → Pillow's RGB conversion;
* 16-bit (``I;16*``, ``I``) and float (``F``) grey → scaled to 0..255, not clipped.

Every failure raises :class:`ImageError` with a short ``reason`` code (used to count skips in
``manifest.json``) and a message naming the problem.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from components.errors import SimgraphError

# Reasons an item is skipped; manifest.json counts skips by these codes.
NOT_AN_IMAGE = "not-an-image"
CORRUPT = "corrupt-image"
TOO_SMALL = "too-small"
TOO_LARGE = "too-large"


class ImageError(SimgraphError, ValueError):
    """An item cannot become a training image; ``reason`` is one of the codes above."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # pickled across Ray processes
        return type(self), (self.reason, str(self))


def _to_uint8_grey(arr: np.ndarray, mode: str) -> np.ndarray:
    """16-bit / 32-bit integer or float grey → uint8, scaled by the mode's range."""
    if mode == "F":
        hi = 1.0 if float(np.nanmax(arr, initial=0.0)) <= 1.0 else 255.0
        out = np.nan_to_num(arr.astype(np.float64) / hi * 255.0)
    else:  # I;16, I;16B, I;16L, I (PNG 16-bit grey opens as I or I;16)
        hi = 65535.0 if int(arr.max(initial=0)) > 255 or mode.startswith("I;16") else 255.0
        out = arr.astype(np.float64) / hi * 255.0
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _composite_on_white(img: Image.Image) -> Image.Image:
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Any Pillow image → ``[H, W, 3]`` uint8 RGB (see the module docstring for the rules)."""
    mode = img.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        mode == "P" and "transparency" in img.info
    ):
        img = _composite_on_white(img)
    elif mode in ("I", "F") or mode.startswith("I;16"):
        grey = _to_uint8_grey(np.asarray(img), mode)
        return np.ascontiguousarray(np.repeat(grey[:, :, None], 3, axis=2))
    elif mode != "RGB":
        img = img.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def array_to_rgb(arr: np.ndarray) -> np.ndarray:
    """A decoded array ``[H, W]``, ``[H, W, 1|3|4]`` (uint8) → ``[H, W, 3]`` uint8 RGB."""
    if arr.dtype != np.uint8:
        raise ImageError(CORRUPT, f"array images must be uint8, got {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ImageError(CORRUPT, f"array image has shape {arr.shape}; need [H, W] or [H, W, C]")
    if arr.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(arr, 3, axis=2))
    if arr.shape[2] == 4:
        return pil_to_rgb(Image.fromarray(arr, "RGBA"))
    return np.ascontiguousarray(arr)


def resize_max_side(rgb: np.ndarray, max_side: int) -> np.ndarray:
    """Shrink so that the longer side is ``max_side`` (antialiased); never enlarge."""
    h, w = rgb.shape[:2]
    if max(h, w) <= max_side:
        return rgb
    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.LANCZOS))


def decode_image(data: bytes | np.ndarray, *, max_side: int, min_side: int) -> np.ndarray:
    """Decode, convert to RGB and resize one image.

    Args:
        data: encoded image bytes, or a decoded uint8 array.
        max_side: the longer side is shrunk to this many pixels (aspect ratio kept).
        min_side: images whose shorter side (before resizing) is below this are rejected.

    Returns:
        ``[H, W, 3]`` uint8, C-contiguous.

    Raises:
        ImageError: ``not-an-image`` (Pillow cannot identify it), ``corrupt-image``
            (truncated or undecodable), ``too-small``, ``too-large`` (decompression bomb).
    """
    if isinstance(data, np.ndarray):
        rgb = array_to_rgb(data)
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                opened = Image.open(io.BytesIO(data))
                opened.load()  # truncated files fail here, not later in the writer
                rgb = pil_to_rgb(ImageOps.exif_transpose(opened))
        except UnidentifiedImageError:
            raise ImageError(NOT_AN_IMAGE, "not an image Pillow can read") from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageError(TOO_LARGE, f"too many pixels: {e}") from None
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise ImageError(CORRUPT, f"cannot decode: {e}") from None
    h, w = rgb.shape[:2]
    if min(h, w) < min_side:
        raise ImageError(TOO_SMALL, f"{w}x{h} pixels is below image.min_side={min_side}")
    return resize_max_side(rgb, max_side)
