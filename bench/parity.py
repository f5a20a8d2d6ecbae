"""Parity: does ``simgraph pretrain`` learn what a plain PyTorch loop learns?

For each dataset, loss and seed, three encoders are scored with one evaluation (weighted
kNN@20, Wu et al. 2018 votes exp(cos / 0.07), and a linear probe, on backbone features of one
centre view of every train (bank) and test (query) image):

* **random**: the encoder at its initial weights (``torch.manual_seed(seed)`` → build_encoder);
* **plain**: a plain loop — no Ray, no FFCV loader: images read from the dataset dir's
  ``.beton`` files (``shards.read_samples``), torchvision ``transforms.v2`` views, a
  ``DataLoader``, and a hand-written step over the same model class, objective, optimiser and
  LR schedule, from the same initial weights;
* **pipeline**: ``simgraph pretrain`` (Ray Train, FFCV reader) with the same config.

It prints one Markdown table (mean ± std over seeds, and the pipeline's gain over random init
as a fraction of the plain loop's) and writes it to ``--out``. Each measurement is appended to
``<work>/parity.jsonl``; re-running the same command after an interruption reuses them.
The goal (issue 13): gain ratio ≥ 0.95 and the pipeline's kNN@20 within one std of the plain
loop's.

    python bench/parity.py                       # Fashion-MNIST subset + Tux Paint, 3 losses
    python bench/parity.py --datasets fmnist --losses simclr --seeds 0 1 2 --epochs 15
    python bench/parity.py model.width=64          # any pretrain override applies to both loops
    python bench/parity.py --losses simclr 'data.view_groups=[{count: 2, scale: [0.14, 1.0]},
        {count: 4, resolution: 16, scale: [0.05, 0.14]}]'   # multi-crop: both loops

``make bench-parity`` installs what it needs first (Tux Paint stamps: apt
``tuxpaint-stamps-default``).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import (  # noqa: E402
    AugmentConfig,
    PreprocessConfig,
    PretrainConfig,
    load_config,
)
from components.objectives import ContrastiveBatch, Metrics  # noqa: E402
from components.objectives.memory import EMA, cosine_momentum  # noqa: E402
from components.training.step import PretrainModel, build_model  # noqa: E402

CONFIG = ROOT / "pipelines/configs/pretrain/small_data.yaml"
# name -> (preprocess config, its overrides, pretrain overrides)
DATASETS: dict[str, tuple[str, list[str], list[str]]] = {
    "fmnist": ("pipelines/configs/data/demo.yaml", ["source.max_per_class={per_class}"], [
        "data.augment.resolution=28",
        "data.augment.mean=[0.286,0.286,0.286]", "data.augment.std=[0.353,0.353,0.353]"]),
    # ~800 stamps in 16 categories, one caption each; a larger test split for steadier numbers.
    "tuxpaint": ("pipelines/configs/data/tuxpaint.yaml", ["split.val=0.05", "split.test=0.25"], [
        "data.augment.resolution=32",
        "data.augment.mean=[0.5,0.5,0.5]", "data.augment.std=[0.25,0.25,0.25]"]),
}
LOSSES: dict[str, list[str]] = {
    "simclr": ["loss.name=simclr", "loss.tau=0.1"],
    "supcon": ["loss.name=supcon", "loss.tau=0.1"],
    "xclr": ["loss.name=xclr", "loss.tau=0.1", "loss.tau_s=0.1"],  # graph: per dataset
    "sincere": ["loss.name=sincere", "loss.tau=0.1"],
    "cone": ["loss.name=cone", "loss.bank_size=1024", "loss.top_n=16"],
    "ce": ["loss.name=ce"],
}
XCLR_GRAPH = {"fmnist": "loss.graph=class", "tuxpaint": "loss.graph=caption"}


# ---------------------------------------------------------------------------------------------
# The plain loop: torchvision views, a DataLoader, a hand-written step.


@dataclass
class Split:
    images: list[np.ndarray]  # [H, W, 3] uint8 as stored
    labels: Tensor  # [N] int64
    sample_ids: Tensor  # [N] int64
    captions: Tensor | None  # [N, E] float32


def read_split(path: str | Path) -> Split:
    """A split's stored images, labels, ids and caption embeddings, without an FFCV Loader."""
    from components.data.shards import read_samples

    rows = read_samples(path)
    caps = [r["caption"] for r in rows] if rows and "caption" in rows[0] else None
    return Split(
        images=[np.array(r["image"]) for r in rows],  # writable copies
        labels=torch.tensor([r["label"] for r in rows], dtype=torch.long),
        sample_ids=torch.tensor([r["sample_id"] for r in rows], dtype=torch.long),
        captions=None if caps is None else torch.from_numpy(np.stack(caps).astype(np.float32)),
    )


