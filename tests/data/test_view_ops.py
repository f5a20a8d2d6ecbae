"""Crops are resized as torchvision resizes them (``components/data/augment/resize.py``):
bilinear with antialias, within one grey level of ``torchvision.transforms.v2.functional.
resized_crop`` when enlarging and when shrinking, also through the reader's FFCV pipeline;
``interpolation: area`` keeps FFCV's own ``INTER_AREA`` decoders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from bench.parity import plain_transform
from components.config import AugmentConfig, ConfigError
from components.data.augment.resize import (
    BilinearCenterCrop,
    BilinearRandomResizedCrop,
    _resize_bilinear,
    resize_crop_bilinear,
)
from components.data.reader import ViewLoader, set_jit
from components.data.view_ops import pipeline_ops


@pytest.mark.parametrize("smooth", [False, True])
def test_resize_matches_torchvision_within_one_level(smooth: bool) -> None:
    rng = np.random.default_rng(1)
    worst, mean = 0, []
    for _ in range(60):
        hh, ww = (int(v) for v in rng.integers(6, 70, 2))
        img = rng.integers(0, 256, (hh, ww, 3), dtype=np.uint8)
        if smooth:
            img = (np.cumsum(img, axis=1) // 8 % 256).astype(np.uint8)
        h, w = int(rng.integers(1, hh + 1)), int(rng.integers(1, ww + 1))
        i, j = int(rng.integers(0, hh - h + 1)), int(rng.integers(0, ww - w + 1))
        oh, ow = (int(v) for v in rng.integers(3, 60, 2))  # enlarging and shrinking
        out = np.zeros((oh, ow, 3), np.uint8)
        resize_crop_bilinear(img, i, i + h, j, j + w, out)
        want = TF.resized_crop(torch.from_numpy(img).permute(2, 0, 1), i, j, h, w, [oh, ow],
                               antialias=True).permute(1, 2, 0).numpy()
        d = np.abs(out.astype(int) - want.astype(int))
        worst, mean = max(worst, int(d.max())), [*mean, float(d.mean())]
    assert worst <= 1 and np.mean(mean) < 0.3


@pytest.mark.parametrize("crop, size", [
    ((70, 90), (224, 224)),  # enlarge both axes (a small RandomResizedCrop of a 256 px image)
    ((250, 240), (224, 224)),  # shrink both
    ((100, 250), (224, 224)),  # enlarge rows, shrink columns
    ((250, 100), (224, 224)),  # shrink rows, enlarge columns
    ((256, 256), (224, 96)),  # shrink by 1.1 and by 2.7
    ((1, 1), (5, 7)),  # one pixel
    ((3, 40), (224, 9)),  # enlarge 75x, shrink 4.4x
])
def test_fixed_point_kernel_matches_torchvision_per_regime(crop: tuple[int, int],
                                                           size: tuple[int, int]) -> None:
    """The fixed-point kernel at 224 px: enlarging (triangle support 1), shrinking (support
    widened) and mixed (one axis each way) agree with torchvision's uint8 antialiased resize
    to within one grey level, and with a float64 reference of the same filter to within one
    (the uint8 intermediate rounding of the horizontal pass, then the final one)."""
    rng = np.random.default_rng(sum(crop) + sum(size))
    img = rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)
    img = (np.cumsum(img, axis=1) // 16 % 256).astype(np.uint8)  # smooth-ish and noisy
    h, w = crop
    i, j = (256 - h) // 3, (256 - w) // 2
    out = np.zeros((*size, 3), np.uint8)
    resize_crop_bilinear(img, i, i + h, j, j + w, out)
    chw = torch.from_numpy(img).permute(2, 0, 1)
    want = TF.resized_crop(chw, i, j, h, w, list(size), antialias=True).permute(1, 2, 0)
    d = np.abs(out.astype(int) - want.numpy().astype(int))
    assert d.max() <= 1 and d.mean() < 0.3
    exact = TF.resized_crop(chw.double(), i, j, h, w, list(size), antialias=True)
    exact = exact.permute(1, 2, 0).numpy()
    assert np.abs(out - exact).max() <= 1.01  # two roundings of 0.5 (as torch)


def test_empty_crop_gives_black() -> None:
    out = np.full((4, 4, 3), 7, np.uint8)
    resize_crop_bilinear(np.zeros((8, 8, 3), np.uint8), 2, 2, 0, 8, out)
    assert not out.any()


def test_enlarged_crop_is_bilinear_not_blocky() -> None:
    """The case FFCV's INTER_AREA gets wrong: a 2-pixel ramp enlarged to 8 pixels."""
    img = np.zeros((1, 2, 3), np.uint8)
    img[0, 1] = 200
    out = np.zeros((1, 8, 3), np.uint8)
    resize_crop_bilinear(img, 0, 1, 0, 2, out)
    # half-pixel centres: flat at the ends, a linear ramp in between (nearest would be 4 + 4)
    assert out[0, :, 0].tolist() == [0, 0, 25, 75, 125, 175, 200, 200]


