"""Crops made on the device (``components/data/augment/device_crop.py``): the loader's slots
hold each image as decoded and its views' crop and flip draws; :func:`crop_views` resizes them
as the CPU kernel does (``_resize_bilinear``: torchvision's antialiased bilinear), within one
grey level, enlarging and shrinking, flipped or not, for images of different sizes in one
batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from components.data.augment.device_crop import (
    FIELDS_PER_VIEW,
    DecodeForDeviceCrops,
    crop_views,
    pixel_bytes,
    slot_bytes,
)
from components.data.augment.resize import _resize_bilinear
from components.data.reader import set_jit


def pack(images: list[np.ndarray], boxes: list[list[tuple[int, int, int, int, int]]],
         max_hw: tuple[int, int]) -> torch.Tensor:
    """The slots :class:`DecodeForDeviceCrops` writes, built in Python: the layout spec."""
    views = len(boxes[0])
    out = np.full((len(images), slot_bytes(*max_hw, views)), 77, np.uint8)  # stale bytes
    for b, (img, bx) in enumerate(zip(images, boxes, strict=True)):
        h, w = img.shape[:2]
        for r in range(h):
            out[b, r * max_hw[1] * 3:r * max_hw[1] * 3 + w * 3] = img[r].reshape(-1)
        meta = np.array([h, w, *[x for box in bx for x in box]], "<i4")
        out[b, pixel_bytes(*max_hw):] = meta.view(np.uint8)
    return torch.from_numpy(out)


def cpu_crop(img: np.ndarray, box: tuple[int, int, int, int, int],
             size: tuple[int, int]) -> np.ndarray:
    i, j, h, w, flip = box
    want = np.zeros((*size, 3), np.uint8)
    _resize_bilinear(np.ascontiguousarray(img), i, i + h, j, j + w, want, bool(flip))
    return want


@pytest.mark.parametrize("crop, size", [
    ((70, 90), (224, 224)),  # enlarge both axes
    ((250, 240), (224, 224)),  # shrink both
    ((100, 250), (224, 96)),  # enlarge rows, shrink columns 2.6x
    ((1, 1), (5, 7)),  # one pixel
    ((3, 40), (224, 9)),  # enlarge 75x, shrink 4.4x
])
def test_device_crops_match_the_cpu_kernel_per_regime(crop: tuple[int, int],
                                                      size: tuple[int, int]) -> None:
    rng = np.random.default_rng(7)
    max_hw = (256, 256)
    imgs = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
            (np.cumsum(rng.integers(0, 256, (251, 253, 3)), axis=1) // 8 % 256).astype(np.uint8)]
    boxes = [[(int(rng.integers(0, im.shape[0] - crop[0] + 1)),
               int(rng.integers(0, im.shape[1] - crop[1] + 1)), *crop, flip)
              for flip in (0, 1)] for im in imgs]
    got = crop_views(pack(imgs, boxes, max_hw), views=2, size=size, max_hw=max_hw)
    assert got.shape == (2, 2, 3, *size) and got.dtype == torch.uint8
    for b, im in enumerate(imgs):
        for v in range(2):
            want = cpu_crop(im, boxes[b][v], size)
            d = np.abs(got[b, v].permute(1, 2, 0).numpy().astype(int) - want.astype(int))
            assert d.max() <= 1 and d.mean() < 0.3, (b, v, d.max(), d.mean())


def test_images_of_several_sizes_in_one_batch_and_stale_bytes_around_them() -> None:
    """Each image is read at its own size from a slot of the widest's: the bytes past its
    rows and columns (77 here: left from an earlier batch) never reach a view."""
    rng = np.random.default_rng(3)
    max_hw = (40, 50)
    imgs = [rng.integers(0, 256, s + (3,), dtype=np.uint8) for s in [(40, 50), (9, 31), (33, 7)]]
    boxes = [[(0, 0, im.shape[0], im.shape[1], 0), (1, 2, im.shape[0] - 1, im.shape[1] - 2, 1),
              (im.shape[0] - 3, im.shape[1] - 4, 3, 4, 0)] for im in imgs]
    got = crop_views(pack(imgs, boxes, max_hw), views=3, size=(12, 16), max_hw=max_hw)
    for b, im in enumerate(imgs):
        for v in range(3):
            want = cpu_crop(im, boxes[b][v], (12, 16))
            d = np.abs(got[b, v].permute(1, 2, 0).numpy().astype(int) - want.astype(int))
            assert d.max() <= 1, (b, v)


def test_slots_of_another_shape_are_refused() -> None:
    slots = torch.zeros((2, slot_bytes(8, 8, 2)), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"expected \[B, 240\] uint8 for 2 views of images up "
                                         r"to 8x8"):
        crop_views(slots[:, :-4], views=2, size=(4, 4), max_hw=(8, 8))
    with pytest.raises(ValueError, match="dtype torch.float32"):
        crop_views(slots.float(), views=2, size=(4, 4), max_hw=(8, 8))
    with pytest.raises(ValueError, match="views=0 is not allowed"):
        DecodeForDeviceCrops((6, 7), 0)
    with pytest.raises(ValueError, match="flip_p=1.5 is not allowed"):
        DecodeForDeviceCrops((6, 7), 2, flip_p=1.5)


@pytest.mark.parametrize("mode", ["raw", "jpg"])
def test_the_loader_writes_each_image_and_its_draws_into_its_slot(tmp_path: Path,
                                                                   mode: str) -> None:
    """Through FFCV: images of three sizes in one file, each decoded once into its slot with
    its own size, and view ``v`` of sample ``b`` is the ``b * V + v``-th crop drawn (flipped
    by the draw after it): the same views as ``BilinearRandomResizedCropViews`` makes on the
    CPU from the same draws."""
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import ToTensor

    from components.data.shards import page_size_for, write_shard

    rng = np.random.default_rng(4)
    sizes = [(14, 17), (9, 12), (17, 10), (14, 17), (11, 11)]
    imgs = [rng.integers(0, 256, s + (3,), dtype=np.uint8) for s in sizes]
    if mode == "jpg":  # smooth pictures: JPEG keeps them close
        imgs = [(np.add.outer(np.arange(h) * 6, np.arange(w) * 5)[..., None]
                 + np.array([0, 40, 80])).astype(np.uint8) for h, w in sizes]
    path = tmp_path / "t.beton"
    write_shard(path, imgs, np.zeros(5, int), np.arange(5), None, write_mode=mode,
                jpeg_quality=95, page_size=page_size_for(17, 0))
    crops: list[tuple[int, int, int, int]] = []

    def scripted(height: int, width: int, scale: object, ratio: object) -> tuple:
        k = len(crops)
        crop = (k % 3, (2 * k) % 4, int(height) - k % 3 - k % 4, int(width) - (2 * k) % 4 - 1)
        crops.append(crop)
        return crop

    class Scripted(DecodeForDeviceCrops):
        @property
        def get_crop_generator(self) -> object:
            return scripted

    set_jit(False)
    views = 2
    op = Scripted((6, 7), views, flip_p=0.5)
    loader = Loader(str(path), batch_size=5, num_workers=1, order=OrderOption.SEQUENTIAL,
                    pipelines={"image": [op, ToTensor()]})
    slots = next(iter(loader))[0].clone()
    assert op.max_hw == (17, 17) and slots.shape == (5, slot_bytes(17, 17, views))
    meta = slots[:, pixel_bytes(17, 17):].contiguous().view(torch.int32)
    assert meta[:, :2].tolist() == [list(s) for s in sizes]
    boxes = meta[:, 2:].view(5, views, FIELDS_PER_VIEW).tolist()
    assert [tuple(box[:4]) for bx in boxes for box in bx] == crops[-5 * views:]
    flips = [box[4] for bx in boxes for box in bx]
    assert set(flips) <= {0, 1}
    got = crop_views(slots, views=views, size=(6, 7), max_hw=(17, 17))
    for b, (h, w) in enumerate(sizes):
        stored = slots[b, :17 * 17 * 3].view(17, 17, 3)[:h, :w].numpy()
        if mode == "raw":
            assert np.array_equal(stored, imgs[b])
        else:  # q95: the decode, not the original
            assert np.abs(stored.astype(int) - imgs[b]).mean() < 12
        for v in range(views):
            want = cpu_crop(stored, tuple(boxes[b][v]), (6, 7))  # type: ignore[arg-type]
            d = np.abs(got[b, v].permute(1, 2, 0).numpy().astype(int) - want.astype(int))
            assert d.max() <= 1, (b, v)


def test_two_compiled_loaders_in_one_process(tmp_path: Path) -> None:
    """Compiled (numba), as on a GPU node: a second loader in the same process (evaluation
    after training, a sweep's trials) compiles its own copy of the decoder's helpers — one
    dispatcher shared by both lost an overload to the other's compile (numba ``KeyError``)."""
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline.compiler import Compiler
    from ffcv.transforms import ToTensor

    from components.data.shards import page_size_for, write_shard

    rng = np.random.default_rng(5)
    sizes = [(20, 30), (30, 20), (25, 25)] * 3
    imgs = [rng.integers(0, 256, s + (3,), dtype=np.uint8) for s in sizes]
    path = tmp_path / "t.beton"
    write_shard(path, imgs, np.zeros(len(imgs), int), np.arange(len(imgs)), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(30, 0))
    enabled, threads = Compiler.is_enabled, Compiler.num_threads
    set_jit(True)
    try:
        for flip_p in (0.5, 1.0):
            op = DecodeForDeviceCrops((8, 8), 2, flip_p=flip_p)
            loader = Loader(str(path), batch_size=4, num_workers=2,
                            order=OrderOption.SEQUENTIAL, drop_last=False,
                            pipelines={"image": [op, ToTensor()]})
            names, seen = list(loader.pipeline_specs), 0
            for out in loader:
                slots = out[names.index("image")]
                meta = slots[:, pixel_bytes(30, 30):].contiguous().view(torch.int32)
                assert [tuple(m) for m in meta[:, :2].tolist()] == sizes[seen:seen + len(slots)]
                assert crop_views(slots, views=2, size=(8, 8), max_hw=(30, 30)).shape == (
                    len(slots), 2, 3, 8, 8)
                seen += len(slots)
            assert seen == len(sizes)
    finally:
        Compiler.set_enabled(enabled)
        Compiler.set_num_threads(threads)
