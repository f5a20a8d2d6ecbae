"""The FFCV reader: rank sharding, views, eval crops, labels/ids/captions (JIT off)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from components.config import AugmentConfig
from components.data.reader import ViewLoader
from components.data.sample_order import rank_order
from components.data.shards import page_size_for, write_shard

N = 37
PLAIN = AugmentConfig(resolution=12, jitter_p=0.0, grayscale_p=0.0)  # crop + flip only


pytestmark = pytest.mark.usefixtures("no_jit")


@pytest.fixture(scope="module")
def beton(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(N)]
    caps = rng.standard_normal((N, 5)).astype(np.float16)
    path = tmp_path_factory.mktemp("ds") / "train.beton"
    write_shard(path, images, np.arange(N) % 4, np.arange(N) + 100, caps, write_mode="raw",
                jpeg_quality=90, page_size=page_size_for(12, 10))
    return path, images, caps


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 4, 10])
def test_rank_order_partitions_each_epoch(world: int, batch: int) -> None:
    for epoch in range(3):
        parts = [rank_order(N, seed=5, epoch=epoch, rank=r, world_size=world, batch_size=batch,
                            shuffle=True, drop_last=False) for r in range(world)]
        assert sorted(np.concatenate(parts).tolist()) == list(range(N))
        dropped = [rank_order(N, seed=5, epoch=epoch, rank=r, world_size=world,
                              batch_size=batch, shuffle=True, drop_last=True)
                   for r in range(world)]
        flat = np.concatenate(dropped)
        assert len(set(flat.tolist())) == len(flat)  # no repeats
        assert len({len(d) for d in dropped}) == 1 and len(dropped[0]) % batch == 0
        assert N - len(flat) < world * batch
    a = rank_order(N, seed=5, epoch=0, rank=0, world_size=1, batch_size=1, shuffle=True,
                   drop_last=False)
    b = rank_order(N, seed=5, epoch=1, rank=0, world_size=1, batch_size=1, shuffle=True,
                   drop_last=False)
    assert not np.array_equal(a, b)


def test_two_ranks_read_every_sample_once(beton: tuple) -> None:
    path, images, caps = beton
    seen: dict[int, list[int]] = {}
    for epoch in (0, 1):
        ids = []
        for rank in (0, 1):
            loader = ViewLoader(path, batch_size=4, views=2, train=True, seed=3, rank=rank,
                                world_size=2, drop_last=False, num_workers=1, augment=PLAIN)
            loader.set_epoch(epoch)
            for b in loader:
                ids += b.sample_ids.tolist()
                for j, sid in enumerate(b.sample_ids.tolist()):
                    assert b.labels[j] == (sid - 100) % 4
                    np.testing.assert_allclose(b.captions[j].numpy(),
                                               caps[sid - 100].astype(np.float32))
        assert sorted(ids) == list(range(100, 100 + N))
        seen[epoch] = ids
    assert seen[0] != seen[1]  # a new shuffle each epoch


def test_train_views_shapes_and_normalisation(beton: tuple) -> None:
    path, _, _ = beton
    aug = AugmentConfig(resolution=8, jitter_p=0.0, grayscale_p=0.0)
    loader = ViewLoader(path, batch_size=5, views=3, augment=aug, train=True, num_workers=1)
    assert len(loader) == N // 5
    b = next(iter(loader))
    assert b.images.shape == (5, 3, 3, 8, 8) and b.images.dtype == torch.float32
    assert b.captions is not None and b.captions.shape == (5, 5)
    # Views of one image differ (independent crops), and values are normalised pixels.
    assert not torch.equal(b.images[:, 0], b.images[:, 1])
    lo = (0 - torch.tensor(aug.mean)) / torch.tensor(aug.std)
    hi = (1 - torch.tensor(aug.mean)) / torch.tensor(aug.std)
    per_c = b.images.transpose(0, 2).reshape(3, -1)
    assert torch.all(per_c.min(1).values >= lo - 1e-5)
    assert torch.all(per_c.max(1).values <= hi + 1e-5)


def test_eval_view_is_the_stored_image(beton: tuple) -> None:
    path, images, _ = beton
    aug = AugmentConfig(resolution=12, mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
    loader = ViewLoader(path, batch_size=8, train=False, augment=aug, num_workers=1,
                        with_captions=False)
    got = 0
    for b in loader:
        assert b.images.shape[1] == 1 and b.captions is None
        for j, sid in enumerate(b.sample_ids.tolist()):
            img = (b.images[j, 0] * 255).round().byte().permute(1, 2, 0).numpy()
            np.testing.assert_array_equal(img, images[sid - 100])
            got += 1
    assert got == N  # eval: every sample, in file order, last batch kept


def test_batches_are_the_consumers_own(beton: tuple) -> None:
    """Each batch's images are a tensor of their own (FFCV reuses its buffers; the reader
    normalises into a new one per batch): batches kept stay what they were, and hold the
    normalised stored pixels exactly."""
    path, images, _ = beton
    aug = AugmentConfig(resolution=12, mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 0.2])
    loader = ViewLoader(path, batch_size=4, train=False, augment=aug, num_workers=1,
                        with_captions=False)
    kept = [(b, b.images.clone()) for b in loader]
    mean = torch.tensor(aug.mean).view(3, 1, 1) * 255
    std = torch.tensor(aug.std).view(3, 1, 1) * 255
    for b, first in kept:
        assert torch.equal(b.images, first)
        for j, sid in enumerate(b.sample_ids.tolist()):
            x = torch.from_numpy(images[sid - 100]).permute(2, 0, 1)
            assert torch.equal(b.images[j, 0], (x.float() - mean) / std)
    assert len({b.images.data_ptr() for b, _ in kept}) == len(kept)
    # A consumer that drops each batch gets the same few host buffers back (no fresh 77 MB
    # allocation, i.e. page faults, per 224-px batch), each batch still right.
    del kept, b, first
    made = loader._pool.made
    ptrs = set()
    for b in loader:
        ptrs.add(b.images.data_ptr())
        x = torch.from_numpy(images[b.sample_ids[0].item() - 100]).permute(2, 0, 1)
        assert torch.equal(b.images[0, 0], (x.float() - mean) / std)
    assert len(ptrs) <= 3 and loader._pool.made == made  # 2 alternate, + a short last batch


def test_simclr_colour_ops_run_on_cpu(beton: tuple) -> None:
    path, _, _ = beton
    aug = AugmentConfig(resolution=8, jitter_p=1.0, grayscale_p=1.0, blur_p=1.0)
    b = next(iter(ViewLoader(path, batch_size=6, views=2, augment=aug, num_workers=1)))
    assert b.images.shape == (6, 2, 3, 8, 8)
    pixels = b.images * torch.tensor(aug.std).view(1, 1, 3, 1, 1) + torch.tensor(
        aug.mean).view(1, 1, 3, 1, 1)
    # grayscale with p=1: the three channels are equal (up to normalisation rounding)
    assert torch.allclose(pixels[:, :, 0], pixels[:, :, 1], atol=1e-5)


_COMPILED = """
import sys
import numpy as np
from components.config import AugmentConfig
from components.data.reader import ViewLoader
from components.data.shards import page_size_for, write_shard
rng = np.random.default_rng(0)
n, path, dtype = 37, sys.argv[1], sys.argv[2]
caps = rng.standard_normal((n, 4)).astype(dtype)
write_shard(path, [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(n)],
            np.arange(n) % 4, np.arange(n), caps,
            write_mode="raw", jpeg_quality=90, page_size=page_size_for(12, 8))
