"""Preprocessing benchmark: how a build scales from 1 to 2 Ray CPUs, and captions/s.

    python bench/preprocess.py [--per-class 600] [--photos 6000 24000] [--captions 4000]

Images, captions disabled so the image stages (content hashes → plan → decode and write one
shard per task → merge) are measured alone, each setting in a fresh local Ray with that many
CPUs (Ray start-up excluded, worker start-up and imports included), two workloads:

* ``fashion-mnist``: the built-in source, ``--per-class`` per class and split, 28 px raw. Each
  image costs ~0.1 ms to decode, so fixed costs (worker imports, Ray scheduling) dominate.
* ``photos``: ``--photos`` JPEG files (256×256, made once from Fashion-MNIST images upscaled,
  tinted and noised, so no two are duplicates) in a class-folder source, stored at
  ``max_side`` 64: per-image work like a real photo collection's; at each size given.

For each: images/s, the 2-vs-1 speed-up S, the serial fraction it implies (Amdahl:
f = 2/S − 1) and the speed-up that fraction allows at 16 and 64 CPUs. The serial fraction
depends on the size (fixed start-up costs amortise), so with two photo sizes the wall times are
also fitted to T(n, c) = a + s·n + w·n/c (a: fixed seconds, s: serial seconds per image — the
driver's listing, planning, collecting — w: parallel CPU-seconds per image) and the speed-up
projected per dataset size. Captions: ``--captions``
unique texts through the Ray Data actor pool with 1 and 2 actors (``bench/captions.py`` compares
the backends). Run it inside a loopback-only namespace like the tests (``unshare -n``).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CPUS = (1, 2)


def make_photos(n: int, root: Path) -> None:
    """``n`` 256×256 JPEGs in ten class folders, from Fashion-MNIST train images (upscaled,
    tinted per channel and noised: distinct files, distinct pixels)."""
    import cv2
    import numpy as np

    from components.data.sources import FASHION_MNIST_DIR, _idx_images

    images = _idx_images(f"{FASHION_MNIST_DIR}/train-images-idx3-ubyte.gz")
    rng = np.random.default_rng(0)
    for i in range(n):
        big = cv2.resize(images[i], (256, 256), interpolation=cv2.INTER_CUBIC).astype(np.float32)
        rgb = big[..., None] * rng.uniform(0.4, 1.0, 3) + rng.normal(0, 6, (256, 256, 3))
        d = root / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(d / f"{i:06d}.jpg"), np.clip(rgb, 0, 255).astype(np.uint8),
                    [cv2.IMWRITE_JPEG_QUALITY, 90])


def build_seconds(source: dict[str, Any], image: dict[str, Any], cpus: int,
                  out: Path) -> tuple[float, int]:
    import ray

    from components.config import PreprocessConfig, from_dict
    from pipelines.preprocess import run

    cfg = from_dict(PreprocessConfig, {
        "output": str(out), "source": source, "image": image,
        "captions": {"enabled": False}, "shard_size": 1000,
    })
    ray.init(num_cpus=cpus, object_store_memory=1 << 30, include_dashboard=False,
             log_to_driver=False)
    try:
        t0 = time.perf_counter()
        m = run(cfg, echo=False)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    return wall, sum(s["samples"] for s in m["splits"].values())


def report(name: str, walls: dict[int, tuple[float, int]]) -> None:
    n = walls[1][1]
    print(f"{name} ({n} images):")
    for c in CPUS:
        print(f"  {c} Ray CPU(s): {walls[c][0]:6.1f} s  {n / walls[c][0]:7.0f} images/s")
    s = walls[1][0] / walls[2][0]
    f = min(max(2 / s - 1, 0.0), 1.0)  # Amdahl: S(2) = 1 / (f + (1 - f) / 2)
    proj = {k: 1 / (f + (1 - f) / k) for k in (16, 64)}
    print(f"  2 vs 1 CPU: {s:.2f}x  serial fraction {f:.2f}  ->  "
          f"16 CPUs {proj[16]:.1f}x, 64 CPUs {proj[64]:.1f}x (Amdahl)")


def fit_cost_model(runs: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least-squares (a, s, w) of T(n, c) = a + s·n + w·n/c over ``(n, cpus, wall)`` runs."""
    import numpy as np

    x = np.array([[1.0, n, n / c] for n, c, _ in runs])
    y = np.array([t for _, _, t in runs])
    a, s, w = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(a), float(s), float(w)


