"""The paper estimate (docs/gpu.md): how long a pretrain config takes on a GPU at an assumed
fraction of its peak tensor throughput, from the FLOPs of the model it builds.

Training FLOPs per image = 3 × forward (backward ≈ 2 × forward) over every view, counted by
``FlopCounterMode`` on CPU (:func:`count_flops`); the time is those FLOPs × images ÷
(``fraction`` × the GPU's dense bf16/fp16 peak, :data:`PEAKS`). Compute only: data loading,
kernel launches and collectives are not in it. Used by ``simgraph validate`` (the GPU-hours
line, :func:`estimate_lines`) and by ``bench/gpu_acceptance.py`` (measured vs estimated).
Needs no GPU."""

from __future__ import annotations

import dataclasses
import re

from components.config import PretrainConfig

FRACTION = 0.35  # assumed achieved fraction of the peak (a ResNet at a good MFU)


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    name: str
    tflops: float  # peak dense tensor-core TFLOPS at the AMP dtype (bf16, or fp16 before sm_80)
    cc: tuple[int, int]  # compute capability


# Vendor datasheet peaks, dense (no 2:4 sparsity). Matched against torch.cuda.get_device_name()
# ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", ...): the first whole-word hit.
PEAKS: list[tuple[str, GPUSpec]] = [
    ("H200 NVL", GPUSpec("H200 NVL", 835.0, (9, 0))),
    ("H200", GPUSpec("H200 SXM", 989.0, (9, 0))),
    ("H100 NVL", GPUSpec("H100 NVL", 835.0, (9, 0))),
    ("H100 PCIe", GPUSpec("H100 PCIe", 756.0, (9, 0))),
    ("H100", GPUSpec("H100 SXM", 989.0, (9, 0))),
    ("L40S", GPUSpec("L40S", 362.0, (8, 9))),
    ("L4", GPUSpec("L4", 121.0, (8, 9))),
    ("A100", GPUSpec("A100", 312.0, (8, 0))),
    ("A10", GPUSpec("A10", 125.0, (8, 6))),
    ("T4", GPUSpec("T4", 65.0, (7, 5))),
    ("V100S", GPUSpec("V100S", 130.0, (7, 0))),
    ("V100", GPUSpec("V100", 125.0, (7, 0))),
]


def find_gpu(name: str) -> GPUSpec | None:
    """The :data:`PEAKS` entry whose key occurs in ``name`` as a whole word (so ``A10`` is not
    ``A100`` and ``L4`` is not ``L40S``), case-insensitive; ``None`` if none does."""
    for key, spec in PEAKS:
        pattern = r"(?<![A-Za-z0-9])" + re.escape(key).replace(r"\ ", r"[\s_-]+") + \
            r"(?![A-Za-z0-9])"
        if re.search(pattern, name, flags=re.IGNORECASE):
            return spec
    return None


def amp_for(cc: tuple[int, int]) -> str:
    """``bf16`` where it is native (Ampere, sm_80, and later), else ``fp16`` (+ GradScaler)."""
    return "bf16" if cc >= (8, 0) else "fp16"


@dataclasses.dataclass(frozen=True)
class Estimate:
    gpu: str
    cc: tuple[int, int] | None
    amp: str
    peak_tflops: float
    fraction: float
    views: int
    batch: int
    encoder_gflop_per_view: float  # forward
    objective_mflop_per_image: float  # forward, at the config's batch
    images_per_epoch: int
    images_note: str
    epochs: int

    @property
    def gflop_per_image(self) -> float:
        """Training FLOPs per image: 3 × forward (backward ≈ 2 × forward), every view."""
        forward = self.views * self.encoder_gflop_per_view + self.objective_mflop_per_image / 1e3
        return 3.0 * forward

    @property
    def images_per_s(self) -> float:
        return self.fraction * self.peak_tflops * 1e12 / (self.gflop_per_image * 1e9)

    @property
    def seconds_per_epoch(self) -> float:
        return self.images_per_epoch * self.gflop_per_image * 1e9 / (
            self.fraction * self.peak_tflops * 1e12)


