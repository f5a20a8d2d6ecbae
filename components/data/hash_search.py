"""All pairs of 64-bit hashes within ``t`` bits of each other, without comparing all n² pairs:
:func:`near_pairs` (the near-duplicate search of :mod:`components.data.integrity`).

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

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

HASH_BITS = 64


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
