"""Near-duplicate search: the band scheme it replaced against multi-index hashing, one run.

    python bench/near_duplicates.py [--sizes 50000 100000 200000 400000 1000000]
                                    [--threshold 6] [--fashion-mnist]

``components.data.hash_search.near_pairs`` (the 64 bits cut into ``m`` blocks chosen by its cost
model, one sorted key per k-subset of blocks) against a copy of the scheme it replaced (below:
``threshold + 1`` bands, all pairs compared inside each band bucket), on the same hashes in the
same process, one after the other: seconds, pairs found (they must be equal), the ratio, and
the new one's growth per doubling of N, ``(t2 / t1) ** (1 / log2(N2 / N1))`` (2: linear, 4:
quadratic). Hashes: uniform 64-bit, 1 % of them near copies (0-6 bits flipped) of others, so
that there are pairs to find. Clumpy sets: 70k near copies (0-8 bits flipped) of 2,000 bases,
and with ``--fashion-mnist`` the pHashes of Fashion-MNIST's 70k images (the built-in
package's, 28 px, ~7 s to hash: ~850k pairs within 6 bits).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.data import hash_search, integrity  # noqa: E402
from tests.support.hashes import flip_bits  # noqa: E402

SIZES = (50_000, 100_000, 200_000, 400_000)


def band_near_pairs(hashes: np.ndarray, threshold: int, block: int = 2048) -> np.ndarray:
    """The replaced scheme (hash_search.near_pairs before multi-index hashing, its band edges
    inlined): cut the 64 bits into ``threshold + 1`` bands; two hashes within ``threshold``
    bits agree exactly on one band; every pair inside a band bucket is compared. Buckets hold
    n / 2^(bits of a band) items, so the search is quadratic in n."""
    h = np.asarray(hashes, dtype=np.uint64)
    if threshold < 0 or len(h) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    found: list[np.ndarray] = []
    bands = min(threshold, 63) + 1
    edges = np.linspace(0, 64, bands + 1).round().astype(int)
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        key = (h >> np.uint64(lo)) & np.uint64((1 << (hi - lo)) - 1)
        order = np.argsort(key, kind="stable")
        cuts = np.flatnonzero(np.diff(key[order])) + 1
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
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)


def uniform(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, n, dtype=np.uint64)
    copies = rng.choice(n, n // 100, replace=False)
    h[copies] = flip_bits(h[rng.integers(0, n, len(copies))], 6, rng)
    return h


def clumpy(n: int = 70_000, bases: int = 2_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return flip_bits(rng.integers(0, 2**64, bases, dtype=np.uint64)[rng.integers(0, bases, n)],
                   8, rng)


def fashion_mnist() -> np.ndarray:
    from components.data.sources import FASHION_MNIST_DIR, _idx_images

    images = np.concatenate([_idx_images(f"{FASHION_MNIST_DIR}/{s}-images-idx3-ubyte.gz")
                             for s in ("train", "t10k")])
    return np.array([integrity.phash(np.repeat(im[:, :, None], 3, axis=2)) for im in images],
                    dtype=np.uint64)


def timed(f, *args):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = f(*args)
    return time.perf_counter() - t0, out


def row(name: str, h: np.ndarray, t: int, bands: bool = True) -> tuple[str, float]:
    """One table row; ``bands`` False: the new search alone (the bands take hours at 12M)."""
    new_s, new = timed(hash_search.near_pairs, h, t)
    m = hash_search.choose_blocks(h, t)
    keys = math.comb(m, m - t)
    if not bands:
        return (f"| {name} | {len(h):,} | — | {new_s:.2f} | — | — | {len(new):,} | "
                f"{m} ({keys} keys) |"), new_s
    old_s, old = timed(band_near_pairs, h, t)
    same = "yes" if np.array_equal(old, new) else "**NO**"
    return (f"| {name} | {len(h):,} | {old_s:.2f} | {new_s:.2f} | {old_s / new_s:.1f}x | "
            f"{len(old):,} | {len(new):,} {same} | {m} ({keys} keys) |"), new_s


def ray_row(h: np.ndarray, t: int, tasks: int, alone: float) -> str:
    """``near_pairs`` over ``tasks`` Ray tasks (a local Ray started on first use), twice."""
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)

    from components.data.build import planning
    from components.data.build.placement import ANYWHERE

    map_keys = planning.key_mapper(ANYWHERE)  # what a build runs

    first, got = timed(lambda: hash_search.near_pairs(h, t, map_keys=map_keys, tasks=tasks))
    second, again = timed(lambda: hash_search.near_pairs(h, t, map_keys=map_keys, tasks=tasks))
    same = np.array_equal(got, hash_search.near_pairs(h, t)) and np.array_equal(got, again)
    return (f"| {len(h):,} | {tasks} | {first:.2f} | {second:.2f} | {alone:.2f} | "
            f"{alone / second:.2f}x | {'yes' if same else '**NO**'} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--threshold", type=int, default=6)
    ap.add_argument("--clumpy", type=int, default=70_000, help="items of the clumpy set (0: none)")
    ap.add_argument("--bands-up-to", type=int, default=1_000_000, metavar="N",
                    help="run the replaced band scheme only up to N hashes (~54 s at 1M, "
                         "×4 per doubling)")
    ap.add_argument("--ray-tasks", type=int, default=0, metavar="K",
                    help="also time each uniform size spread over K Ray tasks of a local Ray "
                         "(as a build does from 250k items; run inside `unshare -n`)")
    ap.add_argument("--fashion-mnist", action="store_true",
                    help="also Fashion-MNIST's 70k pHashes (the built-in package)")
    a = ap.parse_args(argv)
    t = a.threshold
    print(f"threshold {t} bits; old: {t + 1} bands; new: m blocks, one key per "
          f"(m - {t})-subset\n")
    print("| hashes | N | old s | new s | old / new | pairs (old) | pairs (new), equal | "
          "new: blocks |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    times = []
    spread: list[str] = []
    for n in a.sizes:
        h = uniform(n)
        line, s = row("uniform", h, t, bands=n <= a.bands_up_to)
        print(line, flush=True)
        times.append((n, s))
        if a.ray_tasks:
            spread.append(ray_row(h, t, a.ray_tasks, s))
    if a.clumpy:
        print(row(f"clumpy (near copies of {a.clumpy // 35:,})", clumpy(a.clumpy, a.clumpy // 35),
                  t)[0], flush=True)
    if a.fashion_mnist:
        print(row("Fashion-MNIST pHashes", fashion_mnist(), t)[0], flush=True)
    if spread:
        import ray

        print(f"\nspread over Ray tasks ({ray.cluster_resources().get('CPU', 0):.0f} CPUs; "
              "the hashes put once, each task a group of keys):\n")
        print("| N | tasks | s (first call: workers start) | s (second) | one process s | "
              "one process / second | same pairs |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        print("\n".join(spread))
        ray.shutdown()
    if len(times) > 1:
        growth = [f"{n1:,} -> {n2:,}: x{(t2 / t1) ** (1 / math.log2(n2 / n1)):.2f}"
                  for (n1, t1), (n2, t2) in zip(times[:-1], times[1:], strict=True)]
        print("\nnew, per doubling of N (2: linear, 4: quadratic): " + "; ".join(growth))


if __name__ == "__main__":
    main()
