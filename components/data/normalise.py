"""The reader's CPU normalisation: FFCV's ``[B, H, W, 3]`` uint8 views into the batch's
``[B, 3, H, W]`` float32 tensor, ``(x - mean) / std`` per channel, in one pass, into host
buffers reused once the consumer has dropped every reference to them.

FFCV's ``ToTorchImage(channels_last=False)`` copied every view into a ``[B, 3, H, W]`` uint8
buffer (0.22 ms per 224-px view here), and torch's broadcast ``sub`` + ``div`` of uint8 into
float32 at one thread took another 0.42–0.52 ms. :func:`normalise_hwc_into` reads the HWC
buffer as FFCV left it and writes each channel's rows in order through a 256-entry table per
channel (:func:`normalise_table`: the float32 result of ``(v - mean) / std`` for every uint8
``v``, so the same IEEE subtraction and division as torch's, bit for bit, tested): 0.065 ms per
view against 0.13 for computing it per pixel.

A fresh 77 MB batch tensor (64 × 2 views of 224 px) costs more than the normalisation: glibc
maps each allocation above its mmap threshold anew, and every 4 KiB page faults on first write
(147 per view, 0.26 ms per view here). :class:`HostBatchPool` hands out the same few buffers
again once nothing references them (docs/benchmarks.md, "224-px views through the reader").
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from numba import njit


def normalise_table(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """float32 ``[3, 256]``: ``(float32(v) - mean[c]) / std[c]`` for every uint8 ``v``.

    Args:
        mean, std: float32 ``[3]``, on the 0–255 scale.
    """
    mean = np.asarray(mean, np.float32).reshape(3, 1)
    std = np.asarray(std, np.float32).reshape(3, 1)
    return np.ascontiguousarray((np.arange(256, dtype=np.float32)[None] - mean) / std)


@njit(cache=True, nogil=True)
def normalise_hwc_into(src: np.ndarray, dst: np.ndarray, table: np.ndarray) -> None:
    """``dst[b, c, y, x] = table[c, src[b, y, x, c]]``, i.e. ``(src - mean[c]) / std[c]``.

    Args:
        src: uint8 ``[B, H, W, 3]``, each image C-contiguous (FFCV's output buffer).
        dst: float32 ``[B, 3, H, W]``, each ``[H, W]`` plane's rows contiguous (one view of
            the batch's ``[B, V, 3, H, W]`` tensor).
        table: float32 ``[3, 256]`` from :func:`normalise_table`.
    """
    t0, t1, t2 = table[0], table[1], table[2]
    for b in range(src.shape[0]):
        for y in range(src.shape[1]):
            row = src[b, y]
            o0, o1, o2 = dst[b, 0, y], dst[b, 1, y], dst[b, 2, y]
            for x in range(src.shape[2]):
                o0[x] = t0[row[x, 0]]
                o1[x] = t1[row[x, 1]]
                o2[x] = t2[row[x, 2]]


class HostBatchPool:
    """float32 host tensors for the reader's batches, each handed out again only when nothing
    references it any more.

    A tensor made by ``torch.from_numpy`` keeps its array alive for as long as any tensor on
    its storage lives (views, slices, ``.numpy()`` of them, autograd's saved inputs). So an
    array of the pool whose only references are the pool's own is one no batch, no slice of
    one and no pending backward pass can still read: it is safe to overwrite. A consumer that
    keeps every batch gets a new buffer each time, as before (the pool holds at most ``keep``
    buffers per shape; the others are the consumer's alone).

    Args:
        keep: buffers kept per shape (a consumer holding this many batches at once still
            reuses them).
    """

    def __init__(self, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        self.keep = keep
        self._arrays: dict[tuple[int, ...], list[np.ndarray]] = {}
        self.made = 0  # buffers allocated (tests: reuse happened)

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A float32 tensor of ``shape`` whose buffer no one else references (contents
        undefined: the caller overwrites all of it)."""
        arrays = self._arrays.setdefault(tuple(shape), [])
        for i in range(len(arrays)):
            # references: the list's, and getrefcount's argument
            if sys.getrefcount(arrays[i]) == 2:
                return torch.from_numpy(arrays[i])
        arr = np.empty(shape, np.float32)
        self.made += 1
        if len(arrays) < self.keep:
            arrays.append(arr)
        return torch.from_numpy(arr)
