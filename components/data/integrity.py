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

Finding all pairs within ``t`` bits without comparing all n² pairs (:func:`near_pairs`,
multi-index hashing): cut the 64 bits into ``m`` blocks; two hashes within ``t`` bits differ in
at most ``t`` blocks, so they agree exactly on at least ``k = m - t`` of them (generalised
pigeonhole). For every k-subset of the blocks the items are sorted by those blocks' bits (the
key), only items sharing a key are compared (XOR, popcount), and a pair is kept under the first
subset it agrees on only, so each is found once: the same pairs as comparing all n². ``m = t +
1`` is the classic band scheme (with ``t = 6``, seven 9-bit keys: buckets of n/512 items, a
quadratic search); more blocks mean more, longer keys and smaller buckets (``t = 6``: ``m = 8``,
28 keys of 16 bits; 9, 84 of ~21; 10, 210 of ~26). :func:`choose_blocks` picks ``m`` by a cost
model measured here: keys × n × (12 ns + 14 ns per 16-bit radix-sort pass) + candidate pairs ×
17 ns (9 ns in buckets above 64 items), the candidates at least the uniform hashes' n²/2 ·
Σ 2^-key bits, or more as a sample of 2,048 hashes shows for clumpy data. Measured
(``bench/near_duplicates.py``, docs/benchmarks.md; 2-core VM, shared), threshold 6, uniform
hashes: 50k 0.07 s, 100k 0.19, 200k 0.46, 400k 1.3 (m = 8), 1M 6.1 s (m = 9), ×2.5–3.2 per
doubling (the bands: 0.29, 0.87, 2.0, 7.8, 54 s, ×2.3–4.3); Fashion-MNIST's 70k pHashes (853,572
pairs within 6 bits, clumpy): 0.90 s (m = 9; the bands 3.9 s).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import mmap
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

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
    width, mapped = digests.dtype.itemsize, _mapping(digests)
    lead = np.zeros((m, 8), dtype=np.uint8)  # each digest's first 8 bytes (zero-padded)
    for s in range(0, m, chunk):
        part = np.ascontiguousarray(digests[s : s + chunk] if rows is None
                                    else digests[rows[s : s + chunk]])
        raw = np.frombuffer(part.tobytes(), np.uint8).reshape(len(part), width)
        lead[s : s + len(part), : min(width, 8)] = raw[:, :8]
        if mapped is not None:
            mapped.madvise(mmap.MADV_DONTNEED)
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


def _blocks(m: int) -> list[tuple[int, int]]:
    """``m`` contiguous bit ranges ``(lo, width)`` covering the 64 bits, widths differing by
    at most one."""
    edges = np.linspace(0, HASH_BITS, m + 1).round().astype(int)
    return [(int(a), int(b - a)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


# The cost model of near_pairs (seconds, measured on the 2-core x86_64 VM with AVX-512, numpy
# 2.4, uniform hashes at n = 400k-800k, where the choice matters; smaller n costs less per
# item, its arrays fitting in cache): one key costs n x (_KEY_S + _DIGIT_S per 16-bit radix
# pass of its sort), one candidate pair (generated, XOR-popcount verified) _PAIR_S in a bucket
# of up to BIG items (compared one offset at a time), _BIG_PAIR_S in a larger one (compared
# block by block).
_KEY_S = 12e-9  # the key's shifts / masks, the gather of the sorted keys, bucket boundaries
_DIGIT_S = 14e-9  # one stable counting-sort pass over a 16-bit digit and its gather
_PAIR_S = 17e-9
_BIG_PAIR_S = 9e-9
BIG = 64  # a bucket of more items is compared on its own, block by block
_MAX_KEYS = 1000  # never more k-subsets than this
_SAMPLE = 2048  # hashes whose key collisions estimate a scheme's candidates (clumpy data)


def _key(h: np.ndarray, blocks: list[tuple[int, int]], subset: tuple[int, ...]) -> np.ndarray:
    """The bits of the blocks in ``subset`` of every hash, concatenated (adjacent blocks
    taken as one range)."""
    key = np.zeros(len(h), dtype=np.uint64)
    shift = 0
    runs: list[tuple[int, int]] = []
    for b in subset:
        lo, w = blocks[b]
        if runs and runs[-1][0] + runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], runs[-1][1] + w)
        else:
            runs.append((lo, w))
    for lo, w in runs:
        part = h >> np.uint64(lo) if lo else h
        if w < HASH_BITS:
            part = part & np.uint64((1 << w) - 1)
        key |= part << np.uint64(shift) if shift else part
        shift += w
    return key