aug = AugmentConfig(resolution=8, blur_p=0.5, grayscale_p=1.0)  # jitter p 0.8, then grey
loader = ViewLoader(path, batch_size=8, views=2, augment=aug, num_workers=2, drop_last=False)
mean = np.array(aug.mean, np.float32).reshape(1, 1, 3, 1, 1) * 255
std = np.array(aug.std, np.float32).reshape(1, 1, 3, 1, 1) * 255
for epoch in range(2):
    loader.set_epoch(epoch)
    ids = []
    for b in loader:
        assert b.images.shape[1:] == (2, 3, 8, 8) and b.captions.dtype.is_floating_point
        # the compiled grayscale ran on every view (under prange): equal channels, to float
        # rounding of the normalisation (blur keeps equal channels equal)
        rgb = b.images.numpy() * std + mean
        assert np.abs(rgb - rgb[:, :, :1]).max() < 1e-3, np.abs(rgb - rgb[:, :, :1]).max()
        got = b.captions.numpy()
        want = caps[b.sample_ids.numpy()].astype(np.float32)
        assert np.array_equal(got, want), (got, want)
        ids += b.sample_ids.tolist()
    assert sorted(ids) == list(range(n)), ids
print("OK")
"""


def test_float32_captions_read_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    caps = rng.standard_normal((7, 3)).astype(np.float32)
    write_shard(tmp_path / "f.beton", [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
                                       for _ in range(7)], np.zeros(7, int), np.arange(7), caps,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(12, 6))
    b = next(iter(ViewLoader(tmp_path / "f.beton", batch_size=7, views=1, train=False,
                             num_workers=1, augment=AugmentConfig(resolution=8))))
    assert b.captions is not None and b.captions.dtype == torch.float32
    np.testing.assert_array_equal(b.captions.numpy(), caps[b.sample_ids.numpy()])


@pytest.mark.slow
def test_compiled_two_view_pipeline(tmp_path: Path, dtype: str = "float16") -> None:
    """The real thing: numba-compiled FFCV pipeline with every SimCLR op, 2 threads (our
    colour ops under ``prange``; grayscale always, checked on every view), float16 captions
    (the default; stored as int16 bits, the path of ours inside FFCV's decoding — float32
    captions are FFCV's own NDArrayDecoder, read uncompiled in the tests above).

    In a fresh interpreter: the other tests switch FFCV's compiler off, and toggling it within
    one process is not something training ever does. One compile costs ~25 s of CI.
    """
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _COMPILED, str(tmp_path / "c.beton"), dtype],
                         cwd=root,
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_views_are_reproducible_across_loaders(beton: tuple) -> None:
    """Same (seed, rank, epoch) → the same views from a fresh Loader (exact resume needs it);
    FFCV's own stage order would otherwise vary with object addresses."""
    path, _, _ = beton
    aug = AugmentConfig(resolution=8, jitter_p=0.8, grayscale_p=0.3)

    def views(epoch: int) -> torch.Tensor:
        loader = ViewLoader(path, batch_size=6, views=3, augment=aug, num_workers=1, seed=3)
        loader.set_epoch(epoch)
        return torch.cat([b.images for b in loader])

    a = views(1)
    assert torch.equal(a, views(1))
    assert not torch.equal(a, views(2))
    assert not torch.equal(a[:, 0], a[:, 1])  # views differ from each other


@pytest.mark.parametrize("groups", [False, True], ids=["two-views", "view-groups"])
def test_device_crops_give_the_cpu_crops_views(beton: tuple, groups: bool) -> None:
    """The GPU path's crops made after the loader (``device_crops``, here on the CPU) are the
    views the crops in FFCV give from the same seed — the same draws, resized within one grey
    level — for two views of one size and for view groups of two sizes (a group of one)."""
    from components.config import ViewGroup

    path, _, _ = beton
    base = AugmentConfig(resolution=16, jitter_p=0.0, grayscale_p=0.0, flip_p=0.5,
                         mean=[0.0] * 3, std=[1.0] * 3)
    kw: dict[str, object] = {"views": 2} if not groups else {"view_groups": [
        (2, base), (1, ViewGroup(count=1, resolution=8, scale=[0.2, 0.5]).augment(base))]}

    def read(device_crops: bool) -> list[torch.Tensor]:
        loader = ViewLoader(path, batch_size=6, augment=base, num_workers=1, seed=3,
                            batched_augment=True, device_crops=device_crops, **kw)
        assert bool(loader._device_crops) == device_crops
        return [_pixels(x) for b in loader
                for x in (b.images.blocks if groups else (b.images,))]  # type: ignore[union-attr]

    got, want = read(True), read(False)
    assert [x.shape for x in got] == [x.shape for x in want]
    assert all((g - w).abs().max() <= 1 for g, w in zip(got, want, strict=True))
    # not vacuous: each view its own crop, so another view's pixels are far off
    assert (got[0][:, 0] - want[0][:, 1]).abs().max() > 50
    with pytest.raises(ValueError, match="device_crops=True needs the batched colour ops"):
        ViewLoader(path, batch_size=6, augment=base, num_workers=1, device_crops=True)


def test_device_crops_stay_in_ffcv_when_a_batch_of_slots_is_too_large(
        beton: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot is the file's widest image: a batch of them past ``DEVICE_CROP_BATCH_BYTES``
    (images stored at a large ``max_side``) keeps the crops in FFCV, not gigabytes of slots."""
    from components.data import reader
    from components.data.augment.device_crop import slot_bytes

    path, _, _ = beton
    aug = AugmentConfig(resolution=8, jitter_p=0.0, grayscale_p=0.0)

    def opened(batch: int) -> ViewLoader:
        return ViewLoader(path, batch_size=batch, augment=aug, views=2, num_workers=1,
                          batched_augment=True, device_crops=True)

    monkeypatch.setattr(reader, "DEVICE_CROP_BATCH_BYTES", 6 * slot_bytes(12, 12, 2))
    assert opened(6)._device_crops and not opened(7)._device_crops
    assert next(iter(opened(7))).images.shape == (7, 2, 3, 8, 8)


# ------------------------------------------------------------------ view groups (multi-crop)


def _pixels(images: torch.Tensor) -> torch.Tensor:
    """Normalised views with mean 0, std 1 back to uint8 pixel values (exact)."""
    return (images * 255).round()


@pytest.mark.parametrize("batched", [False, True], ids=["ffcv-ops", "batched-ops"])
def test_view_groups_have_their_own_size_and_ops(beton: tuple, batched: bool) -> None:
    """2 × 16 px (grayscale always, never solarized) + 3 × 8 px (solarized always, never
    grayscale): a MultiCrop of one block per size, each view with its group's ops, on the
    CPU path (grayscale in FFCV, solarization batched after it) and the GPU path's batched
    ops run on the CPU."""
    from components.config import ViewGroup
    from components.data.multicrop import MultiCrop

    path, _, _ = beton
    base = AugmentConfig(resolution=16, jitter_p=0.0, grayscale_p=0.0, mean=[0.0] * 3,
                         std=[1.0] * 3)
    groups = [(2, ViewGroup(count=2, grayscale_p=1.0).augment(base)),
              (3, ViewGroup(count=3, resolution=8, scale=[0.2, 0.5],
                            solarize_p=1.0).augment(base))]
    loader = ViewLoader(path, batch_size=5, view_groups=groups, augment=base, num_workers=1,
                        batched_augment=batched)
    assert loader.views == 5
    for b in loader:
        assert isinstance(b.images, MultiCrop) and b.images.shape == (5, 5)
        big, small = b.images.blocks
        assert big.shape == (5, 2, 3, 16, 16) and small.shape == (5, 3, 3, 8, 8)
        assert b.images.sizes == [(16, 16)] * 2 + [(8, 8)] * 3
        big, small = _pixels(big), _pixels(small)
        # group 1: grayscale (equal channels), not solarized (bright pixels remain)
        assert torch.equal(big[:, :, 0], big[:, :, 1]) and torch.equal(big[:, :, 1],
                                                                       big[:, :, 2])
        assert big.amax(dim=(2, 3, 4)).min() >= 128
        # group 2: solarized (every value >= 128 inverted: none left), colour kept
        assert small.max() <= 127
        assert not torch.equal(small[:, :, 0], small[:, :, 1])


def test_one_view_group_gives_the_views_of_views_and_augment(beton: tuple) -> None:
    """``data.view_groups`` of one group (or groups of one size) is the plain loader: the
    same ``[B, V, 3, H, W]`` tensor, bit for bit, from the same seed."""
    from components.config import DataConfig, ViewGroup

    path, _, _ = beton
    aug = AugmentConfig(resolution=8, jitter_p=0.8, grayscale_p=0.3, blur_p=0.5)

    def read(**kw: object) -> torch.Tensor:
        loader = ViewLoader(path, batch_size=6, augment=aug, num_workers=1, seed=3, **kw)
        out = [b.images for b in loader]
        assert all(isinstance(x, torch.Tensor) for x in out)
        return torch.cat(out)  # type: ignore[arg-type]

    torch.manual_seed(0)
    np.random.seed(0)
    want = read(views=3)
    data = DataConfig(dataset="x", augment=aug, view_groups=[ViewGroup(count=3)])
    assert data.views == 3 and data.groups() == [(3, aug)]
    torch.manual_seed(0)
    np.random.seed(0)
    assert torch.equal(read(view_groups=data.groups()), want)
    # two groups of one size: still one tensor
    torch.manual_seed(0)
    np.random.seed(0)
    two = read(view_groups=[(1, aug), (2, AugmentConfig(resolution=8, solarize_p=1.0))])
    assert two.shape == want.shape
