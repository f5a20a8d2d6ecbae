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
resize replaced by :func:`resize_crop_bilinear`: separable, antialiased bilinear (PIL's /
``torch.nn.functional.interpolate(antialias=True)``'s triangle filter, support widened by the
scale when shrinking, weights renormalised at the borders) in torch's uint8 fixed point: int16-
range weights computed once per call and axis, a horizontal pass over the crop's rows only into
a uint8 buffer, then a vertical pass, int32 accumulators, rounded half up. On uint8 images it
gives ``torchvision.transforms.v2.functional.resized_crop(..., antialias=True)``'s pixels
(identical where torch takes its uint8 path; within 1 grey level is what the tests promise),
at 0.1–0.25 ms per 224-px view here against 0.5–0.8 ms for the float32 kernel it replaced
(docs/benchmarks.md, "224-px views through the reader").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from ffcv.pipeline.allocation_query import AllocationQuery
from ffcv.pipeline.state import State
from numba import njit


@njit(cache=True, nogil=True)
def triangle_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: first input index, tap count and ``[n_out, taps]`` float64 weights
    (normalised to sum 1) of the antialiased triangle filter, half-pixel centres."""
    scale = n_in / n_out
    support = max(scale, 1.0)  # bilinear support 1, widened when shrinking
    taps = int(np.ceil(support)) * 2 + 1
    first = np.zeros(n_out, np.int64)
    count = np.zeros(n_out, np.int64)
    w = np.zeros((n_out, taps), np.float64)
    inv = 1.0 / support
    for o in range(n_out):
        centre = (o + 0.5) * scale
        lo = max(int(centre - support + 0.5), 0)
        hi = min(int(centre + support + 0.5), n_in)
        total = 0.0
        for k in range(hi - lo):
            v = max(0.0, 1.0 - abs((k + lo - centre + 0.5) * inv))
            w[o, k] = v
            total += v
        if total > 0.0:
            for k in range(hi - lo):
                w[o, k] /= total
        first[o], count[o] = lo, hi - lo
    return first, count, w


@njit(cache=True, nogil=True)
def _weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per output index: first input index, tap count, ``[n_out, taps]`` int32 fixed-point
    weights of the antialiased triangle filter (:func:`triangle_weights`) and their precision
    in bits — torch's uint8 kernel's rule: weights computed in float64, normalised, scaled by
    ``2**p`` (the largest ``p <= 22`` with ``2 * max_weight * 2**p < 2**15``) and rounded half
    away from zero. Taps whose fixed-point weight is 0 are dropped from both ends."""
    first, count, w = triangle_weights(n_in, n_out)
    taps = w.shape[1]
    w_max = 0.0
    for o in range(n_out):
        for k in range(count[o]):
            w_max = max(w_max, w[o, k])
    precision = 0
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    iw = np.zeros((n_out, taps), np.int32)
    q = np.zeros(taps, np.int32)
    unit = float(1 << precision)
    for o in range(n_out):
        n = count[o]
        for k in range(n):
            q[k] = int(0.5 + w[o, k] * unit)  # weights are >= 0: half away from zero
        a, b = 0, n
        while a < b and q[a] == 0:
            a += 1
        while b > a and q[b - 1] == 0:
            b -= 1
        for k in range(a, b):
            iw[o, k - a] = q[k]
        first[o] += a
        count[o] = b - a
    return first, count, iw, precision


@njit(cache=True, nogil=True)
def _gather_table(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The horizontal pass's weights laid out per output *value* (``3 * n_out`` of them, RGB
    interleaved) with one tap count ``T`` for all (the largest; zero weights pad the rest):
    ``out[j] = sum_k W[k, j] * row[idx[j] + 3 k]``. Each output's window is moved left where
    it would run past the row's end, its weights shifted with it."""
    first, count, w, precision = _weights(n_in, n_out)
    taps = 1
    for o in range(n_out):
        taps = max(taps, count[o])
    idx = np.empty(3 * n_out, np.uint32)
    table = np.zeros((taps, 3 * n_out), np.int32)
    for o in range(n_out):
        start = min(first[o], n_in - taps)
        for k in range(count[o]):
            for c in range(3):
                table[first[o] - start + k, 3 * o + c] = w[o, k]
        for c in range(3):
            idx[3 * o + c] = 3 * start + c
    return idx, table, precision


