"""The pipeline's data path and step against bench/parity.py's plain loop, exactly: the same
stored images through the FFCV reader and through torchvision give the same pixels, and the
same batch and initial weights through ``train_step`` and the plain step give the same loss
and gradients, for several steps (memory banks and EMA included). Also ``simgraph preview``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from bench.parity import plain_step, plain_transform, ratio_interval, read_split
from components.config import LOSS_CONFIGS, AugmentConfig, ModelConfig, TrainConfig, from_dict
from components.data.reader import DatasetInfo, ViewLoader, set_jit
from components.objectives.memory import cosine_momentum
from components.training.optim import build_optimizer, build_scheduler
from components.training.step import build_model, train_step
from tests.support.datasets import synthetic_dataset, tiny_run_config

SIZE = 16
# Deterministic views: the whole image, no flip or colour change; only the data path differs.
IDENTITY = AugmentConfig(resolution=SIZE, scale=[1.0, 1.0], ratio=[1.0, 1.0], flip_p=0.0,
                         jitter_p=0.0, grayscale_p=0.0, mean=[0.4, 0.5, 0.6],
                         std=[0.2, 0.25, 0.3])
LOSSES: dict[str, dict[str, Any]] = {
    "simclr": {"tau": 0.2},
    "supcon": {"tau": 0.1, "bank_size": 40},
    "xclr_caption": {"name": "xclr", "graph": "caption", "tau_s": 0.1},
    "sincere": {},
    "cone": {"bank_size": 64, "top_n": 8, "neighbours_from": "query"},
    "clip": {"caption_dim": 8},
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("parity") / "ds", classes=4,
                             train_per_class=8, size=SIZE, caption_dim=8)


@pytest.fixture(scope="module")
def batches(dataset: Path) -> list[tuple[Any, torch.Tensor]]:
    """Two reader batches and the plain path's images for the same samples."""
    set_jit(False)
    info = DatasetInfo.load(dataset)
    loader = ViewLoader(info.split_file("train"), batch_size=16, views=2, augment=IDENTITY,
                        train=True, seed=0, num_workers=1, with_captions=True)
    split = read_split(info.split_file("train"))
    row = {int(s): i for i, s in enumerate(split.sample_ids)}
    t = plain_transform(IDENTITY, train=True)
    out = []
    for batch in loader:
        imgs = [torch.from_numpy(split.images[row[int(s)]].copy()).permute(2, 0, 1)
                for s in batch.sample_ids]
        plain = torch.stack([torch.stack([t(im), t(im)]) for im in imgs])
        out.append((batch, plain))
    return out


