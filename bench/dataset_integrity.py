"""Dataset integrity benchmark: the content-hash pass of preprocessing, and ``simgraph inspect``.

    python bench/dataset_integrity.py [--per-class N] [--keep DIR]

Builds Fashion-MNIST (all 70k images, or ``--per-class`` per class and split) with captions
from the class template, in a fresh local Ray with 2 CPUs: reports the wall time of the whole
preprocess and of its content-hash pass (decode + sha256 + pHash + thumbnail of every item,
plus duplicate search), then times ``simgraph inspect`` on the result. Run it inside a
loopback-only namespace like the tests (``unshare -n``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import ray

    from components.config import PreprocessConfig, from_dict
    from components.data import inspection as inspect
    from pipelines import preprocess

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=None)
    ap.add_argument("--keep", help="build here (and keep it) instead of a temp dir")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = Path(a.keep or d) / "fm"
        out.parent.mkdir(parents=True, exist_ok=True)
        cfg = from_dict(PreprocessConfig, {
            "output": str(out),
            "source": {"kind": "fashion-mnist", "max_per_class": a.per_class},
            "image": {"max_side": 28, "min_side": 28}, "shard_size": 10000,
        })
        ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False,
                 log_to_driver=False)
        try:
            listed = preprocess.list_items(cfg)
            t0 = time.perf_counter()
            content = preprocess.hash_with_ray(cfg, listed.items, out.parent)
            t_hash = time.perf_counter() - t0
            t0 = time.perf_counter()
            p = preprocess.plan(cfg, listed, content)
            t_plan = time.perf_counter() - t0
            (out.parent / "content.npz").unlink()
            t0 = time.perf_counter()
            m = preprocess.run(cfg, echo=False)
            t_all = time.perf_counter() - t0
        finally:
            ray.shutdown()
        n = len(listed.items)
        t0 = time.perf_counter()
        inspect.run(str(out))
        t_inspect = time.perf_counter() - t0
        nd = m["near_duplicates"]
        print(f"{n} Fashion-MNIST items, 2 Ray CPUs")
        print(f"  preprocess total:           {t_all:7.1f} s")
        print(f"  content-hash pass (Ray):    {t_hash:7.1f} s  ({n / t_hash:.0f} items/s)")
        print(f"  duplicates + splits (plan): {t_plan:7.1f} s")
        print(f"  exact duplicates dropped: {m['skipped']['by_reason'].get('duplicate-of', 0)}; "
              f"near-duplicate groups: {nd['groups']} ({nd['items']} items, sizes "
              f"{nd['sizes']}), straddling official splits: {nd['straddling_splits']['pairs']}")
        print(f"  rows planned: {len(p.rows)}")
        print(f"simgraph inspect:             {t_inspect:7.1f} s")


if __name__ == "__main__":
    main()
