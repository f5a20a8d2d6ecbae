"""Reader benchmark: simgraph's FFCV ViewLoader vs torchvision ImageFolder + PIL DataLoader.

Same images (Fashion-MNIST exported to PNG for ImageFolder, preprocessed to a raw .beton for
FFCV), same two-view SimCLR augmentations (random resized crop, flip, colour jitter incl. hue,
grayscale), same number of workers (DataLoader processes vs FFCV threads), same batch size,
measured side by side in one run. Prints samples/s and CPU-seconds per sample (the process and
its children), and the ratio. FFCV's one-time JIT compile is reported separately.

    python bench/loader.py [--images 6000] [--workers 2] [--batch 256] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_seconds() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def export(n: int, root: Path) -> tuple[Path, Path]:
    """n Fashion-MNIST train images as class-folder PNGs and as one raw .beton."""
    from PIL import Image

    from components.data.shards import page_size_for, write_shard
    from components.data.sources import FASHION_MNIST_CLASSES, list_fashion_mnist, read_item

    items = [it for it in list_fashion_mnist().items if it.official_split == "train"][:n]
    folder = root / "folder"
    images, labels = [], []
    for i, it in enumerate(items):
        arr = np.repeat(np.asarray(read_item(it.path))[:, :, None], 3, axis=2)
        d = folder / FASHION_MNIST_CLASSES[it.label].replace("/", "_")
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(d / f"{i:06d}.png")
        images.append(arr)
        labels.append(it.label)
    beton = root / "train.beton"
    write_shard(beton, images, np.array(labels), np.arange(len(images)), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(28, 0))
    return folder, beton


def torchvision_two_views(folder: Path, res: int, batch: int, workers: int,
                          colour: bool = True) -> Any:
    """torchvision ``ImageFolder`` + ``DataLoader`` giving two augmented views per image:
    RandomResizedCrop (0.08, 1) + flip, and SimCLR's colour jitter (p 0.8) and grayscale
    (p 0.2) when ``colour``; ImageNet normalisation. Each batch: ``((v1, v2), labels)``."""
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2 as T

    colour_ops = [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                  T.RandomGrayscale(p=0.2)] if colour else []
    aug = T.Compose([
        T.RandomResizedCrop(res, scale=(0.08, 1.0), antialias=True),
        T.RandomHorizontalFlip(),
        *colour_ops,
        T.ToImage(), T.ToDtype(torch.float32, scale=True),
        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])

    class TwoViews:
        def __call__(self, img: object) -> tuple:
            return aug(img), aug(img)

    ds = datasets.ImageFolder(str(folder), transform=TwoViews())
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       drop_last=True)


def run_torchvision(folder: Path, workers: int, batch: int, epochs: int, res: int) -> dict:
    dl = torchvision_two_views(folder, res, batch, workers)
    n, cpu0, t0 = 0, cpu_seconds(), time.perf_counter()
    for _ in range(epochs):
        for (v1, _v2), _y in dl:
            n += v1.shape[0]
    wall = time.perf_counter() - t0
    return {"samples/s": n / wall, "cpu_s/sample": (cpu_seconds() - cpu0) / n, "n": n}


def run_ffcv(beton: Path, workers: int, batch: int, epochs: int, res: int) -> dict:
    import torch

    from components.config import AugmentConfig
    from components.data.reader import ViewLoader

    t0 = time.perf_counter()
    loader = ViewLoader(beton, batch_size=batch, views=2, augment=AugmentConfig(resolution=res),
                        train=True, num_workers=workers, with_captions=False)
    for _ in loader:  # epoch 0 compiles (numba) — reported, not timed below
        pass
    compile_s = time.perf_counter() - t0
    torch.set_num_threads(1)
    n, cpu0, t0 = 0, cpu_seconds(), time.perf_counter()
    for _ in range(epochs):
        for b in loader:
            n += b.images.shape[0]
    wall = time.perf_counter() - t0
    return {"samples/s": n / wall, "cpu_s/sample": (cpu_seconds() - cpu0) / n, "n": n,
            "first_epoch_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=6000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--resolution", type=int, default=28)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, beton = export(a.images, Path(tmp))
        tv = run_torchvision(folder, a.workers, a.batch, a.epochs, a.resolution)
        ff = run_ffcv(beton, a.workers, a.batch, a.epochs, a.resolution)
    print(f"{a.images} Fashion-MNIST images, {a.resolution}px, 2 views, batch {a.batch}, "
          f"{a.workers} workers, {a.epochs} epochs, {os.cpu_count()} CPUs")
    print(f"{'loader':<28}{'samples/s':>12}{'CPU-s/sample':>15}")
    print(f"{'torchvision ImageFolder+PIL':<28}{tv['samples/s']:>12.0f}{tv['cpu_s/sample']:>15.5f}")
    print(f"{'simgraph FFCV ViewLoader':<28}{ff['samples/s']:>12.0f}{ff['cpu_s/sample']:>15.5f}")
    print(f"speed-up {ff['samples/s'] / tv['samples/s']:.2f}x, CPU per sample "
          f"{ff['cpu_s/sample'] / tv['cpu_s/sample']:.2f}x; FFCV first epoch incl. JIT "
          f"{ff['first_epoch_s']:.1f} s")


if __name__ == "__main__":
    main()