@njit(cache=True, nogil=True)
def _resize_bilinear(src: np.ndarray, top: int, bottom: int, left: int, right: int,
                     dst: np.ndarray, mirror: bool = False) -> None:
    """``src[top:bottom, left:right]`` (uint8 [H, W, 3], C-contiguous) resized into ``dst``
    (uint8 [h, w, 3], C-contiguous) as torch's uint8 kernel does — the same fixed-point
    weights and roundings, so the same pixels as ``torchvision``'s ``resized_crop(...,
    antialias=True)`` on uint8: a horizontal pass over the crop's rows only into a uint8
    buffer (rounded half up, clamped), then a vertical pass, both with int32 accumulators.
    Both passes run over whole rows of ``3 * w`` values (the vertical one contiguous, the
    horizontal one through an index table), which the compiler vectorises. ``mirror``: the
    horizontal pass's table is laid out with the output pixels in reverse order, so the rows
    come out mirrored and the vertical pass keeps them so — a horizontal flip of the result at
    no cost of its own (FFCV's flip op copies every view, flipped or not: 0.28 ms per 224-px
    view here)."""
    h_in, w_in = bottom - top, right - left
    h_out, w_out = dst.shape[0], dst.shape[1]
    if h_in <= 0 or w_in <= 0:  # an empty crop: black, as the float kernel gave
        dst[:] = 0
        return
    n = w_out * 3
    idx, table, px = _gather_table(w_in, w_out)
    if mirror:  # output pixel x takes pixel w - 1 - x's window and weights: rows come mirrored
        idx = idx.reshape(w_out, 3)[::-1].copy().reshape(n)
        table = table.reshape(table.shape[0], w_out, 3)[:, ::-1, :].copy().reshape(
            table.shape[0], n)
    fy, cy, wy, py = _weights(h_in, h_out)
    flat = src.reshape(src.shape[0], src.shape[1] * 3)
    rows = np.empty((h_in, n), np.uint8)
    acc = np.empty(n, np.int32)
    half_x = np.int32(1 << (px - 1)) if px > 0 else np.int32(0)
    for r in range(h_in):
        line = flat[top + r, 3 * left:3 * right]
        for j in range(n):
            acc[j] = half_x
        for k in range(table.shape[0]):
            wk = table[k]
            off = np.uint32(3 * k)
            for j in range(n):
                acc[j] += wk[j] * np.int32(line[np.uint64(idx[j] + off)])
        out = rows[r]
        for j in range(n):
            v = acc[j] >> px
            out[j] = v if v < 255 else 255
    half_y = np.int32(1 << (py - 1)) if py > 0 else np.int32(0)
    flat_dst = dst.reshape(h_out, n)
    for o in range(h_out):
        wt = wy[o, 0]
        row = rows[fy[o]]
        for j in range(n):
            acc[j] = half_y + wt * np.int32(row[j])
        for k in range(1, cy[o]):
            wt = wy[o, k]
            row = rows[fy[o] + k]
            for j in range(n):
                acc[j] += wt * np.int32(row[j])
        out = flat_dst[o]
        for j in range(n):
            v = acc[j] >> py
            out[j] = v if v < 255 else 255


def flipping_resize(flip_p: float) -> Callable[..., None]:
    """``libffcv.resize_crop``'s signature, bilinear with antialias, mirrored with probability
    ``flip_p`` (torchvision's ``RandomHorizontalFlip`` after the crop, fused into the resize;
    one draw per image right after FFCV's crop draws; none when ``flip_p`` is 0)."""

    def resize(source: np.ndarray, start_row: int, end_row: int, start_col: int, end_col: int,
               destination: np.ndarray) -> None:
        mirror = flip_p > 0 and np.random.rand() < flip_p
        _resize_bilinear(source, start_row, end_row, start_col, end_col, destination, mirror)

    return resize


def resize_crop_bilinear(source: np.ndarray, start_row: int, end_row: int, start_col: int,
                         end_col: int, destination: np.ndarray) -> None:
    """``libffcv.resize_crop``'s signature, bilinear with antialias (FFCV compiles this
    wrapper into its pipeline; the kernel itself is always numba-compiled)."""
    _resize_bilinear(source, start_row, end_row, start_col, end_col, destination)


def _with_bilinear_resize(generate: Callable[[], Callable[..., Any]],
                          resize: Callable[..., None] = resize_crop_bilinear
                          ) -> Callable[..., Any]:
    """Run FFCV's ``generate_code`` with its module-level ``resize_crop`` (which it compiles
    into the decode function when the code is generated) replaced by ``resize``."""
    import ffcv.fields.rgb_image as rgb_image

    original = rgb_image.resize_crop
    rgb_image.resize_crop = resize
    try:
        return generate()
    finally:
        rgb_image.resize_crop = original


