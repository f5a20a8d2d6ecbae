"""``simgraph preview CONFIG [key=value ...] [--out PNG] [--images N] [--epoch E] [--rank R]``.

Look at the augmentations before spending compute: draw a batch of training views exactly as
a pretraining worker would receive them, and write a PNG grid.

1. Load and validate the pretrain config (with overrides), and the dataset dir it names.
2. Build rank ``R``'s training loader with :func:`components.data.reader.train_views` (the function
   the workers call), seed it as the worker seeds epoch ``E`` (``seed_everything``), and take
   its first batch — the same views the run will train on when ``data.jit`` is false.
3. Write one row per image: the image as stored in the dataset dir, then each of the
   ``data.views`` views un-normalised with ``data.augment.mean/std``; each tile is
   ``--tile`` px (nearest-neighbour upscaling, so individual pixels stay visible). With
   ``data.view_groups`` the columns are the groups' views in order, each titled with its
   group and size, and drawn to scale: the largest crop fills a tile, a smaller one the same
   share of it as of the largest side (SwAV's 96 px crops at 96/224 of a 224 px one's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.config import PretrainConfig, load_config
from components.errors import SimgraphError, run_command

HEADER = 14  # px of the title strip above the grid
GAP = 2  # px between tiles


class PreviewError(SimgraphError, RuntimeError):
    """The preview cannot be drawn (missing dataset, too few images); the message says why."""


def _fit(img: np.ndarray, tile: int, side: int | None = None) -> np.ndarray:
    """``[H, W, 3]`` uint8 scaled (nearest) to fit in ``tile × tile``, centred on grey;
    ``side``: the side that fills the tile (a smaller image is drawn to that scale)."""
    from PIL import Image

    h, w = img.shape[:2]
    s = tile / max(h, w, side or 0)
    nh, nw = max(1, round(h * s)), max(1, round(w * s))
    small = np.asarray(Image.fromarray(img).resize((nw, nh), Image.Resampling.NEAREST))
    out = np.full((tile, tile, 3), 128, np.uint8)
    y, x = (tile - nh) // 2, (tile - nw) // 2
    out[y:y + nh, x:x + nw] = small
    return out


def views_to_uint8(images: Any, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Normalised views ``[B, V, 3, r, r]`` float → ``[B, V, r, r, 3]`` uint8."""
    import torch

    m = torch.tensor(mean).view(1, 1, 3, 1, 1)
    s = torch.tensor(std).view(1, 1, 3, 1, 1)
    x = (images.float().cpu() * s + m).clamp(0, 1) * 255
    return x.round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()


def view_columns(images: Any, mean: Sequence[float], std: Sequence[float]
                 ) -> list[np.ndarray]:
    """Each view of a batch's ``images`` (a ``[B, V, 3, r, r]`` tensor or a
    :class:`~components.data.multicrop.MultiCrop`) as ``[B, r_v, r_v, 3]`` uint8, in view
    order."""
    from components.data.multicrop import MultiCrop

    blocks = images.blocks if isinstance(images, MultiCrop) else (images,)
    out: list[np.ndarray] = []
    for block in blocks:
        u8 = views_to_uint8(block, mean, std)  # [B, V_i, r, r, 3]
        out += [u8[:, j] for j in range(u8.shape[1])]
    return out


def grid(stored: Sequence[np.ndarray], views: np.ndarray | Sequence[np.ndarray], tile: int,
         titles: Sequence[str] | None = None) -> np.ndarray:
    """``[HEADER + n·(tile+GAP), (V+1)·(tile+GAP), 3]`` uint8: a column of stored images, then
    one column per view. ``views``: ``[n, V, r, r, 3]``, or one ``[n, r_v, r_v, 3]`` per view
    (sizes may differ: drawn to scale, the largest filling a tile); ``titles``: one per view
    (default ``view 1`` …)."""
    from PIL import Image, ImageDraw

    cols = ([views[:, j] for j in range(views.shape[1])] if isinstance(views, np.ndarray)
            else list(views))
    n, v = cols[0].shape[0], len(cols)
    side = max(max(c.shape[1:3]) for c in cols)
    step = tile + GAP
    canvas = np.full((HEADER + n * step, (v + 1) * step, 3), 255, np.uint8)
    for i in range(n):
        y = HEADER + i * step
        canvas[y:y + tile, 0:tile] = _fit(stored[i], tile)
        for j in range(v):
            x = (j + 1) * step
            canvas[y:y + tile, x:x + tile] = _fit(cols[j][i], tile, side)
    img = Image.fromarray(canvas)
    draw = ImageDraw.Draw(img)
    names = list(titles) if titles is not None else [f"view {k + 1}" for k in range(v)]
    for j, title in enumerate(["stored"] + names):
        draw.text((j * step + 2, 1), title, fill=(0, 0, 0))
    return np.asarray(img)


