"""64-bit hashes for the near-duplicate search's tests and bench: near copies of given ones."""

from __future__ import annotations

import numpy as np


def flip_bits(h: np.ndarray, most: int, rng: np.random.Generator) -> np.ndarray:
    """``h`` ``[n]`` uint64 with 0..``most`` random bits of each hash flipped (a bit drawn
    twice flips back: at most ``most`` differ)."""
    h = h.copy()
    count = rng.integers(0, most + 1, len(h))
    bits = rng.integers(0, 64, (len(h), most)).astype(np.uint64)
    for c in range(most):
        h[count > c] ^= np.uint64(1) << bits[count > c, c]
    return h