def count_flops(cfg: PretrainConfig, num_classes: int = 10) -> tuple[float, float]:
    """Forward GFLOP per view of the encoder (backbone + projector) and forward MFLOP per image
    of the objective at the config's batch: ``FlopCounterMode`` (matmuls and convolutions) on
    CPU over the model :func:`components.training.step.build_model` builds. Per-image conv FLOPs do
    not depend on the batch, so the encoder is counted on 2 images (per view: with view groups
    of several crop sizes, the mean over the views, each at its size); the objective's similarity
    matmuls grow with the batch, so it is counted on random embeddings of a full batch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from components.objectives import ContrastiveBatch
    from components.training.step import build_model

    torch.manual_seed(0)
    model, _ = build_model(cfg.model, cfg.loss, num_classes, torch.eye(num_classes), 0,
                           cfg.data.augment.resolution)
    model.train()
    v, b = cfg.data.views, cfg.data.batch_size
    with torch.no_grad(), FlopCounterMode(display=False) as enc:
        for n, a in cfg.data.groups():  # view groups: each count at its own crop size
            r = a.resolution
            model.encoder(torch.randn(2 * n, 3, r, r))
    needs = model.objective.requires
    obj_flops = 0.0
    if needs <= {"labels"}:  # SupCon / SimCLR-like; the others add terms the config lacks
        batch = ContrastiveBatch(z=torch.randn(b, v, cfg.model.projector_dim),
                                 labels=torch.randint(0, num_classes, (b,)),
                                 sample_ids=torch.arange(b))
        with torch.no_grad(), FlopCounterMode(display=False) as obj:
            model.objective(batch)
        obj_flops = float(obj.get_total_flops())
    return enc.get_total_flops() / (2 * v) / 1e9, obj_flops / b / 1e6


def whole_batches(cfg: PretrainConfig, train_images: int) -> int:
    """Images one epoch of ``cfg`` trains on: ``train_images`` cut to whole global batches
    (``scaling.num_workers × data.batch_size``), as the loader's ``drop_last`` does."""
    global_batch = cfg.scaling.num_workers * cfg.data.batch_size
    return (train_images // global_batch) * global_batch


def estimate_for(cfg: PretrainConfig, gpu: str, flops: tuple[float, float], images: int,
                 note: str, fraction: float = FRACTION,
                 peak_tflops: float | None = None) -> Estimate:
    """The :class:`Estimate` of ``cfg`` on ``gpu`` (a :data:`PEAKS` name or a device name),
    from :func:`count_flops`'s ``flops`` and ``images`` per epoch (``note``: where that came
    from); ``peak_tflops`` overrides the table's peak (then ``gpu`` may be any name, and the
    AMP dtype is the config's where the GPU is not in the table).

    Raises:
        ValueError: ``gpu`` is not in :data:`PEAKS` and no ``peak_tflops`` is given.
    """
    spec = find_gpu(gpu)
    if spec is None and peak_tflops is None:
        raise ValueError(f"no PEAKS entry for {gpu!r} and no peak_tflops")
    cc = spec.cc if spec else None
    return Estimate(
        gpu=spec.name if spec and peak_tflops is None else gpu, cc=cc,
        amp=amp_for(cc) if cc else cfg.train.amp,
        peak_tflops=peak_tflops if peak_tflops is not None else spec.tflops,  # type: ignore[union-attr]
        fraction=fraction, views=cfg.data.views, batch=cfg.data.batch_size,
        encoder_gflop_per_view=flops[0], objective_mflop_per_image=flops[1],
        images_per_epoch=images, images_note=note, epochs=cfg.train.epochs)


def gpu_hours(e: Estimate) -> float:
    """GPU-hours of the whole run (``epochs`` × one epoch's GPU-seconds ÷ 3600): the same on
    one GPU or spread over many at the same efficiency."""
    return e.epochs * e.seconds_per_epoch / 3600


def hours_text(hours: float) -> str:
    """``1,234`` / ``18`` / ``1.3`` / ``0.0042``: whole hours from 10 up, else 2 significant
    digits (what :func:`estimate_lines` prints)."""
    return f"{hours:,.0f}" if hours >= 10 else f"{hours:.2g}"


def estimate_lines(cfg: PretrainConfig, train_images: int, source: str) -> list[str]:
    """``simgraph validate``'s paper-estimate line(s) for ``cfg`` trained on ``train_images``
    images per epoch (``source``: where the count came from — a dataset's manifest or
    ``recipe.train_images``): GPU-hours on an H100 SXM and an A100 at :data:`FRACTION` of
    their peaks. Builds the model on CPU to count its FLOPs (a ResNet-50 at 224 px: a few
    seconds)."""
    flops = count_flops(cfg)
    images = whole_batches(cfg, train_images)
    h100, a100 = (estimate_for(cfg, g, flops, images, source) for g in ("H100", "A100"))
    return [f"# paper estimate: {hours_text(gpu_hours(h100))} GPU-hours on an {h100.gpu} "
            f"({hours_text(gpu_hours(a100))} on an {a100.gpu}) for {cfg.train.epochs} epochs of "
            f"{images:,} images ({h100.gflop_per_image:.1f} GFLOP per training image at "
            f"{FRACTION * 100:.0f} % of peak; docs/gpu.md)",
            f"#   images per epoch: {source}, cut to whole global batches of "
            f"{cfg.scaling.num_workers * cfg.data.batch_size:,}"]