class BilinearRandomResizedCrop(RandomResizedCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV's random resized crop decoder (its crop parameters and random stream), resized
    bilinearly with antialias as torchvision's ``RandomResizedCrop``; ``flip_p``: then
    mirrored with that probability (:func:`flipping_resize`: instead of FFCV's
    ``RandomHorizontalFlip``, which copies every view).

    Raises:
        ValueError: ``flip_p`` outside [0, 1].
    """

    def __init__(self, output_size: tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float = 0.0) -> None:
        super().__init__(output_size, scale=scale, ratio=ratio)
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p={flip_p!r} is not allowed: give a probability in [0, 1]")
        self.flip_p = float(flip_p)

    def generate_code(self) -> Callable[..., Any]:
        return _with_bilinear_resize(super().generate_code, flipping_resize(self.flip_p))


class BilinearCenterCrop(CenterCropRGBImageDecoder):  # type: ignore[misc]
    """FFCV's centre crop decoder, resized bilinearly with antialias as torchvision's
    ``Resize``."""

    def generate_code(self) -> Callable[..., Any]:
        return _with_bilinear_resize(super().generate_code)


class BilinearRandomResizedCropViews(BilinearRandomResizedCrop):  # type: ignore[misc]
    """:class:`BilinearRandomResizedCrop` of ``views`` views per image from **one decode**:
    ``[views, H, W, 3]`` per sample. FFCV decodes a stored field once per pipeline, so two
    views as two pipelines decoded every JPEG twice (0.18–0.20 ms per 224-px view here, as
    much as the crop); torchvision's recipe decodes once and crops twice, as this does. Each
    view draws its own crop and flip (crop, flip, next view's crop, ...: independent views of
    one image). For views with nothing per-sample after the crop in FFCV (no CPU colour ops:
    the GPU path, or views without jitter / grayscale); :mod:`components.data.view_ops`
    decides.

    Raises:
        ValueError: ``views`` < 1, or ``flip_p`` outside [0, 1].
    """

    def __init__(self, output_size: tuple[int, int], views: int,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float = 0.0) -> None:
        super().__init__(output_size, scale=scale, ratio=ratio, flip_p=flip_p)
        if views < 1:
            raise ValueError(f"views={views!r} is not allowed: give at least 1 view")
        self.views = int(views)

    def declare_state_and_memory(self, previous_state: State) -> tuple[State, Any]:
        state, (_, temp) = super().declare_state_and_memory(previous_state)
        shape = (self.views, self.output_size[0], self.output_size[1], 3)
        return replace(state, shape=shape), (AllocationQuery(shape, np.dtype("<u1")), temp)

    def generate_code(self) -> Callable[..., Any]:
        # FFCV's ResizedCropRGBImageDecoder.generate_code with the crop and resize repeated
        # per view after the one decode.
        from ffcv.fields.rgb_image import IMAGE_MODES
        from ffcv.libffcv import imdecode
        from ffcv.pipeline.compiler import Compiler

        jpg = IMAGE_MODES["jpg"]
        mem_read = self.memory_read
        my_range = Compiler.get_iterator()
        imdecode_c = Compiler.compile(imdecode)
        resize_c = Compiler.compile(flipping_resize(self.flip_p))
        get_crop_c = Compiler.compile(self.get_crop_generator)
        scale, ratio = np.array(self.scale), np.array(self.ratio)
        views = self.views

        def decode(batch_indices: Any, my_storage: Any, metadata: Any,
                   storage_state: Any) -> Any:
            destination, temp_storage = my_storage
            for dst_ix in my_range(len(batch_indices)):
                field = metadata[batch_indices[dst_ix]]
                image_data = mem_read(field["data_ptr"], storage_state)
                height, width = np.uint32(field["height"]), np.uint32(field["width"])
                if field["mode"] == jpg:
                    temp_buffer = temp_storage[dst_ix]
                    imdecode_c(image_data, temp_buffer, height, width, height, width, 0, 0, 1,
                               1, False, False)
                    temp_buffer = temp_buffer.reshape(-1)[:3 * height * width].reshape(
                        height, width, 3)
                else:
                    temp_buffer = image_data.reshape(height, width, 3)
                for v in range(views):
                    i, j, h, w = get_crop_c(height, width, scale, ratio)
                    resize_c(temp_buffer, i, i + h, j, j + w, destination[dst_ix, v])
            return destination[:len(batch_indices)]

        decode.is_parallel = True  # type: ignore[attr-defined]
        return decode