def report_model(runs: list[tuple[int, int, float]]) -> None:
    a, s, w = fit_cost_model(runs)
    print(f"  fit T(n, c) = a + s*n + w*n/c over {len(runs)} runs: a = {a:.1f} s fixed, "
          f"s = {s * 1e3:.3f} ms/image serial, w = {w * 1e3:.3f} CPU-ms/image parallel")
    for n in (24_000, 100_000, 1_000_000):
        t1 = a + s * n + w * n
        print(f"  n = {n:>9,}: " + ", ".join(
            f"{c} CPUs {t1 / (a + s * n + w * n / c):.1f}x" for c in (2, 16, 64)))


def captions_per_second(n: int, actors: int, tmp: Path) -> float:
    import ray

    from components.config import PreprocessConfig, from_dict
    from components.data import captions as cap
    from components.data.build import embed_captions

    adjectives = ["red", "small", "old", "striped", "shiny", "wooden", "happy", "broken",
                  "tall", "blue", "green", "soft", "heavy", "round", "dark", "bright"]
    nouns = ["dog", "cat", "car", "house", "tree", "boat", "shoe", "cup", "chair", "bird",
             "flower", "lamp", "book", "horse", "train", "clock", "guitar", "apple", "kite"]
    places = ["on a table", "in a field", "near the sea", "at night", "in the snow",
              "on a street", "in a kitchen", "under a bridge", "in a forest", "on a shelf",
              "by a window", "in the rain", "at a market", "on a hill"]
    texts = [f"a photo of a {a} {b} {c}" for a, b, c in
             itertools.islice(itertools.product(adjectives, nouns, places), n)]
    # a resolved backend: embed_captions refuses auto (the driver resolves it per build)
    cfg = from_dict(PreprocessConfig, {"output": str(tmp), "source": {"kind": "fashion-mnist"},
                                       "captions": {"actors": actors, "backend": "torch"}})
    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False,
             log_to_driver=False)
    try:
        dim = cap.embedding_dim(cap.load_encoder(cfg.captions.model))
        embed_captions(cfg, texts[:64], tmp, dim=dim)  # warm the workers' imports
        (tmp / "caption_embeddings.npy").unlink()
        t0 = time.perf_counter()
        embed_captions(cfg, texts, tmp, dim=dim)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    (tmp / "caption_embeddings.npy").unlink()
    return len(texts) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=600)
    ap.add_argument("--photos", type=int, nargs="+", default=[6000, 24000])
    ap.add_argument("--captions", type=int, default=4000, help="0 skips the caption rows")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        make_photos(max(a.photos), tmp / "photos")
        workloads: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
            "fashion-mnist, 28 px raw": (
                {"kind": "fashion-mnist", "max_per_class": a.per_class},
                {"max_side": 28, "min_side": 28}),
        }
        for n in sorted(a.photos):
            workloads[f"photos, 256 px JPEG -> 64 px raw, {n}"] = (
                {"kind": "folder", "path": str(tmp / "photos"), "max_per_class": n // 10},
                {"max_side": 64, "min_side": 8})
        walls = {name: {c: build_seconds(src, img, c, tmp / f"out-{k}-{c}")
                        for c in CPUS}
                 for k, (name, (src, img)) in enumerate(workloads.items())}
        cap = ({k: captions_per_second(a.captions, k, tmp) for k in CPUS}
               if a.captions else {})
    print("preprocess, captions off, shards of 1000, incl. hashes, plan and merge:")
    for name, w in walls.items():
        report(name, w)
    runs = [(w[c][1], c, w[c][0]) for name, w in walls.items() if name.startswith("photos")
            for c in CPUS]
    if len({n for n, _, _ in runs}) > 1:
        print("photos, cost model and projection:")
        report_model(runs)
    if cap:
        print(f"captions ({a.captions} unique, all-MiniLM-L6-v2, Ray Data actor pool):")
        for k in CPUS:
            print(f"  {k} actor(s): {cap[k]:8.0f} captions/s")


if __name__ == "__main__":
    main()