def view_titles(cfg: PretrainConfig) -> list[str]:
    """Column titles: ``view k`` for one group, ``g<group> <side>px`` with view groups."""
    if not cfg.data.view_groups:
        return [f"view {k + 1}" for k in range(cfg.data.views)]
    return [f"g{g + 1} {a.resolution}px" for g, (n, a) in enumerate(cfg.data.groups())
            for _ in range(n)]


def describe_groups(cfg: PretrainConfig) -> str:
    """The training views in words: ``3 views at 32 px (crop scale …)``, or with view groups
    ``8 views: group 1: 2 at 224 px (…); group 2: 6 at 96 px (…)``."""
    def ops(a: Any) -> str:
        return (f"at {a.resolution} px (crop scale {a.scale}, ratio "
                f"{[round(r, 3) for r in a.ratio]}, flip {a.flip_p}, jitter p={a.jitter_p} "
                f"b/c/s/h={a.brightness}/{a.contrast}/{a.saturation}/{a.hue}, grayscale "
                f"{a.grayscale_p}, blur {a.blur_p}, solarize {a.solarize_p})")

    if not cfg.data.view_groups:
        return f"{cfg.data.views} views {ops(cfg.data.augment)}"
    return f"{cfg.data.views} views: " + "; ".join(
        f"group {g + 1}: {n} {ops(a)}" for g, (n, a) in enumerate(cfg.data.groups()))


def preview(cfg: PretrainConfig, out: str | Path, images: int = 16, epoch: int = 0,
            rank: int = 0, tile: int = 96) -> Path:
    """Write the grid PNG to ``out``; returns its path.

    Raises:
        PreviewError: the dataset dir cannot be read, or ``rank`` / ``epoch`` / ``images`` are
            out of range.
    """
    import torch
    from PIL import Image

    from components.data.reader import DatasetError, DatasetInfo, set_jit, train_views
    from components.data.shards import read_samples, rows_of
    from components.data.staging import local_dataset
    from components.io.storage import StorageError
    from components.runs.run_dir import absolute_paths
    from components.training.step import seed_everything

    if images < 1 or tile < 8 or epoch < 0:
        raise PreviewError(f"--images={images} must be >= 1, --tile={tile} >= 8 and "
                           f"--epoch={epoch} >= 0")
    world = cfg.scaling.num_workers
    if not 0 <= rank < world:
        raise PreviewError(f"--rank={rank} must lie in [0, scaling.num_workers={world})")
    cfg = absolute_paths(cfg)
    try:
        info = DatasetInfo.load(local_dataset(cfg.data.dataset, cfg.data.stage,
                                              cfg.data.stage_dir))
        info.split_file("train")
    except (DatasetError, StorageError) as e:
        raise PreviewError(str(e)) from None
    set_jit(cfg.data.jit)
    threads = torch.get_num_threads()
    loader = train_views(cfg, info, rank, world, torch.device("cpu"), with_captions=False)
    seed_everything(cfg.train.seed, epoch, rank)  # as the worker does before each epoch
    loader.set_epoch(epoch)
    batches = iter(loader)  # a generator: close() stops FFCV's thread
    batch = next(batches)
    batches.close()  # the rest of the epoch is not needed
    torch.set_num_threads(threads)
    n = min(images, len(batch.sample_ids))
    ids = batch.sample_ids[:n].tolist()
    path = info.split_file("train")
    stored = [r["image"] for r in read_samples(path, rows_of(path, ids))]
    a = cfg.data.augment
    picture = grid(stored, [c[:n] for c in view_columns(batch.images, a.mean, a.std)], tile,
                   view_titles(cfg))
    dest = Path(out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(picture).save(dest)
    return dest


def main(config: str, overrides: Sequence[str], out: str | None, images: int, epoch: int,
         rank: int, tile: int) -> int:
    def body() -> None:
        cfg = load_config(config, PretrainConfig, overrides)
        path = preview(cfg, out or f"preview-{cfg.name}.png", images, epoch, rank, tile)
        print(f"{path}: {images} training images of rank {rank}, epoch {epoch + 1}: stored, "
              f"then {describe_groups(cfg)}")

    return run_command("preview", body)



__all__ = ["PreviewError", "describe_groups", "grid", "main", "preview", "view_columns",
           "view_titles", "views_to_uint8"]
