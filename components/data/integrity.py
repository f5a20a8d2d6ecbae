"""Content hashes, exact and near duplicates, and groups that must stay in one split.

Every item the preprocess pipeline keeps is decoded, converted to RGB and resized exactly as
it will be stored (:func:`components.data.images.decode_image`), then hashed three ways:

* ``bytes_sha256`` — the file's bytes (built-in array datasets: the array's shape and bytes);
* ``pixels_sha256`` — the stored pixels (shape + bytes). Two items with the same value are
  **exact duplicates** — same file under another name, or another encoding of the same
  pixels; the first in listing order is kept, every other copy is skipped as ``duplicate-of``;
* ``phash`` — a 64-bit DCT perceptual hash of the stored image (:func:`phash`), and ``thumb``,
  its 16×16 grey thumbnail (box filter, 256 bytes). Two items are **near duplicates** (a
  resized, re-encoded or slightly altered copy) when their hashes differ in at most
  ``dedupe.near_threshold`` bits **and** their thumbnails differ by at most
  ``dedupe.near_max_diff`` grey levels on average (mean absolute difference, 0–255). Near
  duplicates are joined transitively into groups (:func:`near_duplicate_groups`) and every
  group is placed in one split, so no near-duplicate pair straddles train and test.

The pHash is the classic one (Zauner 2010; the ``imagehash`` package's ``phash``): grey
(ITU-R 601 luma), resized to 32×32 with Lanczos, 2-D DCT-II, the 8×8 lowest frequencies
compared with their median. Measured (tests/data/test_integrity.py, 40 smooth synthetic pictures):
a JPEG re-encoding at quality 70–90 after a resize changes 0–6 bits (8 at quality 60 and a
resize to 5/8) and moves the thumbnail by ≤ 1.2 grey levels; Fashion-MNIST items upsampled 2×,
saved as JPEG (q60) and shrunk back move it by 2–5. Unrelated pictures differ in ≥ 22 bits. The
hash alone is too coarse for small, similar images: on Fashion-MNIST (28 px, black backgrounds)
854k pairs lie within 6 bits and chain into one group of 31k items; the thumbnail check at 4 grey
levels leaves 246 pairs in 91 groups (largest 75). Hence the defaults, 6 bits and 4 grey levels.
Flat images of nearly the same colour are grouped.

Finding all pairs within ``t`` bits without comparing all n² pairs: cut the 64 bits into
``t + 1`` bands; two hashes within ``t`` bits agree exactly on at least one band (pigeonhole),
so only items that share a band value are compared.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence

import numpy as np

HASH_BITS = 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class ItemHashes:
    bytes_sha256: str
    pixels_sha256: str
    phash: int  # 64-bit, as a Python int (unsigned)
    thumb: bytes  # 16x16 grey, uint8


THUMB = 16


def thumbnail(rgb: np.ndarray) -> np.ndarray:
    """``[THUMB * THUMB]`` uint8: the grey image shrunk to 16×16 with a box filter."""
    from PIL import Image

    grey = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    img = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), "L")
    return np.asarray(img.resize((THUMB, THUMB), Image.Resampling.BOX), dtype=np.uint8).reshape(-1)


@functools.lru_cache(maxsize=1)
def _dct_matrix(n: int = 32) -> np.ndarray:
    """Orthonormal DCT-II matrix: ``C @ x`` is the DCT of column vector ``x``."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    c = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c


def phash(rgb: np.ndarray) -> int:
    """64-bit DCT perceptual hash of an ``[H, W, 3]`` uint8 image (see the module docstring).

    Bit ``8 * r + c`` is set when DCT coefficient ``(r, c)`` exceeds the median of the 8×8
    lowest-frequency block. Coefficients are rounded to 1e-6 first so that flat images, whose
    AC terms are zero up to float noise, hash the same on every machine.
    """
    from PIL import Image

    grey = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    small = Image.fromarray(np.clip(np.rint(grey), 0, 255).astype(np.uint8), "L").resize(
        (32, 32), Image.Resampling.LANCZOS
    )
    x = np.asarray(small, dtype=np.float64)
    c = _dct_matrix(32)
    low = np.round((c @ x @ c.T)[:8, :8], 6)
    bits = (low > np.median(low)).reshape(-1)
    return int(np.packbits(bits, bitorder="little").view("<u8")[0])


def pixel_digest(rgb: np.ndarray) -> str:
    h = hashlib.sha256(f"{rgb.shape}".encode())
    h.update(np.ascontiguousarray(rgb).tobytes())
    return h.hexdigest()


def bytes_digest(data: bytes | np.ndarray) -> str:
    if isinstance(data, np.ndarray):
        return pixel_digest(data)
    return hashlib.sha256(data).hexdigest()


def hash_item(data: bytes | np.ndarray, rgb: np.ndarray) -> ItemHashes:
    """The three hashes of one item: its raw ``data`` and its stored pixels ``rgb``."""
    return ItemHashes(bytes_sha256=bytes_digest(data), pixels_sha256=pixel_digest(rgb),
                      phash=phash(rgb), thumb=thumbnail(rgb).tobytes())


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def exact_duplicates(pixel_digests: Sequence[str]) -> dict[int, int]:
    """``{dropped index: kept index}``: every item whose pixels equal an earlier item's."""
    first: dict[str, int] = {}
    out: dict[int, int] = {}
    for i, d in enumerate(pixel_digests):
        if d in first:
            out[i] = first[d]
        else:
            first[d] = i
    return out