def _sort_order(key: np.ndarray, width: int) -> np.ndarray:
    """The stable order that sorts ``key`` (``width`` bits): an LSD radix sort of 16-bit
    digits (numpy's stable argsort of uint16 / uint8 is a counting sort) up to 32 bits,
    several times faster than a comparison sort at these sizes; wider keys: numpy's sort."""
    if width > 32:
        return np.argsort(key, kind="stable")
    order: np.ndarray | None = None
    for lo in range(0, width, 16):
        kind = np.uint8 if width - lo <= 8 else np.uint16
        digit = ((key >> lo) & int(np.iinfo(kind).max)).astype(kind)
        if order is None:
            order = np.argsort(digit, kind="stable")
        else:
            order = order[np.argsort(digit[order], kind="stable")]
    assert order is not None
    return order


def _scheme_cost(n: int, t: int, m: int, sample: np.ndarray | None) -> float:
    """Modelled seconds of :func:`near_pairs` on ``n`` hashes with ``m`` blocks (the
    constants above); ``sample``: some of the hashes, whose key collisions estimate how many
    candidates clumpy hashes give (at least as many as uniform ones)."""
    blocks = _blocks(m)
    pairs = n * (n - 1) / 2
    sorts = uniform = clumpy = 0.0
    for sub in itertools.combinations(range(m), m - t):
        width = sum(blocks[b][1] for b in sub)
        sorts += n * (_KEY_S + _DIGIT_S * (-(-width // 16) if width <= 32 else 4))
        uniform += pairs * 2.0 ** -width * (_BIG_PAIR_S if n * 2.0 ** -width > BIG else _PAIR_S)
        if sample is not None:
            _, counts = np.unique(_key(sample, blocks, sub), return_counts=True)
            hits = counts * (counts - 1) / 2
            big = counts * n / len(sample) > BIG  # the bucket's size in all n, estimated
            clumpy += float(hits[big].sum() * _BIG_PAIR_S + hits[~big].sum() * _PAIR_S)
    if sample is not None:
        clumpy *= pairs / (len(sample) * (len(sample) - 1) / 2)
    return sorts + max(uniform, clumpy)


def choose_blocks(hashes: np.ndarray, threshold: int) -> int:
    """The number of blocks ``m`` :func:`near_pairs` cuts the 64 bits into for ``hashes``:
    the cheapest by the cost model (module docstring) from ``threshold + 1`` (one key per
    block: the classic pigeonhole bands) up to where a key outgrows ``log2(n) + 8`` bits or
    the keys number more than 1,000. With more than 8,192 hashes a sample of 2,048 measures
    how often each scheme's keys collide: clumpy hashes collide far more often than uniform
    ones, which favours fewer keys."""
    h = np.asarray(hashes, dtype=np.uint64).reshape(-1)
    t, n = threshold, len(h)
    if t <= 0:
        return 1
    if t >= HASH_BITS - 1 or n < 2:
        return min(t + 1, HASH_BITS)
    sample = None
    if n > 4 * _SAMPLE:
        sample = h[np.random.default_rng(0).choice(n, _SAMPLE, replace=False)]
    best, best_cost = t + 1, _scheme_cost(n, t, t + 1, sample)
    for m in range(t + 2, HASH_BITS + 1):
        k = m - t
        if math.comb(m, k) > _MAX_KEYS or HASH_BITS * k / m > np.log2(n) + 8:
            break
        cost = _scheme_cost(n, t, m, sample)
        if cost < best_cost:
            best, best_cost = m, cost
    return best


KeyMapper = Callable[[Callable[..., np.ndarray], Sequence[Any], dict[str, Any]],
                     Iterable[np.ndarray]]
"""``map_keys(fn, args, kwargs)``: ``fn(a, **kwargs)`` for each ``a`` in ``args``, anywhere
(a build's Ray tasks: ``components.data.build.tasks.iter_tasks``), results in any order."""


def near_pairs(hashes: np.ndarray, threshold: int, *, blocks: int | None = None,
               block: int = 2048, chunk: int = 1 << 16, map_keys: KeyMapper | None = None,
               tasks: int = 1) -> np.ndarray:
    """All pairs ``(i, j)``, ``i < j``, whose hashes differ in at most ``threshold`` bits.

    ``hashes``: ``[n]`` uint64. Returns ``[p, 2]`` int64, sorted, each pair once: exactly
    the pairs a comparison of all n² pairs finds. Multi-index hashing (module docstring):
    the 64 bits are cut into ``blocks`` blocks (default :func:`choose_blocks`), and for every
    k-subset of them (``k = blocks - threshold``) the items are sorted by the subset's bits;
    items sharing a key are compared with an XOR-popcount, and a pair is kept only under the
    first key on which it agrees (the k lowest blocks where the two hashes are equal), so no
    pair is produced twice — and the keys can be searched apart: ``map_keys`` (a
    :data:`KeyMapper`) runs :func:`key_pairs` on ``tasks`` groups of them (a build's Ray
    tasks, each with the hashes from the object store); without it, here, one key after
    another. Buckets of up to :data:`BIG` items are compared all at once, one
    offset in the sorted order at a time; a larger bucket (clumpy hashes) on its own,
    ``block`` × ``block`` hashes at a time. The buckets of one key are compared ``chunk``
    sorted positions at a time (never cutting a bucket): besides the pairs found, memory is
    the hashes, the key's sort order (~30 B an item while it is made) and a chunk's work.
    ``threshold`` ≥ 64 gives every pair; below 0, none.
    """
    h = np.asarray(hashes, dtype=np.uint64).reshape(-1)
    n = len(h)
    if threshold < 0 or n < 2:
        return np.zeros((0, 2), dtype=np.int64)
    if threshold >= HASH_BITS:  # every pair differs in at most 64 bits
        i, j = np.triu_indices(n, k=1)
        return np.stack([i, j], axis=1).astype(np.int64)
    t = threshold
    m = choose_blocks(h, t) if blocks is None else blocks
    if not t + 1 <= m <= HASH_BITS:
        raise ValueError(f"blocks must be in [{t + 1}, {HASH_BITS}] for threshold {t}, not {m}")
    subsets = list(itertools.combinations(range(m), m - t))
    kwargs: dict[str, Any] = {"hashes": h, "threshold": t, "blocks": m, "block": block,
                              "chunk": chunk}
    if map_keys is None or tasks <= 1:
        found = [key_pairs(subsets, **kwargs)]
    else:
        groups = [subsets[g::tasks] for g in range(min(tasks, len(subsets)))]  # mixed widths
        found = list(map_keys(key_pairs, groups, kwargs))
    codes = np.sort(np.concatenate(found))
    return np.stack([codes // n, codes % n], axis=1)


def key_pairs(subsets: Sequence[tuple[int, ...]], *, hashes: np.ndarray, threshold: int,
              blocks: int, block: int = 2048, chunk: int = 1 << 16) -> np.ndarray:
    """:func:`near_pairs`' search under the keys of ``subsets`` (k-subsets of the ``blocks``
    blocks) alone: ``[p]`` int64 codes ``i * n + j`` (``i < j``) of the pairs within
    ``threshold`` bits whose first agreeing key is one of them (any order). Keys of other
    subsets find the rest: together, every pair once."""
    h = np.asarray(hashes, dtype=np.uint64).reshape(-1)
    n, t, m = len(h), threshold, blocks
    spans = _blocks(m)
    masks = [np.uint64(((1 << w) - 1) << lo) for lo, w in spans]
    found: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]

    def keep(a: np.ndarray, b: np.ndarray, x: np.ndarray, first: list[np.uint64]) -> None:
        """Keep the pairs ``(a, b)`` (item indices, hashes' XOR ``x``, already within ``t``
        bits) that agree on none of the ``first`` blocks (those below the key's last block
        and not in it): this key is the pair's first."""
        if first:
            ok = (x & first[0]) != 0
            for mask in first[1:]:
                ok &= (x & mask) != 0
            a, b = a[ok], b[ok]
        if len(a):
            found.append(np.minimum(a, b) * n + np.maximum(a, b))

    # every block's bits once, when they fit 8 or 16 bits (m >= 4): a key of up to 32 bits is
    # then put together in uint32 from these, at a fraction of uint64 work's memory traffic
    widest = max(w for _, w in spans)
    dtype = np.uint8 if widest <= 8 else np.uint16
    parts = ([((h >> lo) & ((1 << w) - 1)).astype(dtype) for lo, w in spans]
             if widest <= 16 else None)
    for subset in subsets:
        first = [masks[b] for b in range(subset[-1]) if b not in subset]
        width = sum(spans[b][1] for b in subset)
        if parts is not None and width <= 32:
            key = parts[subset[0]].astype(np.uint32)
            shift = spans[subset[0]][1]
            for b in subset[1:]:
                key |= np.left_shift(parts[b], shift, dtype=np.uint32)
                shift += spans[b][1]
        else:
            key = _key(h, spans, subset)
        order = _sort_order(key, width)
        skey = key[order]
        del key
        for lo, hi in _bucket_chunks(skey, chunk):
            _chunk_pairs(h, t, order[lo:hi], skey[lo:hi], first, keep, block)
        del order, skey
    return np.concatenate(found)


def _bucket_chunks(skey: np.ndarray, chunk: int) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` ranges of about ``chunk`` sorted positions covering ``skey`` (sorted keys),
    each ending where a key does (a bucket is never cut)."""
    n, lo = len(skey), 0
    while lo < n:
        hi = min(lo + chunk, n)
        while 0 < hi < n and skey[hi] == skey[hi - 1]:  # inside a bucket: to its end
            window = skey[hi : hi + BIG]
            change = np.flatnonzero(window != skey[hi - 1])
            hi = hi + int(change[0]) if len(change) else hi + len(window)
        yield lo, hi
        lo = hi


def _chunk_pairs(h: np.ndarray, t: int, ids_sorted: np.ndarray, skey: np.ndarray,
                 first: list[np.uint64],
                 keep: Callable[[np.ndarray, np.ndarray, np.ndarray, list[np.uint64]], None],
                 block: int) -> None:
    """:func:`near_pairs`' comparisons within the buckets of one chunk of sorted positions
    (``ids_sorted``: the items there, ``skey``: their keys): pairs within ``t`` bits go to
    ``keep``."""
    same = skey[1:] == skey[:-1]
    if not same.any():
        return
    # the sorted positions in buckets of two or more, and each bucket's extent
    shared = np.zeros(len(skey), dtype=bool)
    shared[:-1] = same
    shared[1:] |= same
    pos = np.flatnonzero(shared)
    starts = np.ones(len(pos), dtype=bool)
    starts[1:] = ~same[pos[1:] - 1]
    begin = np.flatnonzero(starts)
    size = np.diff(np.append(begin, len(pos)))
    bucket = np.cumsum(starts) - 1
    ids = ids_sorted[pos]
    hs = h[ids]
    # small buckets: offset d pairs each member with the one d places after it
    rest = size[bucket] - 1 - (np.arange(len(pos)) - begin[bucket])
    rest[size[bucket] > BIG] = 0
    act = np.flatnonzero(rest >= 1)
    d = 1
    left = rest[act]
    while len(act):
        other = act + d
        x = hs[act] ^ hs[other]
        near = np.flatnonzero(np.bitwise_count(x) <= t)
        if len(near):
            keep(ids[act[near]], ids[other[near]], x[near], first)
        d += 1
        more = left >= d
        act, left = act[more], left[more]
    # big buckets: one at a time, block by block
    for s0, sz in zip(begin[size > BIG].tolist(), size[size > BIG].tolist(), strict=True):
        mid, mh = ids[s0 : s0 + sz], hs[s0 : s0 + sz]
        for s in range(0, sz, block):
            for u in range(s, sz, block):
                x = mh[s : s + block, None] ^ mh[None, u : u + block]
                near = np.bitwise_count(x) <= t
                if u == s:
                    near = np.triu(near, 1)
                ii, jj = np.nonzero(near)
                keep(mid[s + ii], mid[u + jj], x[ii, jj], first)


def _mapping(a: Any) -> mmap.mmap | None:
    """The file mapping ``a``'s memory belongs to (a ``np.memmap`` or a view of one), or
    None."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = getattr(a, "_mmap", None) or getattr(a, "base", None)
    return a


def thumb_diff(thumbs: np.ndarray, pairs: np.ndarray, chunk: int = 1 << 13) -> np.ndarray:
    """Mean absolute difference (grey levels) of the thumbnails of each pair.

    ``thumbs`` mapped from a file (``content.npz``, as a build holds them): the pages each
    chunk of pairs brought into this process are let go after it (``MADV_DONTNEED``; the
    file's clean pages stay in the page cache), so reading candidate pairs spread over every
    page does not grow the process by the whole file (256 B an item: 3 GB at 12M items) but
    by at most a chunk's pages (2 a pair: 64 MiB)."""
    mapped = _mapping(thumbs)
    out = np.empty(len(pairs), dtype=np.float64)
    for s in range(0, len(pairs), chunk):
        p = pairs[s : s + chunk]
        a = thumbs[p[:, 0]].astype(np.int16)
        out[s : s + chunk] = np.abs(a - thumbs[p[:, 1]]).mean(axis=1)
        if mapped is not None:
            mapped.madvise(mmap.MADV_DONTNEED)
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
