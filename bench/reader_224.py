"""224-px views through the reader, per CPU core, against the decode floor and FFCV's loader.

ImageNet-like sizes (issue 42, item 3): ``--images`` distinct JPEGs (q90) of max side
``--side`` (256; 384 / 512 with the flag; the other side 75–100 % of it), made once from
Fashion-MNIST train images upscaled, tinted per channel and noised (as bench/preprocess.py's
``make_photos``), stored as one JPEG-mode .beton by simgraph's ``write_shard`` and as the same
JPEG bytes in class folders. Side by side in one run, each at ONE thread / worker, 2 views of
224 (RandomResizedCrop scale (0.08, 1) + flip), batch 64:

* decode floor: libjpeg-turbo (``simplejpeg``, one thread) decoding the same JPEG bytes;
* FFCV's own ``Loader`` with ``RandomResizedCropRGBImageDecoder`` (OpenCV ``INTER_AREA``) +
  ``RandomHorizontalFlip``, two pipelines of the image field;
* torchvision ``ImageFolder`` + ``DataLoader`` (num_workers=0), ``RandomResizedCrop(224)`` +
  flip, to normalised float tensors (one decode per image for both views);
* simgraph's ``ViewLoader`` (CPU) with its colour ops (jitter p=0.8, grayscale p=0.2), without
  (jitter_p = grayscale_p = 0: both views cropped from one decode), the same with one decode
  per view (as before views shared a decode), and with ``batched_augment=True`` (the device
  path's colour ops as batched torch ops after the loader, here on the CPU).

Throughput is per-view images per CPU-second (the process and its children, as
bench/loader.py): views delivered / CPU-s; the floor is decodes / CPU-s (FFCV, and the
ViewLoader with colour ops in FFCV, decode each view's JPEG anew; torchvision, and the
ViewLoader without per-sample colour ops, decode once for both views). FFCV's
one-time JIT compile is excluded (a warm-up batch per loader first). Then a per-stage
breakdown of the ViewLoader's work, in ms per view, timed on the same images outside the
loader: decode, crop+resize (the bilinear kernel, before = the float kernel it replaced, and
FFCV's INTER_AREA and PIL for scale), flip, colour ops, normalise + stack.

    python bench/reader_224.py [--images 2700] [--side 256] [--batches 16]
    python bench/reader_224.py --write-modes 300   # disk per image vs decode cost only
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RES = 224
BATCH = 64
VIEWS = 2


def cpu_seconds() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def make_jpegs(n: int, side: int, quality: int = 90) -> tuple[list[np.ndarray], list[bytes]]:
    """``n`` distinct RGB pictures of max side ``side`` and their JPEG bytes (FFCV's encoder:
    the bytes the .beton holds)."""
    import cv2
    from ffcv.fields.rgb_image import encode_jpeg

    from components.data.sources import FASHION_MNIST_DIR, _idx_images

    src = _idx_images(f"{FASHION_MNIST_DIR}/train-images-idx3-ubyte.gz")
    rng = np.random.default_rng(0)
    images, blobs = [], []
    for i in range(n):
        other = int(side * rng.uniform(0.75, 1.0))
        hw = (side, other) if i % 2 else (other, side)
        big = cv2.resize(src[i], (hw[1], hw[0]), interpolation=cv2.INTER_CUBIC)
        rgb = big.astype(np.float32)[..., None] * rng.uniform(0.4, 1.0, 3) + rng.normal(
            0, 6, (*hw, 3))
        img = np.ascontiguousarray(np.clip(rgb, 0, 255).astype(np.uint8))
        images.append(img)
        blobs.append(encode_jpeg(img, quality).tobytes())
    return images, blobs


def write_data(images: list[np.ndarray], blobs: list[bytes], root: Path) -> tuple[Path, Path]:
    from components.data.shards import page_size_for, write_shard

    folder = root / "folder"
    for i, b in enumerate(blobs):
        d = folder / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.jpg").write_bytes(b)
    beton = root / "train.beton"
    side = max(max(im.shape[:2]) for im in images)
    write_shard(beton, images, np.arange(len(images)) % 10, np.arange(len(images)), None,
                write_mode="jpg", jpeg_quality=90, page_size=page_size_for(side, 0))
    return folder, beton


def measure(step: Callable[[], int], batches: int,
            settle: Callable[[], None] | None = None) -> dict[str, float]:
    """``batches`` steps: views per CPU-second and per wall second. ``settle`` (a loader with
    a prefetching thread, idle with a full queue before the clock starts) waits for that
    thread to fill its queue again, so the CPU counted made exactly the views taken."""
    n, cpu0, t0 = 0, cpu_seconds(), time.perf_counter()
    for _ in range(batches):
        n += step()
    wall = time.perf_counter() - t0
    if settle is not None:
        settle()
    cpu = cpu_seconds() - cpu0
    return {"per_core": n / cpu, "wall": n / wall, "n": n}


def _settle() -> None:
    """Wait until this process's threads are idle (a prefetching loader's queue is full)."""
    for _ in range(60):
        c0 = cpu_seconds()
        time.sleep(0.25)
        if cpu_seconds() - c0 < 0.02:
            return


def run_floor(blobs: list[bytes], n: int) -> dict[str, float]:
    import simplejpeg

    it = iter(range(10**9))

    def step() -> int:
        for _ in range(BATCH):
            simplejpeg.decode_jpeg(blobs[next(it) % len(blobs)], colorspace="RGB")
        return BATCH

    return measure(step, n)


def run_ffcv(beton: Path, n: int) -> dict[str, float]:
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    def view() -> list[Any]:
        return [RandomResizedCropRGBImageDecoder((RES, RES), scale=(0.08, 1.0)),
                RandomHorizontalFlip(), ToTensor(), ToTorchImage()]

    loader = Loader(str(beton), batch_size=BATCH, num_workers=1, order=OrderOption.RANDOM,
                    drop_last=True, pipelines={
                        "image": view(), "label": [IntDecoder(), ToTensor()],
                        "image_1": PipelineSpec("image", decoder=view()[0],
                                                transforms=view()[1:]),
                    })
    names = list(loader.pipeline_specs)
    a, b = names.index("image"), names.index("image_1")
    return _loop(loader, n, lambda out: [out[a].clone(), out[b].clone()])


def _loop(loader: Any, n: int, take: Callable[[Any], list[Any]]) -> dict[str, float]:
    """One warm-up batch (the JIT compile), a pause while the loader's thread fills its queue
    (its batches ahead: produced before the clock starts; the clock's CPU count waits for
    it to be full again at the end), then ``n`` batches timed, epochs as needed."""
    t0 = time.perf_counter()
    state = {"it": iter(loader)}
    take(next(state["it"]))
    compile_s = time.perf_counter() - t0
    _settle()  # the prefetching thread idle, its queue full

    def step() -> int:
        try:
            out = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            out = next(state["it"])
        views = take(out)
        return sum(int(v.shape[0]) for v in views)

    r = measure(step, n, settle=_settle)
    r["compile_s"] = compile_s
    close = getattr(state["it"], "close", None)
    if close is not None:
        close()
    return r


def run_torchvision(folder: Path, n: int) -> dict[str, float]:
    from loader import torchvision_two_views  # bench/loader.py: the same pipeline, no colour

    dl = torchvision_two_views(folder, RES, BATCH, workers=0, colour=False)
    return _loop(dl, n, lambda out: list(out[0]))


def run_viewloader(beton: Path, n: int, *, colour: bool, batched: bool,
                   decode_per_view: bool = False) -> dict[str, float]:
    """``decode_per_view``: each view a pipeline of its own (one decode per view, as before
    views of one augmentation shared a decode): two view groups of one view each whose
    augmentations differ only in a crop scale bound no draw can tell apart."""
    import dataclasses

    from components.config import AugmentConfig
    from components.data.reader import ViewLoader

    aug = AugmentConfig(resolution=RES) if colour else AugmentConfig(
        resolution=RES, jitter_p=0.0, grayscale_p=0.0)
    groups = None
    if decode_per_view:
        twin = dataclasses.replace(aug, scale=[aug.scale[0], aug.scale[1] - 1e-12])
        groups = [(1, aug), (1, twin)]
    loader = ViewLoader(beton, batch_size=BATCH, views=VIEWS, augment=aug, train=True,
                        num_workers=1, with_captions=False, batched_augment=batched,
                        view_groups=groups)
    return _loop(loader, n, lambda b: [b.images[:, v] for v in range(VIEWS)])


def run_device_crops(beton: Path, n: int, *, loader_side: bool) -> dict[str, float]:
    """The GPU path's reader with its crops made after the loader (``device_crops``).
    ``loader_side``: only what the CPU does on a GPU node — FFCV's thread decoding each image
    into its slot and drawing its views' crops and flips — counted as the views those slots
    become (the crops are the GPU's); otherwise the whole reader with the crops made on this
    CPU (what it would cost without a GPU)."""
    from components.config import AugmentConfig
    from components.data.reader import ViewLoader

    aug = AugmentConfig(resolution=RES, jitter_p=0.0, grayscale_p=0.0)
    loader = ViewLoader(beton, batch_size=BATCH, views=VIEWS, augment=aug, train=True,
                        num_workers=1, with_captions=False, batched_augment=True,
                        device_crops=True)
    if not loader_side:
        return _loop(loader, n, lambda b: [b.images[:, v] for v in range(VIEWS)])
    at = list(loader.loader.pipeline_specs).index("image")
    return _loop(loader.loader, n, lambda out: [out[at]] * VIEWS)


# --------------------------------------------------------------------------------------------
# Per-stage breakdown, outside the loader.


def _float_kernel() -> Callable[..., None]:
    """The float32 kernel resize.py had before the fixed-point one (the 'before' column)."""
    from numba import njit

    from components.data.augment.resize import triangle_weights

    @njit(cache=False, nogil=True)
    def weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        first, count, w = triangle_weights(n_in, n_out)  # the same filter, used in float32
        return first, count, w.astype(np.float32)

    @njit(cache=False, nogil=True)
    def kernel(src: np.ndarray, top: int, bottom: int, left: int, right: int,
               dst: np.ndarray) -> None:
        h_in, w_in = bottom - top, right - left
        h_out, w_out = dst.shape[0], dst.shape[1]
        fx, cx, wx = weights(w_in, w_out)
        fy, cy, wy = weights(h_in, h_out)
        rows = np.zeros((h_in, w_out, 3), np.float32)
        for r in range(h_in):
            for o in range(w_out):
                for c in range(3):
                    acc = np.float32(0.0)
                    for k in range(cx[o]):
                        acc += wx[o, k] * np.float32(src[top + r, left + fx[o] + k, c])
                    rows[r, o, c] = acc
        for o in range(h_out):
            for x in range(w_out):
                for c in range(3):
                    acc = np.float32(0.0)
                    for k in range(cy[o]):
                        acc += wy[o, k] * rows[fy[o] + k, x, c]
                    v = np.floor(acc + np.float32(0.5))
                    dst[o, x, c] = np.uint8(min(max(v, 0.0), 255.0))

    return kernel


def stages(images: list[np.ndarray], blobs: list[bytes], count: int) -> dict[str, float]:
    """ms per view of each step the ViewLoader takes, on the same images and crops."""
    import cv2
    import simplejpeg
    import torch
    from ffcv.fields.rgb_image import get_random_crop
    from ffcv.libffcv import resize_crop
    from PIL import Image

    from components.data.augment.ffcv_ops import _color_jitter, _to_grayscale
    from components.data.augment.resize import resize_crop_bilinear

    cv2.setNumThreads(1)
    rng = np.random.default_rng(1)
    np.random.seed(1)
    imgs = [images[i % len(images)] for i in range(count)]
    crops = [get_random_crop(im.shape[0], im.shape[1], np.array([0.08, 1.0]),
                             np.array([3 / 4, 4 / 3])) for im in imgs]
    out = np.zeros((count, RES, RES, 3), np.uint8)
    out.fill(1)  # every page touched: no first-write page faults in the first stage timed

    def per_view(fn: Callable[[int], Any]) -> float:
        fn(0)  # compile / warm
        t0 = time.process_time()
        for k in range(count):
            fn(k)
        return (time.process_time() - t0) * 1e3 / count

    def bilinear(k: int) -> None:
        i, j, h, w = crops[k]
        resize_crop_bilinear(imgs[k], i, i + h, j, j + w, out[k])

    from components.data.augment.resize import _resize_bilinear

    mirrored = out.copy()

    def bilinear_mirrored(k: int) -> None:  # the reader's flip: fused into the resize
        i, j, h, w = crops[k]
        _resize_bilinear(imgs[k], i, i + h, j, j + w, mirrored[k], True)

    float_kernel = _float_kernel()

    def before(k: int) -> None:
        i, j, h, w = crops[k]
        float_kernel(imgs[k], i, i + h, j, j + w, out[k])

    def area(k: int) -> None:
        i, j, h, w = crops[k]
        resize_crop(imgs[k], i, i + h, j, j + w, out[k])

    pil = [Image.fromarray(im) for im in imgs]

    def pil_bilinear(k: int) -> None:
        i, j, h, w = crops[k]
        pil[k].resize((RES, RES), Image.BILINEAR, box=(j, i, j + w, i + h))

    flipped = np.zeros_like(out)

    def flip(k: int) -> None:
        flipped[k] = out[k][:, ::-1]

    draws = rng.uniform(0.6, 1.4, (count, 3))
    hues = rng.uniform(-0.1, 0.1, count)
    jit_mask, grey_mask = rng.random(count) < 0.8, rng.random(count) < 0.2
    work = out.copy()

    def colour(k: int) -> None:
        work[k] = out[k]
        if jit_mask[k]:
            b, c, s = draws[k]
            _color_jitter(work[k], b, c, s, hues[k], True, True, True, True)
        if grey_mask[k]:
            _to_grayscale(work[k], work[k])

    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    chw = torch.from_numpy(out).permute(0, 3, 1, 2)

    def normalise_stack(k: int) -> None:  # one batch of BATCH images, two views: per view
        if k % BATCH == 0:
            sl = chw[k:k + BATCH]
            torch.stack([(sl.float() - mean) / std, (sl.float() - mean) / std], dim=1)

    def normalise_into(k: int) -> None:  # the reader before: torch ops from NCHW
        if k % BATCH == 0:
            sl = chw[k:k + BATCH]
            dst = torch.empty((sl.shape[0], VIEWS, *sl.shape[1:]), dtype=torch.float32)
            for v in range(VIEWS):
                torch.sub(sl, mean, out=dst[:, v]).div_(std)

    from components.data.normalise import HostBatchPool, normalise_hwc_into, normalise_table

    hwc = out  # [count, 224, 224, 3] uint8: FFCV's layout
    table = normalise_table(mean.view(3).numpy(), std.view(3).numpy())

    def normalise_kernel(k: int) -> None:  # one numba pass from HWC into a new tensor
        if k % BATCH == 0:
            sl = hwc[k:k + BATCH]
            dst = torch.empty((sl.shape[0], VIEWS, 3, *sl.shape[1:3]), dtype=torch.float32)
            for v in range(VIEWS):
                normalise_hwc_into(sl, dst[:, v].numpy(), table)

    pool = HostBatchPool()

    def normalise_pooled(k: int) -> None:  # the reader now: into a reused host buffer
        if k % BATCH == 0:
            sl = hwc[k:k + BATCH]
            dst = pool.take((sl.shape[0], VIEWS, 3, *sl.shape[1:3]))
            for v in range(VIEWS):
                normalise_hwc_into(sl, dst[:, v].numpy(), table)

    normalise_kernel(0)  # its numba compile
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    stack_ms = per_view(normalise_stack) / VIEWS
    faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    into_ms = per_view(normalise_into) / VIEWS
    faults2 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(f"page faults per view: normalise + stack {(faults1 - faults0) / count / VIEWS:.0f}, "
          f"into one tensor {(faults2 - faults1) / count / VIEWS:.0f}")
    return {
        "decode (simplejpeg)": per_view(
            lambda k: simplejpeg.decode_jpeg(blobs[k % len(blobs)], colorspace="RGB")),
        "crop+resize bilinear (now)": per_view(bilinear),
        "crop+resize bilinear float (before)": per_view(before),
        "crop+resize INTER_AREA (FFCV)": per_view(area),
        "crop+resize PIL bilinear": per_view(pil_bilinear),
        "crop+resize bilinear, mirrored (the reader's flip, fused)": per_view(bilinear_mirrored),
        "flip (FFCV's op: a copy; the reader no longer runs it)": per_view(flip),
        "colour (jitter p=.8, grey p=.2)": per_view(colour),
        "normalise + stack (before: 3 temporaries per view + stack)": stack_ms,
        "normalise into one tensor per batch, torch sub + div from NCHW (before)": into_ms,
        "normalise into one new tensor per batch, one numba pass from HWC (before)":
            per_view(normalise_kernel) / VIEWS,
        "normalise into a pooled host buffer, one numba pass from HWC (now)":
            per_view(normalise_pooled) / VIEWS,
    }


def write_modes(count: int) -> list[tuple[str, int, float, float]]:
    """The ``write_mode`` trade-off: (mode, max side, KiB per image, decode ms per image),
    for JPEG at three qualities and raw, at max side 256 / 384 / 512 (raw's "decode" is the
    copy out of the page)."""
    import simplejpeg
    from ffcv.fields.rgb_image import encode_jpeg

    out = []
    for side in (256, 384, 512):
        images, _ = make_jpegs(count, side, quality=90)
        for q in (75, 90, 95):
            blobs = [encode_jpeg(im, q).tobytes() for im in images]
            t0 = time.process_time()
            for b in blobs:
                simplejpeg.decode_jpeg(b, colorspace="RGB")
            ms = (time.process_time() - t0) * 1e3 / count
            out.append((f"jpg q{q}", side, sum(map(len, blobs)) / count / 1024, ms))
        t0 = time.process_time()
        for im in images:
            im.copy()
        ms = (time.process_time() - t0) * 1e3 / count
        out.append(("raw", side, sum(im.nbytes for im in images) / count / 1024, ms))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=2700)
    ap.add_argument("--side", type=int, default=256, choices=[256, 384, 512])
    ap.add_argument("--batches", type=int, default=16, help="timed batches per loader")
    ap.add_argument("--skip", nargs="*", default=[], help="rows to leave out (by key)")
    ap.add_argument("--no-jit", action="store_true", help="FFCV uncompiled (a quick smoke run)")
    ap.add_argument("--stage-views", type=int, default=256, help="crops timed per stage")
    ap.add_argument("--write-modes", type=int, default=0, metavar="N",
                    help="only the write_mode table (N images per size), no loaders")
    a = ap.parse_args()

    import ffcv  # noqa: F401  (sets torch to one thread)
    import torch

    from components.data.reader import set_jit

    torch.set_num_threads(1)
    if a.write_modes:
        print("| write_mode | max side | KiB per image | decode ms per image (1 thread) |")
        print("|---|---:|---:|---:|")
        for mode, side, kib, ms in write_modes(a.write_modes):
            print(f"| {mode} | {side} | {kib:.1f} | {ms:.3f} |")
        return
    set_jit(not a.no_jit)
    t0 = time.perf_counter()
    images, blobs = make_jpegs(a.images, a.side)
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder, beton = write_data(images, blobs, Path(tmp))
        made = time.perf_counter() - t0
        runs: dict[str, Callable[[], dict[str, float]]] = {
            "floor": lambda: run_floor(blobs, a.batches * VIEWS),
            "ffcv": lambda: run_ffcv(beton, a.batches),
            "torchvision": lambda: run_torchvision(folder, a.batches),
            "viewloader": lambda: run_viewloader(beton, a.batches, colour=True, batched=False),
            "viewloader_nocolour": lambda: run_viewloader(beton, a.batches, colour=False,
                                                          batched=False),
            "viewloader_nocolour_per_view": lambda: run_viewloader(
                beton, a.batches, colour=False, batched=False, decode_per_view=True),
            "viewloader_batched": lambda: run_viewloader(beton, a.batches, colour=True,
                                                         batched=True),
            "device_crops_loader": lambda: run_device_crops(beton, a.batches,
                                                            loader_side=True),
            "device_crops_here": lambda: run_device_crops(beton, a.batches,
                                                          loader_side=False),
        }
        for key, fn in runs.items():
            if key not in a.skip:
                rows[key] = fn()
                print(f"  {key}: {rows[key]['per_core']:.0f} views/CPU-s", flush=True)
    st = stages(images, blobs, a.stage_views)

    names = {
        "floor": "decode floor: simplejpeg (libjpeg-turbo), 1 thread",
        "ffcv": "FFCV Loader, RRC (INTER_AREA) + flip, 1 thread",
        "torchvision": "torchvision ImageFolder + DataLoader(0), RRC + flip",
        "viewloader": "simgraph ViewLoader, colour ops in FFCV",
        "viewloader_nocolour": "simgraph ViewLoader, no colour ops (one decode per image)",
        "viewloader_nocolour_per_view": "simgraph ViewLoader, no colour ops, one decode per "
                                        "view (before)",
        "viewloader_batched": "simgraph ViewLoader, batched colour ops (CPU)",
        "device_crops_loader": "simgraph ViewLoader, crops on the device: the loader's CPU "
                               "side (decode into slots + draws; the GPU path's per-core cost)",
        "device_crops_here": "simgraph ViewLoader, crops on the device, that device this CPU",
    }
    kb = sum(len(b) for b in blobs) / len(blobs) / 1024
    print(f"\n{a.images} JPEGs q90, max side {a.side} ({kb:.1f} KiB each, made + written in "
          f"{made:.0f} s), {VIEWS} views of {RES}, batch {BATCH}, {a.batches} timed batches "
          f"per loader, one thread each, {os.cpu_count()} CPUs\n")
    floor = rows.get("floor", {}).get("per_core")
    ff = rows.get("ffcv", {}).get("per_core")
    print("| reader | views/s per core | × decode floor | × FFCV loader | wall views/s |"
          " JIT + first batch s |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, r in rows.items():
        x_floor = f"{r['per_core'] / floor:.2f}" if floor else "–"
        x_ff = f"{r['per_core'] / ff:.2f}" if ff else "–"
        comp = f"{r['compile_s']:.0f}" if "compile_s" in r else "–"
        print(f"| {names[key]} | {r['per_core']:.0f} | {x_floor} | {x_ff} | {r['wall']:.0f} |"
              f" {comp} |")
    print(f"\nPer view, outside the loader (ms of CPU, {a.stage_views} crops of the same "
          "images):\n")
    print("| stage | ms per view |")
    print("|---|---:|")
    for k, v in st.items():
        print(f"| {k} | {v:.3f} |")


if __name__ == "__main__":
    main()