def test_reader_and_torchvision_give_the_same_pixels(batches: list, dataset: Path) -> None:
    split = read_split(DatasetInfo.load(dataset).split_file("train"))
    for batch, plain in batches:
        assert batch.images.shape == plain.shape == (16, 2, 3, SIZE, SIZE)
        torch.testing.assert_close(batch.images, plain, rtol=0, atol=1e-5)
        by_id = dict(zip(split.sample_ids.tolist(), split.labels.tolist(), strict=True))
        assert batch.labels.tolist() == [by_id[int(s)] for s in batch.sample_ids]
        caps = {int(s): split.captions[i] for i, s in enumerate(split.sample_ids)}
        assert batch.captions is not None and split.captions is not None
        torch.testing.assert_close(batch.captions,
                                   torch.stack([caps[int(s)] for s in batch.sample_ids]))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_pipeline_step_equals_plain_step(name: str, batches: list) -> None:
    spec = dict(LOSSES[name])
    loss_cfg = from_dict(LOSS_CONFIGS[spec.pop("name", name)], spec)
    model_cfg = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16,
                            projector_dim=8)
    torch.manual_seed(0)
    model, ema = build_model(model_cfg, loss_cfg, 4, torch.eye(4), 8)
    plain, plain_ema = copy.deepcopy(model), copy.deepcopy(ema)
    total = 4
    opts = []
    for m in (model, plain):
        opt = build_optimizer(m, "sgd", 0.1, 0.9, 1e-4)
        opts.append((opt, build_scheduler(opt, total, 1)))
    momentum = getattr(loss_cfg, "ema_momentum", 0.996)
    for step in range(total):  # two passes over the two batches: the bank fills
        batch = batches[step % 2][0]  # the same images (their pixels: the test above)
        metrics = train_step(model, ema, *opts[0], None, batch, train_cfg=TrainConfig(),
                             device=torch.device("cpu"), step=step, total_steps=total,
                             ema_momentum=momentum, where="test")
        opt, sched = opts[1]
        opt.zero_grad(set_to_none=True)
        loss, plain_metrics = plain_step(plain, plain_ema, batch.images, batch.labels,
                                         batch.sample_ids, batch.captions)
        loss.backward()
        assert plain_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-5, abs=1e-6)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        plain_grads = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
        assert grads.keys() == plain_grads.keys() and grads
        for n in grads:
            torch.testing.assert_close(plain_grads[n], grads[n], rtol=1e-4, atol=1e-6,
                                       msg=lambda m, n=n, s=step: f"step {s}, {n}: {m}")
        opt.step()
        sched.step()
        if plain_ema is not None:
            plain_ema.update(plain.encoder, cosine_momentum(step, total, base=momentum))
    for (n, a), b in zip(model.state_dict().items(), plain.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")


def test_preview_writes_a_grid_of_the_workers_views(dataset: Path, tmp_path: Path) -> None:
    from pipelines import preview
    from pipelines.cli import main

    cfg = tiny_run_config(dataset, tmp_path / "runs")
    cfg["data"]["augment"] = {"resolution": SIZE, "mean": [0.4, 0.5, 0.6],
                              "std": [0.2, 0.25, 0.3]}
    cfg["data"]["views"] = 3
    path = tmp_path / "pretrain.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "grid.png"
    assert main(["preview", str(path), "--out", str(out), "--images", "5", "--tile", "32"]) == 0
    img = np.asarray(Image.open(out))
    step = 32 + preview.GAP
    assert img.shape == (preview.HEADER + 5 * step, 4 * step, 3)
    # The view columns are the reader's views, un-normalised: tile (row 0, view 1) equals the
    # first view of the loader's first batch (seeded as the worker seeds epoch 0).
    from components.config import PretrainConfig
    from components.data.reader import train_views
    from components.training.step import seed_everything

    pc = from_dict(PretrainConfig, cfg)
    set_jit(False)
    loader = train_views(pc, DatasetInfo.load(dataset), 0, 2, torch.device("cpu"), False)
    seed_everything(pc.train.seed, 0, 0)
    loader.set_epoch(0)
    first = next(iter(loader))
    views = preview.views_to_uint8(first.images[:1], pc.data.augment.mean, pc.data.augment.std)
    tile = img[preview.HEADER:preview.HEADER + 32, step:step + 32]
    want = np.asarray(Image.fromarray(views[0, 0]).resize((32, 32), Image.Resampling.NEAREST))
    np.testing.assert_array_equal(tile, want)
    # Bad input: a rank outside the worker group.
    assert main(["preview", str(path), "--out", str(out), "--rank", "2"]) == 1


def _view_stats(views: torch.Tensor, side: int) -> np.ndarray:
    """Per view ``[N, 3, r, r]`` of the coordinate image (R = 4x, G = 4y, B = 128): crop area
    fraction, aspect ratio, brightness factor, flipped — recovered from the pixels."""
    rows = []
    for v in views.double():
        factor = float(v[2].mean()) / 128
        r, g = v[0] / factor, v[1] / factor
        w = float(r.max() - r.min()) / 4 + 1
        h = float(g.max() - g.min()) / 4 + 1
        rows.append((w * h / side**2, w / h, factor, float(r[:, 0].mean() > r[:, -1].mean())))
    return np.array(rows)


def test_reader_views_follow_torchvisions_distributions(tmp_path: Path) -> None:
    """Random resized crop (scale, ratio), flip and brightness: the reader's views and
    torchvision's agree in distribution (means and spreads over 512 views of an image whose
    pixels encode their coordinates), so the pipeline trains on the augmentations it claims."""
    from components.data.shards import page_size_for, write_shard

    side, n = 64, 256
    y, x = np.mgrid[0:side, 0:side]
    img = np.stack([x * 4, y * 4, np.full_like(x, 128)], -1).astype(np.uint8)
    write_shard(tmp_path / "train.beton", [img] * n, np.zeros(n, int), np.arange(n), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(side, 0))
    aug = AugmentConfig(resolution=32, scale=[0.3, 1.0], ratio=[0.6, 1.6], flip_p=0.5,
                        jitter_p=0.8, brightness=0.4, contrast=0.0, saturation=0.0, hue=0.0,
                        grayscale_p=0.0, mean=[0.0, 0.0, 0.0], std=[1 / 255] * 3)
    set_jit(False)
    loader = ViewLoader(tmp_path / "train.beton", batch_size=128, views=2, augment=aug,
                        train=True, seed=0, num_workers=1, with_captions=False)
    reader = _view_stats(torch.cat([b.images.flatten(0, 1) for b in loader]), side)
    torch.manual_seed(0)
    t = plain_transform(aug, train=True)
    src = torch.from_numpy(img).permute(2, 0, 1)
    plain = _view_stats(torch.stack([t(src) for _ in range(len(reader))]), side)
    assert len(reader) == 512
    for col, name, tol in ((0, "area", 0.03), (1, "aspect", 0.06), (2, "brightness", 0.04),
                           (3, "flip", 0.08)):
        assert abs(reader[:, col].mean() - plain[:, col].mean()) < tol, name
        assert abs(reader[:, col].std() - plain[:, col].std()) < tol, name
    # Not trivially equal: the crops do vary, and a fifth of the views keep their brightness.
    assert reader[:, 0].std() > 0.1 and 0.1 < (abs(reader[:, 2] - 1) < 0.004).mean() < 0.35


def test_gain_ratio_interval_is_a_paired_bootstrap() -> None:
    """The parity table's interval: exact when every seed agrees, covering 1 when the
    pipeline's gains scatter around the plain loop's, and paired by seed."""
    assert ratio_interval([1, 1, 1], [2, 2, 2], [2, 2, 2]) == (1.0, 1.0)
    assert ratio_interval([0, 0, 0], [2, 2, 2], [1, 1, 1]) == (0.5, 0.5)
    lo, hi = ratio_interval([70, 72, 74, 76], [73, 75, 77, 79], [72, 76, 76, 80])
    assert lo < 1.0 < hi
    # Paired: the same offset on every seed's three runs leaves the ratio exact.
    assert ratio_interval([70, 80, 90], [72, 82, 92], [71, 81, 91]) == (0.5, 0.5)
