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

The pairs within ``t`` bits are found without comparing all n² pairs by
:mod:`components.data.hash_search` (multi-index hashing).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from collections.abc import Sequence

import numpy as np

from components.data.hash_search import KeyMapper, near_pairs
from components.io.spill import release


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


def exact_duplicates(digests: Sequence[str | bytes] | np.ndarray, *,
                     rows: np.ndarray | None = None, chunk: int = 1 << 16) -> dict[int, int]:
    """``{dropped index: kept index}``: every item whose digest equals an earlier item's, kept
    the first (digests as hex strings or raw bytes; or a numpy array of them, e.g. ``[n]``
    ``S32``: :func:`duplicate_rows`, sorted instead of a dict entry per item)."""
    if isinstance(digests, np.ndarray):
        dropped, kept = duplicate_rows(digests, rows=rows, chunk=chunk)
        return dict(zip(dropped.tolist(), kept.tolist(), strict=True))
    items = list(digests) if rows is None else [digests[i] for i in rows.tolist()]
    first: dict[str | bytes, int] = {}
    out: dict[int, int] = {}
    for i, digest in enumerate(items):
        if digest in first:
            out[i] = first[digest]
        else:
            first[digest] = i
    return out


def duplicate_rows(digests: np.ndarray, *, rows: np.ndarray | None = None,
                   chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """``(dropped, kept)`` int64, ``dropped`` ascending: every item of the digest array
    ``digests`` (e.g. ``[n]`` ``S32``) equal to an earlier one, and that first copy.

    The array is read ``chunk`` rows at a time, and only each digest's first 8 bytes are sorted
    (24 B an item at the peak, not a copy of every digest): the full digests are compared only
    where those agree. ``rows``: the items are ``digests[rows]`` (indices returned are
    positions in ``rows``), read without copying them all out. An array mapped from a file
    (``content.npz``'s, as a build holds them) gives back each chunk's pages after it
    (``MADV_DONTNEED``), as :func:`thumb_diff` does."""
    none = np.zeros(0, dtype=np.int64)
    m = len(digests) if rows is None else len(rows)
    if m < 2:
        return none, none
    width = digests.dtype.itemsize
    lead = np.zeros((m, 8), dtype=np.uint8)  # each digest's first 8 bytes (zero-padded)
    for s in range(0, m, chunk):
        part = np.ascontiguousarray(digests[s : s + chunk] if rows is None
                                    else digests[rows[s : s + chunk]])
        raw = np.frombuffer(part.tobytes(), np.uint8).reshape(len(part), width)
        lead[s : s + len(part), : min(width, 8)] = raw[:, :8]
        release(digests)
    key = lead.view(np.uint64).reshape(m)
    del lead
    order = np.argsort(key, kind="stable")
    sk = key[order]
    same = sk[1:] == sk[:-1]
    del key, sk
    if not same.any():
        return none, none
    shared = np.zeros(m, dtype=bool)  # sorted positions whose lead another item has
    shared[1:] = same
    shared[:-1] |= same
    cand = np.sort(order[shared])  # positions, ascending: the first copy stays first
    del order, shared, same
    full = np.asarray(digests[cand] if rows is None else digests[rows[cand]])
    # the candidates by one stable sort of their whole digests (equal ones in index order)
    order = np.argsort(full, kind="stable")
    sd = full[order]
    dup = np.flatnonzero(sd[1:] == sd[:-1]) + 1
    starts = np.flatnonzero(np.r_[True, sd[1:] != sd[:-1]])
    first = order[starts[np.searchsorted(starts, dup, side="right") - 1]]
    by = np.argsort(order[dup], kind="stable")
    return cand[order[dup]][by], cand[first][by]


def group_roots(n: int, pairs: np.ndarray) -> np.ndarray:
    """``[n]`` int64: the root of every item ``0..n-1`` when the ``pairs`` ``[m, 2]`` are
    joined transitively: the smallest index of its connected component (itself when alone).
    Work beyond the answer is on the items in pairs only (a build's n is millions, its pairs
    few)."""
    root = np.arange(n, dtype=np.int64)
    nodes, local = _pair_nodes(pairs)
    if len(nodes):
        root[nodes] = nodes[_component_roots(len(nodes), local)]
    return root


def pair_groups(pairs: np.ndarray) -> list[list[int]]:
    """The groups the ``pairs`` join (sorted index lists, by their first member): what
    ``groups_from_roots(group_roots(n, pairs))`` gives, on the items in pairs only."""
    nodes, local = _pair_nodes(pairs)
    return [nodes[g].tolist() for g in groups_from_roots(_component_roots(len(nodes), local))]


def _pair_nodes(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, local)``: the items in ``pairs``, ascending, and the pairs as indices into
    them (``[m, 2]``)."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    nodes, local = np.unique(p, return_inverse=True)
    return nodes, local.reshape(-1, 2)


def _component_roots(n: int, pairs: np.ndarray) -> np.ndarray:
    """:func:`group_roots` of ``n`` items, by scipy's connected components."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if n == 0:
        return np.zeros(0, dtype=np.int64)
    graph = coo_matrix((np.ones(len(pairs), dtype=np.int8), (pairs[:, 0], pairs[:, 1])),
                       shape=(n, n))
    _, label = connected_components(graph, directed=False)
    # the first index carrying each label is the smallest member of that component
    _, first = np.unique(label, return_index=True)
    return first[label].astype(np.int64)


def thumb_diff(thumbs: np.ndarray, pairs: np.ndarray, chunk: int = 1 << 13) -> np.ndarray:
    """Mean absolute difference (grey levels) of the thumbnails of each pair.

    ``thumbs`` mapped from a file (``content.npz``, as a build holds them): the pages each
    chunk of pairs brought into this process are let go after it (``MADV_DONTNEED``; the
    file's clean pages stay in the page cache), so reading candidate pairs spread over every
    page does not grow the process by the whole file (256 B an item: 3 GB at 12M items) but
    by at most a chunk's pages (2 a pair: 64 MiB)."""
    out = np.empty(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), chunk):
        p = pairs[s : s + chunk]
        a = thumbs[p[:, 0]].astype(np.int16)
        out[s : s + chunk] = np.abs(a - thumbs[p[:, 1]]).mean(axis=1)
        release(thumbs)
    return out


def near_duplicate_groups(
    hashes: np.ndarray, thumbs: np.ndarray, threshold: int, max_diff: float,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(root, pairs)``: ``root[i]`` is the smallest index in item i's near-duplicate group
    (itself when it has none; the pairs' connected components, :func:`group_roots`);
    ``pairs`` ``[m, 2]`` are the near-duplicate pairs found (within ``threshold`` bits and
    ``max_diff`` grey levels, module docstring). ``rows``: item i's thumbnail is
    ``thumbs[rows[i]]`` (default ``thumbs[i]``): a subset's, without copying every one out."""
    pairs = near_duplicate_pairs(hashes, thumbs, threshold, max_diff, rows)
    return group_roots(len(hashes), pairs), pairs


def near_duplicate_pairs(
    hashes: np.ndarray, thumbs: np.ndarray, threshold: int, max_diff: float,
    rows: np.ndarray | None = None, map_keys: KeyMapper | None = None, tasks: int = 1,
) -> np.ndarray:
    """The ``pairs`` of :func:`near_duplicate_groups` alone (``[m, 2]`` int64, sorted): for a
    caller that joins them with other pairs before taking roots (a build's plan: no ``[n]``
    roots made twice). ``map_keys`` / ``tasks``: the hash search spread, as
    :func:`near_pairs`'; the thumbnails are compared here."""
    pairs = near_pairs(hashes, threshold, map_keys=map_keys, tasks=tasks)
    if len(pairs):
        at = pairs if rows is None else rows[pairs]
        pairs = pairs[thumb_diff(np.asarray(thumbs, dtype=np.uint8), at) <= max_diff]
    return pairs


def groups_from_roots(root: np.ndarray) -> list[list[int]]:
    """The groups of size ≥ 2 as sorted index lists, ordered by their root (the first member,
    for :func:`group_roots`'). Sorted on arrays: no list per item (a dict of one per item was
    the plan's largest transient at 40k, ~250 B an item)."""
    root = np.asarray(root)
    if not len(root):
        return []
    _, inverse, counts = np.unique(root, return_inverse=True, return_counts=True)
    idx = np.flatnonzero(counts[inverse.reshape(-1)] > 1)
    order = idx[np.argsort(root[idx], kind="stable")]  # by root, then index
    if not len(order):
        return []
    r = root[order]
    bounds = np.flatnonzero(np.r_[True, r[1:] != r[:-1], True])
    return [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]


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
