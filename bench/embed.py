"""``simgraph embed`` throughput: images/s of Fashion-MNIST's test split through both routes.

    python bench/embed.py [--dataset DATASET_DIR] [--images 10000] [--repeats 2]

The data: ``--dataset`` (a built Fashion-MNIST dataset dir with a ``test`` split), else the
official 10k test images of the Debian package ``dataset-fashion-mnist`` written here without
Ray, as the build writes them (``decode_image`` at ``max_side`` 28, raw pixels, one
``write_shard``), and the same images as PNGs in class folders. The model: the demo's
pretrain config (``pipelines/configs/pretrain/demo.yaml``: the small-image ConvNet, 28 px,
batch 64, one decoding thread), randomly initialised (speed does not depend on the weights).

Each row runs ``simgraph embed`` as a user would, in a fresh process (best of ``--repeats``):
the embedding's wall time as the command reports it (reader or decoding, forward passes; the
checkpoint load and the Parquet write excluded; the FFCV Loader's numba compile included with
``jit``) and the whole process's. Rows: the dataset dir's test split with ``data.jit`` false
(the demo's setting) and true, and the folder of PNGs (PIL decode + the reader's crop / resize
kernel in a thread pool). Run it inside a loopback-only namespace like the tests
(``unshare -n``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_dataset(root: Path, n: int) -> Path:
    from PIL import Image

    from components.data.images import decode_image
    from components.data.reader import FORMAT, MANIFEST
    from components.data.shards import page_size_for, write_shard
    from components.data.sources import FASHION_MNIST_CLASSES, list_fashion_mnist, read_item
    from components.io.files import sha256_file

    items = [it for it in list_fashion_mnist().items if it.official_split == "test"][:n]
    labels = np.array([it.label for it in items], dtype=np.int64)
    images = [decode_image(read_item(it.path), max_side=28, min_side=28) for it in items]
    ds = root / "ds"
    ds.mkdir(parents=True)
    write_shard(ds / "test.beton", images, labels, np.arange(n), None, write_mode="raw",
                jpeg_quality=90, page_size=page_size_for(28, 0))
    manifest = {
        "format": FORMAT, "complete": True, "classes": list(FASHION_MNIST_CLASSES),
        "params_digest": f"bench-fashion-test-{n}",
        "splits": {"test": {"samples": n, "file": "test.beton",
                            "sha256": sha256_file(ds / "test.beton")}},
        "fields": {"image": {"type": "RGBImageField", "write_mode": "raw", "max_side": 28}},
        "class_files": {},
    }
    (ds / MANIFEST).write_text(json.dumps(manifest))
    folder = root / "png"
    for i, (img, y) in enumerate(zip(images, labels, strict=True)):
        d = folder / FASHION_MNIST_CLASSES[int(y)].replace("/", "-")
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(d / f"{i:05d}.png")
    return ds


def write_run(root: Path, dataset: Path, jit: bool) -> Path:
    import torch

    from components.config import PretrainConfig, load_config, to_dict
    from components.runs.checkpoint import save_state
    from components.runs.run_dir import prepare_run_dir
    from components.training.step import build_model

    cfg = load_config("pipelines/configs/pretrain/demo.yaml", PretrainConfig, [
        f"data.dataset={dataset}", f"storage={root / 'runs'}", f"name=demo-jit-{jit}",
        f"data.jit={str(jit).lower()}"])
    run = Path(prepare_run_dir(cfg))
    torch.manual_seed(0)
    model, _ = build_model(cfg.model, cfg.loss, 10, None, 0, cfg.data.augment.resolution)
    save_state(run / "epoch_00001", {"model": model.state_dict(), "epoch": 1, "step": 0,
                                     "history": [], "config": to_dict(cfg), "dataset": None})
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", help="a built Fashion-MNIST dataset dir (its test split)")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch

    with tempfile.TemporaryDirectory(prefix="bench-embed-") as d:
        root = Path(d)
        t0 = time.perf_counter()
        ds = Path(args.dataset) if args.dataset else write_dataset(root, args.images)
        print(f"data ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        rows = []
        cases = [("dataset dir, test split", "no", ds), ("dataset dir, test split", "yes", ds)]
        if not args.dataset:  # the folder route does not use FFCV's Loader: no data.jit
            cases.append(("folder of PNGs", "n/a", root / "png"))
        for what, jit, data in cases:
            run = write_run(root, ds, jit == "yes")
            best: tuple[int, float, float] | None = None
            for _ in range(args.repeats):
                cmd = [sys.executable, "-m", "pipelines.cli", "embed", str(run), "--data",
                       str(data), "--out", str(root / "e.parquet")]
                if data == ds:
                    cmd += ["--split", "test"]
                t = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                      cwd=Path(__file__).resolve().parents[1])
                wall = time.perf_counter() - t
                m = re.search(r"(\d+) images, .* in ([\d.]+) s", done.stdout)
                assert m, done.stdout + done.stderr
                got = (int(m.group(1)), float(m.group(2)), wall)
                best = got if best is None or got[1] < best[1] else best
            assert best is not None
            rows.append((what, jit, *best))
        print(f"\n{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
              f"best of {args.repeats} fresh `simgraph embed` processes\n")
        print("| input | data.jit | images | embedding s | images/s | process wall s |")
        print("|---|---|---:|---:|---:|---:|")
        for what, jit, n, s, wall in rows:
            print(f"| {what} | {jit} | {n} | {s:.1f} | {n / s:,.0f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
