"""Preprocessing benchmark: images/s with 1 and 2 Ray CPUs, captions/s of the embedding stage.

    python bench/preprocess.py [--per-class 600] [--captions 4000]

Images: Fashion-MNIST (``max_per_class`` per class and split), captions disabled so the
image stages (read → decode → group by shard → write FFCV shards → merge) are measured alone.
Captions: ``--captions`` unique texts through the Ray Data actor pool with 1 and 2 actors
(one all-MiniLM-L6-v2 per actor, one thread each). Ray start-up is excluded; each setting
runs in a fresh local Ray with that many CPUs. Run it inside a loopback-only namespace like
the tests (``unshare -n``) or on a machine where Ray may bind its interface.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def images_per_second(per_class: int, cpus: int, tmp: Path) -> tuple[float, int]:
    import ray

    from components.config import PreprocessConfig, from_dict
    from pipelines.preprocess import run

    cfg = from_dict(PreprocessConfig, {
        "output": str(tmp / f"fm-{cpus}"),
        "source": {"kind": "fashion-mnist", "max_per_class": per_class},
        "image": {"max_side": 28, "min_side": 28}, "captions": {"enabled": False},
        "shard_size": 1000,
    })
    ray.init(num_cpus=cpus, object_store_memory=1 << 30, include_dashboard=False,
             log_to_driver=False)
    try:
        t0 = time.perf_counter()
        m = run(cfg, echo=False)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    n = sum(s["samples"] for s in m["splits"].values())
    return n / wall, n


def captions_per_second(n: int, actors: int, tmp: Path) -> float:
    import ray

    from components.config import PreprocessConfig, from_dict
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
    cfg = from_dict(PreprocessConfig, {"output": str(tmp), "source": {"kind": "fashion-mnist"},
                                       "captions": {"actors": actors}})
    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False,
             log_to_driver=False)
    try:
        embed_captions(cfg, texts[:64], tmp)  # warm the workers' imports
        (tmp / "captions.npz").unlink()
        t0 = time.perf_counter()
        embed_captions(cfg, texts, tmp)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    (tmp / "captions.npz").unlink()
    return len(texts) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=600)
    ap.add_argument("--captions", type=int, default=4000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        img = {c: images_per_second(a.per_class, c, tmp) for c in (1, 2)}
        cap = {k: captions_per_second(a.captions, k, tmp) for k in (1, 2)}
    n = img[1][1]
    print(f"images ({n} Fashion-MNIST, raw, shards of 1000, incl. merge):")
    for c in (1, 2):
        print(f"  {c} Ray CPU(s): {img[c][0]:8.0f} images/s")
    print(f"  2 vs 1 CPU: {img[2][0] / img[1][0]:.2f}x")
    print(f"captions ({a.captions} unique, all-MiniLM-L6-v2, Ray Data actor pool):")
    for k in (1, 2):
        print(f"  {k} actor(s): {cap[k]:8.0f} captions/s")


if __name__ == "__main__":
    main()