def _coordinate_image(side: int) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side]
    return np.stack([x * 255 // (side - 1), y * 255 // (side - 1),
                     (x * y) % 256], -1).astype(np.uint8)


@pytest.mark.parametrize("stored, resolution", [(20, 32), (48, 32)])
def test_reader_eval_views_match_torchvision(tmp_path: Path, stored: int,
                                             resolution: int) -> None:
    """Through FFCV: the reader's centre views of a stored image, enlarged or shrunk, are
    torchvision's ``Resize(antialias=True)`` of it to within one grey level."""
    from components.data.shards import page_size_for, write_shard

    img = _coordinate_image(stored)
    write_shard(tmp_path / "val.beton", [img] * 4, np.zeros(4, int), np.arange(4), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(stored, 0))
    aug = AugmentConfig(resolution=resolution, mean=[0.0, 0.0, 0.0], std=[1 / 255] * 3)
    set_jit(False)
    loader = ViewLoader(tmp_path / "val.beton", batch_size=4, views=1, augment=aug,
                        train=False, num_workers=1, with_captions=False)
    got = next(iter(loader)).images[:, 0]  # [4, 3, r, r], 0..255 floats
    want = plain_transform(aug, train=False)(torch.from_numpy(img).permute(2, 0, 1))
    assert float((got - want[None]).abs().max()) <= 1.0 + 1e-3


def test_interpolation_choice_picks_the_decoder() -> None:
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder

    def ops(interpolation: str, train: bool) -> list:
        aug = AugmentConfig(interpolation=interpolation)  # type: ignore[arg-type]
        return pipeline_ops(["image", "label", "sample_id"], augment=aug, train=train, views=1,
                            device=torch.device("cpu"), batched_augment=False,
                            with_captions=False)["image"]

    assert type(ops("bilinear", True)[0]) is BilinearRandomResizedCrop
    # the flip is fused into the bilinear crop: no FFCV RandomHorizontalFlip (a copy per view)
    assert [type(o).__name__ for o in ops("bilinear", True)[:2]] == [
        "BilinearRandomResizedCrop", "RandomColorJitter"]
    assert ops("bilinear", True)[0].flip_p == 0.5
    assert type(ops("area", True)[1]).__name__ == "RandomHorizontalFlip"
    assert type(ops("bilinear", False)[0]) is BilinearCenterCrop
    assert type(ops("area", True)[0]) is RandomResizedCropRGBImageDecoder
    assert type(ops("area", False)[0]) is CenterCropRGBImageDecoder
    with pytest.raises(ConfigError, match="interpolation='nearest' is not allowed"):
        AugmentConfig(interpolation="nearest")  # type: ignore[arg-type]


@pytest.mark.parametrize("crop, size", [((7, 9), (12, 12)), ((30, 20), (5, 11)), ((1, 1), (3, 1))])
def test_the_mirrored_resize_is_the_flip_of_the_resize(crop: tuple[int, int],
                                                      size: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(crop))
    img = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
    plain, mirrored = (np.zeros((*size, 3), np.uint8) for _ in range(2))
    _resize_bilinear(img, 3, 3 + crop[0], 5, 5 + crop[1], plain, False)
    _resize_bilinear(img, 3, 3 + crop[0], 5, 5 + crop[1], mirrored, True)
    assert np.array_equal(mirrored, plain[:, ::-1])


def test_reader_flips_inside_the_crop(tmp_path: Path) -> None:
    """``flip_p: 1`` gives the mirror image of the views ``flip_p`` ≈ 0 gives (the same draws:
    one per image either way), through the reader; 0 draws nothing; outside [0, 1] refused."""
    from components.data.shards import page_size_for, write_shard

    rng = np.random.default_rng(3)
    imgs = [rng.integers(0, 256, (14, 14, 3), dtype=np.uint8) for _ in range(6)]
    write_shard(tmp_path / "t.beton", imgs, np.zeros(6, int), np.arange(6), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(14, 0))
    set_jit(False)

    def views(flip_p: float) -> torch.Tensor:
        aug = AugmentConfig(resolution=8, flip_p=flip_p, jitter_p=0.0, grayscale_p=0.0)
        loader = ViewLoader(tmp_path / "t.beton", batch_size=6, views=2, augment=aug,
                            num_workers=1, seed=5, with_captions=False)
        loader.set_epoch(0)
        return next(iter(loader)).images

    never, always = views(1e-300), views(1.0)
    assert torch.equal(always, never.flip(-1))
    assert not torch.equal(always, never)
    with pytest.raises(ValueError, match=r"flip_p=1.5 is not allowed: give a probability"):
        BilinearRandomResizedCrop((8, 8), flip_p=1.5)


# ------------------------------------------------------- several views from one decode