class UnionFind:
    """Disjoint sets over ``0..n-1``; :meth:`groups` lists the sets of size ≥ 2."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, i: int) -> int:
        p = self.parent
        root = i
        while p[root] != root:
            root = int(p[root])
        while p[i] != root:  # path compression
            p[i], i = root, int(p[i])
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the smaller index becomes the root: deterministic
            self.parent[max(ra, rb)] = min(ra, rb)

    def labels(self) -> np.ndarray:
        """The root (smallest member) of every element."""
        return np.array([self.find(i) for i in range(len(self.parent))], dtype=np.int64)


def _bands(threshold: int) -> list[tuple[int, int]]:
    """``threshold + 1`` contiguous bit ranges covering the 64 bits."""
    n = threshold + 1
    edges = np.linspace(0, HASH_BITS, n + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def near_pairs(hashes: np.ndarray, threshold: int, block: int = 2048) -> np.ndarray:
    """All pairs ``(i, j)``, ``i < j``, whose hashes differ in at most ``threshold`` bits.

    ``hashes``: ``[n]`` uint64. Returns ``[m, 2]`` int64, sorted. Band bucketing (module
    docstring) keeps this far below n² for real data; buckets are compared block by block.
    """
    h = np.asarray(hashes, dtype=np.uint64)
    if threshold < 0 or len(h) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    found: list[np.ndarray] = []
    for lo, hi in _bands(min(threshold, HASH_BITS - 1)):
        mask = np.uint64((1 << (hi - lo)) - 1)
        key = (h >> np.uint64(lo)) & mask
        order = np.argsort(key, kind="stable")
        sk = key[order]
        cuts = np.flatnonzero(np.diff(sk)) + 1
        for members in np.split(order, cuts):
            if len(members) < 2:
                continue
            members = np.sort(members)
            hm = h[members]
            for s in range(0, len(members), block):
                a = hm[s : s + block]
                for t in range(s, len(members), block):
                    dist = np.bitwise_count(a[:, None] ^ hm[None, t : t + block])
                    ii, jj = np.nonzero(dist <= threshold)
                    ii, jj = ii + s, jj + t
                    keep = jj > ii
                    if keep.any():
                        found.append(np.stack([members[ii[keep]], members[jj[keep]]], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = np.unique(np.concatenate(found).astype(np.int64), axis=0)
    return pairs


def thumb_diff(thumbs: np.ndarray, pairs: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Mean absolute difference (grey levels) of the thumbnails of each pair."""
    out = np.empty(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), chunk):
        p = pairs[s : s + chunk]
        a = thumbs[p[:, 0]].astype(np.int16)
        out[s : s + chunk] = np.abs(a - thumbs[p[:, 1]]).mean(axis=1)
    return out


def near_duplicate_groups(
    hashes: np.ndarray, thumbs: np.ndarray, threshold: int, max_diff: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(root, pairs)``: ``root[i]`` is the smallest index in item i's near-duplicate group
    (itself when it has none); ``pairs`` ``[m, 2]`` are the near-duplicate pairs found (within
    ``threshold`` bits and ``max_diff`` grey levels, module docstring)."""
    pairs = near_pairs(hashes, threshold)
    if len(pairs):
        pairs = pairs[thumb_diff(np.asarray(thumbs, dtype=np.uint8), pairs) <= max_diff]
    uf = UnionFind(len(hashes))
    for a, b in pairs.tolist():
        uf.union(a, b)
    return uf.labels(), pairs


def groups_from_roots(root: np.ndarray) -> list[list[int]]:
    """The groups of size ≥ 2 as sorted index lists, ordered by their first member."""
    out: dict[int, list[int]] = {}
    for i, r in enumerate(root.tolist()):
        out.setdefault(r, []).append(i)
    return [g for _, g in sorted(out.items()) if len(g) > 1]


def verify_identity(root: str, expected: dict[str, object] | None, run: str,
                    use: str) -> None:
    """Check, before the split files of the dataset dir ``root`` are opened for ``use``, that
    it is still the dataset run ``run`` started on: its ``manifest.json`` gives the same
    :func:`components.data.identity.dataset_identity` (build parameters, split sha256s, classes) as
    ``expected``. A ``simgraph preprocess --overwrite`` that swapped a rebuild in since would
    otherwise have the run read the new files (the kNN loaders open them only at the first
    kNN epoch). Cheap: one small JSON read; ``expected`` ``None`` checks nothing.

    Raises:
        DatasetError: no manifest now (a rebuild being swapped in), or a different identity
            (naming what changed and what to do).
    """
    import json
    from pathlib import Path

    from components.data.identity import dataset_identity, identity_diff
    from components.data.reader import DatasetError
    from components.data.shards import MANIFEST

    if expected is None:
        return
    path = Path(root) / MANIFEST
    fix = ("restore the dataset the run started on, or start a new run (a new name=) on the "
           "new one; the run's checkpoints stay in its run dir")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(f"run {run!r}: {path} cannot be read before {use} ({e}); the dataset "
                           f"is being rebuilt or was removed: {fix}") from None
    now = dataset_identity(manifest) if isinstance(manifest, dict) else {}
    diff = identity_diff(dict(expected), now)
    if diff:
        raise DatasetError(
            f"run {run!r}: the dataset {root} changed since the run started "
            f"({', '.join(diff)} differ: rebuilt or replaced, e.g. by `simgraph preprocess "
            f"--overwrite`); {use} would read other data than the run trained on: {fix}")