class _CentreSquare(nn.Module):
    """The largest centred square (what FFCV's CenterCropRGBImageDecoder takes at ratio 1)."""

    def forward(self, img: Tensor) -> Tensor:
        from torchvision.transforms.v2 import functional as TF

        side = min(img.shape[-2:])
        return TF.center_crop(img, [side, side])


class _AreaResizedCrop(nn.Module):
    """torchvision's random crop parameters, resized with OpenCV ``INTER_AREA`` as FFCV's
    ``RandomResizedCropRGBImageDecoder`` does (nearest-like when it enlarges a crop)."""

    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float]):
        super().__init__()
        self.size, self.scale, self.ratio = size, scale, ratio

    def forward(self, img: Tensor) -> Tensor:
        import cv2
        from torchvision.transforms import RandomResizedCrop

        i, j, h, w = RandomResizedCrop.get_params(img, list(self.scale), list(self.ratio))
        crop = img[:, i:i + h, j:j + w].permute(1, 2, 0).contiguous().numpy()  # [h, w, 3]
        out = cv2.resize(crop, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(out).permute(2, 0, 1)


def plain_transform(a: AugmentConfig, train: bool, resize: str = "bilinear") -> nn.Module:
    """torchvision ``transforms.v2`` equivalent of the reader's views: ``[3, H, W]`` uint8 in,
    normalised float32 ``[3, r, r]`` out. Train: random resized crop (scale, ratio; resized
    bilinear with antialias, or ``resize="area"``: OpenCV INTER_AREA as FFCV), flip, colour
    jitter with probability ``jitter_p``, grayscale, blur, solarization; eval: centre square,
    resize.
    """
    from torchvision.transforms import v2

    size = [a.resolution, a.resolution]
    ops: list[nn.Module]
    if train:
        ops = [v2.RandomResizedCrop(size, scale=tuple(a.scale), ratio=tuple(a.ratio),
                                    antialias=True) if resize == "bilinear" else
               _AreaResizedCrop(a.resolution, tuple(a.scale), tuple(a.ratio))]
        if a.flip_p > 0:
            ops.append(v2.RandomHorizontalFlip(a.flip_p))
        if a.jitter_p > 0:
            ops.append(v2.RandomApply([v2.ColorJitter(a.brightness, a.contrast, a.saturation,
                                                      a.hue)], p=a.jitter_p))
        if a.grayscale_p > 0:
            ops.append(v2.RandomGrayscale(a.grayscale_p))
        if a.blur_p > 0:
            from components.data.augment import blur_kernel_size

            ops.append(v2.RandomApply([v2.GaussianBlur(blur_kernel_size(a.resolution),
                                                       tuple(a.blur_sigma))], p=a.blur_p))
        if a.solarize_p > 0:  # BYOL's, after the blur, on uint8
            ops.append(v2.RandomSolarize(128, p=a.solarize_p))
    else:
        ops = [_CentreSquare(), v2.Resize(size, antialias=True)]
    return v2.Compose([*ops, v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(list(a.mean), list(a.std))])


class Views(torch.utils.data.Dataset):
    """``views`` independent transforms of each stored image: ``[V, 3, r, r]``; or, with
    ``groups`` (``data.view_groups``: ``(count, transform)`` each, in view order), a list of
    ``[V_i, 3, r_i, r_i]``, one per run of consecutive views of one size."""

    def __init__(self, split: Split, transform: nn.Module | None, views: int,
                 groups: Sequence[tuple[int, int, nn.Module]] | None = None) -> None:
        self.split = split
        # (count, side, transform) per group
        self.groups = list(groups) if groups is not None else [(views, -1, transform)]

    def __len__(self) -> int:
        return len(self.split.images)

    def __getitem__(self, i: int) -> tuple[Tensor | list[Tensor], Tensor, Tensor, Tensor]:
        img = torch.from_numpy(self.split.images[i]).permute(2, 0, 1)  # [3, H, W] uint8
        blocks: list[list[Tensor]] = []
        last = None
        for n, side, t in self.groups:
            views = [t(img) for _ in range(n)]
            if blocks and side == last:
                blocks[-1] += views
            else:
                blocks.append(views)
            last = side
        x: Tensor | list[Tensor] = [torch.stack(b) for b in blocks]
        if len(blocks) == 1:
            x = x[0]
        cap = self.split.captions[i] if self.split.captions is not None else torch.zeros(0)
        return x, self.split.labels[i], self.split.sample_ids[i], cap


def _encode_by_size(enc: nn.Module, blocks: Sequence[Tensor]
                    ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Multi-crop written out: the views of each size (blocks ``[B, V_i, 3, r, r]``) through
    the encoder together, then every view's (backbone features, z, logits) back in view
    order, ``[B, V, ...]``."""
    b = blocks[0].shape[0]
    outs: list[tuple[Tensor, Tensor, Tensor | None] | None] = [None] * len(blocks)
    for side in dict.fromkeys(x.shape[-1] for x in blocks):
        idx = [i for i, x in enumerate(blocks) if x.shape[-1] == side]
        x = torch.cat([blocks[i] for i in idx], dim=1)
        v = x.shape[1]
        h = enc.backbone(x.reshape(b * v, *x.shape[2:]))
        z = enc.projector(h).reshape(b, v, -1)
        logits = None if enc.classifier is None else enc.classifier(h).reshape(b, v, -1)
        h = h.reshape(b, v, -1)
        start = 0
        for i in idx:
            n = blocks[i].shape[1]
            outs[i] = (h[:, start:start + n], z[:, start:start + n],
                       None if logits is None else logits[:, start:start + n])
            start += n
    done = [o for o in outs if o is not None]
    logits_all = (torch.cat([o[2] for o in done if o[2] is not None], dim=1)
                  if done[0][2] is not None else None)
    return (torch.cat([o[0] for o in done], dim=1), torch.cat([o[1] for o in done], dim=1),
            logits_all)


def plain_step(model: PretrainModel, ema: EMA | None, images: Tensor, labels: Tensor,
               sample_ids: Tensor, captions: Tensor | None) -> tuple[Tensor, Metrics]:
    """The loss of one batch, written out: every view through backbone and projector (one
    ``[B·V]`` forward, so BatchNorm sees all views), then the objective. ``images``
    ``[B, V, 3, H, W]``, or a list of per-size blocks ``[B, V_i, 3, r_i, r_i]`` (multi-crop:
    one forward per size)."""
    enc = model.encoder
    if isinstance(images, list | tuple):
        return _plain_multicrop_step(model, ema, list(images), labels, sample_ids, captions)
    b, v = images.shape[:2]
    x = images.reshape(b * v, *images.shape[2:])  # row b·V + v
    h = enc.backbone(x)
    z = enc.projector(h).reshape(b, v, -1)
    needs = model.objective.requires
    logits = ez = el = None
    if "logits" in needs:
        assert enc.classifier is not None
        logits = enc.classifier(h).reshape(b, v, -1)
    if ema is not None:
        _, ez, el = ema(x)
        ez, el = ez.reshape(b, v, -1), None if el is None else el.reshape(b, v, -1)
    return _objective(model, z, logits, ez, el, labels, sample_ids, captions)


def _plain_multicrop_step(model: PretrainModel, ema: EMA | None, blocks: list[Tensor],
                          labels: Tensor, sample_ids: Tensor, captions: Tensor | None
                          ) -> tuple[Tensor, Metrics]:
    _, z, logits = _encode_by_size(model.encoder, blocks)
    ez = el = None
    if ema is not None:
        with torch.no_grad():
            _, ez, el = _encode_by_size(ema.module, blocks)
    return _objective(model, z, logits, ez, el, labels, sample_ids, captions)


def _objective(model: PretrainModel, z: Tensor, logits: Tensor | None, ema_z: Tensor | None,
               ema_logits: Tensor | None, labels: Tensor, sample_ids: Tensor,
               captions: Tensor | None) -> tuple[Tensor, Metrics]:
    """The objective on ``z [B, V, D]`` and the fields it requires, written out."""
    needs = model.objective.requires
    fields: dict[str, Tensor | None] = {}
    if "labels" in needs:
        fields["labels"] = labels
    if "captions" in needs:
        fields["captions"] = captions
    if "logits" in needs:
        fields["logits"] = logits
    if ema_z is not None:
        fields["ema_z"] = ema_z
        if "ema_logits" in needs:
            fields["ema_logits"] = ema_logits
    return model.objective(ContrastiveBatch(z=z, sample_ids=sample_ids, **fields))


def train_plain(cfg: PretrainConfig, dataset: str | Path, num_classes: int,
                sim: Tensor | None, caption_dim: int, resize: str = "bilinear") -> PretrainModel:
    """The plain loop on ``cfg`` (single process, global batch = ``batch_size × workers``);
    ``resize``: how its crops are resized (:func:`plain_transform`)."""
    from components.data.reader import DatasetInfo
    from components.training.optim import build_for_run

    info = DatasetInfo.load(dataset)
    torch.manual_seed(cfg.train.seed)  # the pipeline's initial weights
    model, ema = build_model(cfg.model, cfg.loss, num_classes, sim, caption_dim,
                             cfg.data.augment.resolution)
    batch = cfg.data.batch_size * cfg.scaling.num_workers
    groups = [(n, a.resolution, plain_transform(a, True, resize)) for n, a in cfg.data.groups()]
    data = Views(read_split(info.split_file("train")), None, cfg.data.views, groups)
    gen = torch.Generator().manual_seed(cfg.train.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True,
                                         generator=gen)
    steps = len(loader)
    if cfg.train.steps_per_epoch is not None:
        steps = min(steps, cfg.train.steps_per_epoch)
    total = steps * cfg.train.epochs
    opt, sched = build_for_run(model, cfg.optim, batch, steps, cfg.train.epochs)
    model.train()
    step = 0
    for _ in range(cfg.train.epochs):
        for i, (x, y, ids, caps) in enumerate(loader):
            if i == steps:
                break
            opt.zero_grad(set_to_none=True)
            loss, _ = plain_step(model, ema, x, y, ids, caps if caps.numel() else None)
            loss.backward()
            if cfg.train.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
            opt.step()
            sched.step()
            if ema is not None:
                ema.update(model.encoder, cosine_momentum(step, total, base=getattr(
                    cfg.loss, "ema_momentum", 0.996)))
            step += 1
    return model


# ---------------------------------------------------------------------------------------------
# One evaluation for every encoder.


@torch.no_grad()
def features(encoder: nn.Module, split: Split, a: AugmentConfig, batch: int = 256) -> Tensor:
    """Backbone features ``[N, F]`` of one centre view per image, in eval mode."""
    t = plain_transform(a, train=False)
    was = encoder.training
    encoder.eval()
    out = []
    for s in range(0, len(split.images), batch):
        x = torch.stack([t(torch.from_numpy(im).permute(2, 0, 1))
                         for im in split.images[s:s + batch]])
        out.append(encoder.backbone(x).float())
    encoder.train(was)
    return torch.cat(out)


def score(encoder: nn.Module, train: Split, test: Split, a: AugmentConfig,
          num_classes: int) -> dict[str, float]:
    from components.evaluation.knn import knn_accuracy, weighted_knn_predict
    from components.evaluation.probe import linear_probe

    f_tr, f_te = features(encoder, train, a), features(encoder, test, a)
    scores = weighted_knn_predict(f_tr, train.labels, f_te, [20], num_classes, temperature=0.07)
    knn = knn_accuracy(scores[20], test.labels, topk=(1,))[1]
    probe = linear_probe(f_tr, train.labels, f_te, test.labels, num_classes, epochs=100)
    return {"knn20": knn, "probe": probe.top1}


# ---------------------------------------------------------------------------------------------
# Driver.


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(xs: Sequence[float]) -> str:
    m, s = _mean_std(xs)
    return f"{100 * m:.1f} ± {100 * s:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    ap.add_argument("--losses", nargs="+", default=["simclr", "supcon", "xclr"],
                    choices=list(LOSSES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=None, help="override train.epochs")
    ap.add_argument("--per-class", type=int, default=120,
                    help="Fashion-MNIST images per class and official split")
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--work", default="runs/parity")
    ap.add_argument("--out", default=None, help="also write the table to this Markdown file")
    ap.add_argument("--plain-resize", choices=["bilinear", "area"], default="bilinear",
                    help="the plain loop's crop resize: torchvision bilinear, or OpenCV "
                         "INTER_AREA as FFCV's decoder (an ablation of that difference)")
    ap.add_argument("overrides", nargs="*", help="pretrain overrides for both loops")
    args = ap.parse_args()

    from components.data.reader import DatasetInfo
    from components.evaluation.baseline import random_init_encoder
    from components.runs.run_dir import load_run
    from components.runtime.session import ray_session
    from pipelines import preprocess, pretrain

    torch.set_num_threads(2)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # One line per (dataset, loss, seed) measured: a re-run of the same command after an
    # interruption measures only what is missing.
    log_path = work / "parity.jsonl"
    done = {}
    if log_path.exists():
        done = {r["config"]: r for r in map(json.loads, log_path.read_text().splitlines())}
    epochs = [f"train.epochs={args.epochs}"] if args.epochs else []
    rows: list[str] = []
    t_start = time.perf_counter()
    with ray_session(None):
        for ds in args.datasets:
            pre_path, pre_over, ds_over = DATASETS[ds]
            pre = load_config(ROOT / pre_path, PreprocessConfig, [
                f"output={work / ds}", *[o.format(per_class=args.per_class) for o in pre_over]])
            preprocess.run(pre, echo=False)
            info = DatasetInfo.load(work / ds)
            sim_np = info.class_similarity()
            sim = None if sim_np is None else torch.as_tensor(sim_np, dtype=torch.float32)
            c = len(info.classes)
            train = read_split(info.split_file("train"))
            test = read_split(info.split_file("test" if info.splits.get("test") else "val"))
            for loss in args.losses:
                over = [*ds_over, *LOSSES[loss], *epochs, *args.overrides]
                if loss == "xclr":
                    over.insert(len(ds_over) + len(LOSSES[loss]), XCLR_GRAPH[ds])
                res: dict[str, list[float]] = {}
                times = {"plain": 0.0, "pipeline": 0.0}
                for seed in args.seeds:
                    name = f"{ds}-{loss}-s{seed}"
                    cfg = load_config(args.config, PretrainConfig, [
                        f"name={name}", f"storage={work / 'runs'}", f"data.dataset={work / ds}",
                        f"train.seed={seed}", *over])
                    a = cfg.data.augment
                    key = _digest(cfg)
                    if args.plain_resize != "bilinear":
                        key += f"-plain-{args.plain_resize}"
                    if key in done:  # measured by an earlier, interrupted run of this command
                        for k, v in done[key]["scores"].items():
                            res.setdefault(k, []).append(v)
                        for k in times:
                            times[k] += done[key]["seconds"][k]
                        print(f"[parity] {name}: reused from {log_path}", flush=True)
                        continue
                    rand = random_init_encoder(cfg)  # the run's initial encoder
                    t0 = time.perf_counter()
                    plain = train_plain(cfg, work / ds, c, sim, info.caption_dim,
                                        args.plain_resize)
                    t_plain = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    pretrain.run(cfg, echo=False)
                    t_pipe = time.perf_counter() - t0
                    times["plain"] += t_plain
                    times["pipeline"] += t_pipe
                    piped = load_run(work / "runs" / name).encoder()
                    torch.set_num_threads(2)  # pretrain imported ffcv, which sets 1
                    scores = {f"{who}.{k}": v
                              for who, m in (("random", rand), ("plain", plain.encoder),
                                             ("pipeline", piped))
                              for k, v in score(m, train, test, a, c).items()}
                    for k, v in scores.items():
                        res.setdefault(k, []).append(v)
                    with open(log_path, "a") as f:
                        f.write(json.dumps({"name": name, "config": key, "scores": scores,
                                            "seconds": {"plain": t_plain,
                                                        "pipeline": t_pipe}}) + "\n")
                    print(f"[parity] {name}: " + ", ".join(
                        f"{k} {100 * v:.1f}" for k, v in scores.items()), flush=True)
                label = loss if not cfg.data.view_groups else loss + " multi-crop " + " + ".join(
                    f"{n}×{a.resolution}" for n, a in cfg.data.groups())
                rows.append(_row(ds, label, res, times))
    table = _table(rows, args, cfg_path=args.config, minutes=(time.perf_counter() - t_start) / 60)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


def _digest(cfg: PretrainConfig) -> str:
    """What identifies one measurement: the resolved pretrain config."""
    from components.config import to_dict

    text = json.dumps(to_dict(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ratio_interval(r: Sequence[float], p: Sequence[float], q: Sequence[float],
                   level: float = 0.9, draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A paired bootstrap interval of the gain ratio (mean(q) − mean(r)) / (mean(p) − mean(r)):
    seeds are resampled together (a seed's random, plain and pipeline runs share initial
    weights); draws where the plain loop gains nothing are dropped."""
    rng = np.random.default_rng(seed)
    a, b, c = (np.asarray(x, dtype=np.float64) for x in (r, p, q))
    idx = rng.integers(0, len(a), size=(draws, len(a)))
    plain = b[idx].mean(1) - a[idx].mean(1)
    pipe = c[idx].mean(1) - a[idx].mean(1)
    ok = plain > 0
    if not ok.any():
        return float("nan"), float("nan")
    ratios = pipe[ok] / plain[ok]
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _row(ds: str, loss: str, res: dict[str, list[float]], times: dict[str, float]) -> str:
    cells = [ds, loss]
    for metric in ("knn20", "probe"):
        r, p, q = (res[f"{w}.{metric}"] for w in ("random", "plain", "pipeline"))
        gain_plain = _mean_std(p)[0] - _mean_std(r)[0]
        gain_pipe = _mean_std(q)[0] - _mean_std(r)[0]
        ratio = gain_pipe / gain_plain if gain_plain > 0 else float("nan")
        lo, hi = ratio_interval(r, p, q)
        cells += [_fmt(r), _fmt(p), _fmt(q), f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]"]
    diff = abs(_mean_std(res["pipeline.knn20"])[0] - _mean_std(res["plain.knn20"])[0])
    cells.append("yes" if diff <= _mean_std(res["plain.knn20"])[1] else "no")
    cells.append(f"{times['pipeline'] / max(times['plain'], 1e-9):.1f}")
    return "| " + " | ".join(cells) + " |"


def _table(rows: list[str], args: argparse.Namespace, cfg_path: str, minutes: float) -> str:
    head = ("| data | loss | kNN@20 random | kNN@20 plain | kNN@20 pipeline "
            "| gain ratio [90 % CI] | probe random | probe plain | probe pipeline "
            "| gain ratio [90 % CI] | kNN within 1 std | time pipeline/plain |\n|" + "---|" * 12)
    cmd = "python bench/parity.py " + " ".join(sys.argv[1:])
    shown = Path(cfg_path).resolve()
    where = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    return (f"`{cmd}` — {datetime.date.today()}, {platform.machine()}, "
            f"{torch.get_num_threads()} threads, {minutes:.0f} min; config `{where}`, "
            f"seeds {args.seeds}; top-1 % on the test split, mean ± std over seeds; gain ratio "
            "= (pipeline − random) / (plain − random) of the means, with a paired bootstrap "
            "interval over seeds.\n\n"
            + head + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