@pytest.mark.parametrize("mode", ["raw", "jpg"])
@pytest.mark.parametrize("flip_p", [0.0, 1.0])
def test_views_from_one_decode_are_each_their_own_crop(tmp_path: Path, mode: str,
                                                      flip_p: float) -> None:
    """``BilinearRandomResizedCropViews``: view ``v`` of sample ``b`` is the bilinear resize
    (mirrored with ``flip_p`` 1) of the ``b * V + v``-th crop drawn, of image ``b`` as decoded
    once — crops drawn sample by sample, view by view."""
    from ffcv.fields.decoders import SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline import PipelineSpec
    from ffcv.transforms import ToTensor

    from components.data.augment.resize import BilinearRandomResizedCropViews
    from components.data.shards import page_size_for, write_shard

    rng = np.random.default_rng(4)
    imgs = [rng.integers(0, 256, (14, 17, 3), dtype=np.uint8) for _ in range(5)]
    path = tmp_path / "t.beton"
    write_shard(path, imgs, np.zeros(5, int), np.arange(5), None, write_mode=mode,
                jpeg_quality=95, page_size=page_size_for(17, 0))
    crops: list[tuple[int, int, int, int]] = []

    def scripted(height: int, width: int, scale: object, ratio: object) -> tuple:
        k = len(crops)  # a different crop on every call, recorded in order
        crop = (k % 3, (2 * k) % 5, int(height) - k % 3 - k % 4, int(width) - (2 * k) % 5 - 1)
        crops.append(crop)
        return crop

    class Scripted(BilinearRandomResizedCropViews):
        @property
        def get_crop_generator(self) -> object:
            return scripted

    set_jit(False)
    views = 3
    loader = Loader(str(path), batch_size=5, num_workers=1, order=OrderOption.SEQUENTIAL,
                    pipelines={"image": [Scripted((6, 7), views, flip_p=flip_p), ToTensor()],
                               "whole": PipelineSpec("image", decoder=SimpleRGBImageDecoder(),
                                                     transforms=[ToTensor()])})
    names = list(loader.pipeline_specs)
    out = next(iter(loader))
    got, whole = out[names.index("image")].numpy(), out[names.index("whole")].numpy()
    assert got.shape == (5, views, 6, 7, 3) and len(crops) == 5 * views
    if mode == "raw":
        assert np.array_equal(whole, np.stack(imgs))
    for b in range(5):
        for v in range(views):
            i, j, h, w = crops[b * views + v]
            want = np.zeros((6, 7, 3), np.uint8)
            _resize_bilinear(whole[b], i, i + h, j, j + w, want, flip_p == 1.0)
            assert np.array_equal(got[b, v], want), (b, v)
    with pytest.raises(ValueError, match="views=0 is not allowed"):
        BilinearRandomResizedCropViews((6, 7), 0)


def test_views_of_one_augmentation_share_a_decode_only_with_nothing_after_the_crop() -> None:
    """One ``[B, V, H, W, 3]`` output per run of views of one augmentation whose FFCV
    pipeline is the bilinear crop alone (colour ops batched, or none); per-view outputs where
    FFCV runs colour ops per sample, for ``interpolation: area`` and for evaluation."""
    from components.data.augment.resize import BilinearRandomResizedCropViews
    from components.data.view_ops import view_slots

    cpu = torch.device("cpu")
    plain = AugmentConfig(resolution=8, jitter_p=0.0, grayscale_p=0.0)
    small = AugmentConfig(resolution=6, jitter_p=0.0, grayscale_p=0.0, scale=[0.1, 0.3])
    coloured = AugmentConfig(resolution=8)

    def slots(aug: AugmentConfig, *, batched: bool = False, train: bool = True,
              per_view: list[AugmentConfig] | None = None, views: int = 3) -> list:
        ops = pipeline_ops(["image", "label", "sample_id"], augment=aug, train=train,
                           views=views, device=cpu, batched_augment=batched,
                           with_captions=False, view_augments=per_view)
        multi = {k for k, o in ops.items() if isinstance(o[0], BilinearRandomResizedCropViews)}
        return [(key, k, key in multi) for key, k in view_slots(ops)]

    assert slots(plain) == [("image", 0, True), ("image", 1, True), ("image", 2, True)]
    assert slots(coloured, batched=True) == slots(plain)
    assert slots(coloured) == [("image", None, False), ("image_1", None, False),
                               ("image_2", None, False)]
    area = AugmentConfig(resolution=8, jitter_p=0.0, grayscale_p=0.0, interpolation="area")
    assert [s[2] for s in slots(area)] == [False] * 3
    assert slots(plain, train=False) == [("image", None, False)]
    assert slots(plain, views=1) == [("image", None, False)]
    # multi-crop: a shared decode per group, named by its first view
    assert slots(plain, per_view=[plain, plain, small, small, small], views=5) == [
        ("image", 0, True), ("image", 1, True), ("image_2", 0, True), ("image_2", 1, True),
        ("image_2", 2, True)]
    assert slots(plain, per_view=[plain, small, plain], views=3) == [
        ("image", None, False), ("image_1", None, False), ("image_2", None, False)]
