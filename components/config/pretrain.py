"""Pretraining configs: data + augmentation, model, optimiser, training, checkpoints, scaling,
online kNN and linear probe; the run config."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from components.config.backbones import check_backbone, is_timm, timm_name, timm_probe
from components.config.checks import (
    ConfigError,
    check_at_least,
    check_gpu_share,
    check_in_range,
    check_non_negative,
    check_positive,
)
from components.config.losses import LOSS_CONFIGS, ContrastiveConfig, LossConfig, SimCLRConfig
from components.errors import clip

# ---------------------------------------------------------------------------------------------
# Reading a dataset dir for training (components/data/reader.py).

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    """SimCLR's augmentation set (simclr App. A; CIFAR variant: no blur) applied per view.

    Crop ``scale``/``ratio`` as torchvision's RandomResizedCrop; colour jitter with
    probability ``jitter_p``; grayscale ``grayscale_p``; Gaussian blur ``blur_p`` (0.5 for
    ImageNet-size images); solarization ``solarize_p`` (BYOL: invert every channel value
    ``>= 128`` of a uint8 image, torchvision's ``RandomSolarize(threshold=128)``). Evaluation
    views are a centre crop of ``eval_crop_ratio`` of the
    shorter side resized to ``resolution``. ``interpolation``: how crops are resized —
    ``bilinear`` (antialiased, as torchvision) or ``area`` (FFCV's own OpenCV ``INTER_AREA``,
    nearest-like when a crop is enlarged; it cost SimCLR 15 % of its kNN gain on 28 px
    Fashion-MNIST, docs/results.md).
    """

    resolution: int = 32
    scale: list[float] = dataclasses.field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = dataclasses.field(default_factory=lambda: [3 / 4, 4 / 3])
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    grayscale_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: list[float] = dataclasses.field(default_factory=lambda: [0.1, 2.0])
    solarize_p: float = 0.0
    mean: list[float] = dataclasses.field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = dataclasses.field(default_factory=lambda: list(IMAGENET_STD))
    eval_crop_ratio: float = 1.0
    interpolation: Literal["bilinear", "area"] = "bilinear"

    def __post_init__(self) -> None:
        check_at_least("data.augment.resolution", self.resolution, 4)
        if self.interpolation not in ("bilinear", "area"):
            raise ConfigError(f"data.augment.interpolation={clip(self.interpolation)} is not "
                              "allowed: choose bilinear (torchvision's) or area (FFCV's)")
        for key, pair, low, high in (
            ("scale", self.scale, 0.0, 1.0), ("ratio", self.ratio, 0.0, 100.0),
            ("blur_sigma", self.blur_sigma, 0.0, 100.0),
        ):
            if len(pair) != 2 or not (low < pair[0] <= pair[1] <= high):
                raise ConfigError(
                    f"data.augment.{key}={clip(pair)} is not allowed: give [low, high] with "
                    f"{low} < low <= high <= {high}"
                )
        for key in ("flip_p", "jitter_p", "grayscale_p", "blur_p", "solarize_p"):
            check_in_range(f"data.augment.{key}", getattr(self, key), 0.0, 1.0)
        for key in ("brightness", "contrast", "saturation"):
            check_non_negative(f"data.augment.{key}", getattr(self, key))
        check_in_range("data.augment.hue", self.hue, 0.0, 0.5)
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(
                f"data.augment.mean={self.mean} / std={self.std}: give 3 values each, std > 0"
            )
        check_in_range("data.augment.eval_crop_ratio", self.eval_crop_ratio, 0.05, 1.0)


# What a view group may set for itself; any it leaves out (null) is data.augment's.
GROUP_OVERRIDES = ("resolution", "scale", "flip_p", "jitter_p", "grayscale_p", "blur_p",
                   "solarize_p")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViewGroup:
    """One group of ``data.view_groups`` (multi-crop): ``count`` views, each a crop of
    ``resolution`` px with crop ``scale`` and the group's own flip / jitter / grayscale / blur /
    solarize probabilities. A field left out (``null``) is ``data.augment``'s. Checked by
    :meth:`check` from :class:`DataConfig` (which knows the group's index for the message)."""

    count: int
    resolution: int | None = None
    scale: list[float] | None = None
    flip_p: float | None = None
    jitter_p: float | None = None
    grayscale_p: float | None = None
    blur_p: float | None = None
    solarize_p: float | None = None

    def check(self, key: str) -> None:
        """Raises:
            ConfigError: one line naming ``key.<field>``, its value and what is allowed."""
        check_at_least(f"{key}.count", self.count, 1)
        if self.resolution is not None:
            check_at_least(f"{key}.resolution", self.resolution, 4)
        s = self.scale
        if s is not None and (len(s) != 2 or not 0.0 < s[0] <= s[1] <= 1.0):
            raise ConfigError(f"{key}.scale={clip(s)} is not allowed: give [low, high] with "
                              "0.0 < low <= high <= 1.0 (the crop's share of the image area)")
        for name in ("flip_p", "jitter_p", "grayscale_p", "blur_p", "solarize_p"):
            value = getattr(self, name)
            if value is not None:
                check_in_range(f"{key}.{name}", value, 0.0, 1.0)

    def augment(self, base: AugmentConfig) -> AugmentConfig:
        """``base`` with this group's fields in place of its own (the group's crop and ops)."""
        over = {k: getattr(self, k) for k in GROUP_OVERRIDES if getattr(self, k) is not None}
        return dataclasses.replace(base, **over)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which dataset dir to read and how. ``dataset``: a path or an ``s3://`` / ``gs://`` URI.
    ``batch_size`` is per worker (the global batch is ``batch_size × workers``);
    ``num_workers`` are FFCV's decoding threads per worker; ``jit: false`` skips FFCV's numba
    compile (tests, debugging). ``stage: true`` copies the dataset to node-local disk first,
    once per node, verified against the manifest's sha256 (always done for URIs: FFCV reads
    local files); ``stage_dir``: where (default ``$SIMGRAPH_STAGE_DIR``, else
    ``<tmp>/simgraph-stage-<uid>``, owner-only).

    ``view_groups`` (multi-crop; SwAV's 2 × 224 + 6 × 96, BYOL's asymmetric views): a list
    of :class:`ViewGroup`; the views are the groups' in order, ``V`` = the sum of their
    counts, and ``views`` is that total (leave it out or give that number: another value is
    refused). Empty (the default): ``views`` views, all of ``augment``. Evaluation and export
    crop at ``augment.resolution``, which is also a group's resolution when it gives none.
    """

    dataset: str
    batch_size: int = 256
    views: int = 2
    num_workers: int = 2
    os_cache: bool = True
    jit: bool = True
    stage: bool = False
    stage_dir: str | None = None
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)
    view_groups: list[ViewGroup] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check_at_least("data.batch_size", self.batch_size, 1)
        check_at_least("data.views", self.views, 1)
        check_at_least("data.num_workers", self.num_workers, 1)
        if not self.view_groups:
            return
        for i, group in enumerate(self.view_groups):
            if not isinstance(group, ViewGroup):
                raise ConfigError(f"data.view_groups[{i}]={clip(group)} is not allowed: give "
                                  "a mapping with count (and resolution, scale, flip_p, "
                                  "jitter_p, grayscale_p, blur_p, solarize_p)")
            group.check(f"data.view_groups[{i}]")
        total = sum(g.count for g in self.view_groups)
        if self.views not in (2, total):  # 2: the default, i.e. left out
            counts = " + ".join(str(g.count) for g in self.view_groups)
            raise ConfigError(
                f"data.views={self.views} is not allowed with data.view_groups ({counts} = "
                f"{total} views): leave data.views out or set it to {total}")
        object.__setattr__(self, "views", total)  # V: what every loss and estimate reads

    def groups(self) -> list[tuple[int, AugmentConfig]]:
        """``(count, augmentation)`` of each view group in view order: ``view_groups``'
        (:meth:`ViewGroup.augment`), or one group of ``views`` views of ``augment``."""
        if not self.view_groups:
            return [(self.views, self.augment)]
        return [(g.count, g.augment(self.augment)) for g in self.view_groups]

    def resolutions(self) -> list[int]:
        """The distinct crop sides of the training views, in order of first appearance."""
        return list(dict.fromkeys(a.resolution for _, a in self.groups()))


# ---------------------------------------------------------------------------------------------
# Pretraining (pipelines/pretrain.py).


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Encoder = backbone + projector (+ a linear classifier for CoNe / CE).

    ``backbone``: ``convnet`` (``blocks`` × conv-BN-ReLU-maxpool, ``width`` · 2^i channels:
    the small-data default, 28–64 px), a torchvision ResNet (``resnet18`` / ``34`` / ``50``), or
    ``timm/<name>``: any architecture ``timm.list_models()`` knows (``timm/resnet50``,
    ``timm/vit_small_patch16_224``, ``timm/convnext_tiny``, …), random init, without its
    classifier (``components.config.backbones``); a ViT-like one is built for
    ``data.augment.resolution``, which must be a multiple of its patch size. ``small_images``:
    the torchvision ResNet CIFAR stem (3×3 stride-1 conv, no max-pool; SimCLR App. B.9) for
    28–64 px inputs; it does not apply to a timm backbone (its default ``true`` is accepted
    and has no effect there: a run config stores every field, so a value the user wrote cannot
    be told from the default). Projector:
    ``projector_layers`` linear layers, ``projector_hidden`` wide, ``projector_dim`` out
    (SupCon: 2048 → 2048 → 128); ``projector_bn`` puts BatchNorm after each hidden layer.
    ``sync_bn`` and ``channels_last`` apply on GPU only. ``init``: a local ``.safetensors`` /
    ``.pth`` / ``.pt`` state dict (timm, torchvision, a simgraph export or checkpoint, DDP /
    DINO wrappers) the backbone (and a matching projector) starts from at a fresh start
    instead of random weights (:mod:`components.models.init_weights`); never downloaded.
    """

    backbone: str = "resnet18"
    small_images: bool = True
    width: int = 32
    blocks: int = 4
    projector_hidden: int = 2048
    projector_dim: int = 128
    projector_layers: int = 2
    projector_bn: bool = True
    sync_bn: bool = True
    channels_last: bool = True
    init: str | None = None

    def __post_init__(self) -> None:
        check_backbone(self.backbone)
        if self.init is not None and (not isinstance(self.init, str) or not self.init):
            raise ConfigError(f"model.init={clip(self.init)} is not allowed: give the path "
                              "of a local .safetensors / .pth / .pt file, or null")
        check_at_least("model.width", self.width, 1)
        check_at_least("model.blocks", self.blocks, 1)
        check_at_least("model.projector_hidden", self.projector_hidden, 1)
        check_at_least("model.projector_dim", self.projector_dim, 1)
        check_at_least("model.projector_layers", self.projector_layers, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimiser and LR schedule. The peak LR is ``lr`` scaled from ``reference_batch`` to the
    global batch (``lr_scaling``: linear, as SimCLR's 0.3 × B/256; sqrt; or none), reached
    after ``warmup_epochs`` of linear warm-up, then (``schedule``) cosine-decayed to
    ``final_lr_fraction`` × peak, held ``constant``, or ``step``: multiplied by ``step_gamma``
    at each epoch of ``step_epochs`` (e.g. ``[60, 80]`` of 100; fractional epochs allowed).
    ``adam`` is plain Adam (L2 weight decay in the gradient), ``adamw`` decoupled decay.
    Weight decay and LARS skip biases and norm parameters."""

    name: Literal["sgd", "lars", "adam", "adamw"] = "sgd"
    lr: float = 0.3
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"
    reference_batch: int = 256
    momentum: float = 0.9
    weight_decay: float = 1e-4
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    trust_coefficient: float = 0.001
    warmup_epochs: float = 10.0
    schedule: Literal["cosine", "constant", "step"] = "cosine"
    final_lr_fraction: float = 0.0
    step_epochs: list[float] = dataclasses.field(default_factory=list)
    step_gamma: float = 0.1

    def __post_init__(self) -> None:
        check_positive("optim.lr", self.lr)
        check_at_least("optim.reference_batch", self.reference_batch, 1)
        check_in_range("optim.momentum", self.momentum, 0.0, 0.999999)
        check_non_negative("optim.weight_decay", self.weight_decay)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas={clip(self.betas)}: give two values in [0, 1)")
        check_positive("optim.trust_coefficient", self.trust_coefficient)
        check_non_negative("optim.warmup_epochs", self.warmup_epochs)
        check_in_range("optim.final_lr_fraction", self.final_lr_fraction, 0.0, 1.0)
        check_in_range("optim.step_gamma", self.step_gamma, 1e-12, 1.0)
        e = self.step_epochs
        if self.schedule == "step" and not e:
            raise ConfigError("optim.schedule=step needs optim.step_epochs: the epochs at which "
                              "the LR is multiplied by optim.step_gamma, e.g. [60, 80]")
        if any(not isinstance(x, int | float) or x <= 0 for x in e) or any(
                b <= a for a, b in zip(e, e[1:], strict=False)):
            raise ConfigError(f"optim.step_epochs={clip(e)} is not allowed: give increasing "
                              "epochs > 0, e.g. [60, 80]")
        if e and self.schedule != "step":
            raise ConfigError(f"optim.step_epochs={clip(e)} is only used by optim.schedule=step "
                              f"(schedule is {self.schedule}): set schedule: step or remove it")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The loop. ``amp``: autocast dtype (``fp16`` adds a gradient scaler and needs a GPU; on
    CPU ``none`` and ``bf16``); ``auto``: ``bf16`` where the worker's device computes it
    natively (a CPU with AVX-512 BF16 or AMX, a GPU of compute capability ≥ 8.0), else
    ``none`` (float32), decided by each worker (:func:`components.training.step.resolve_amp`) and
    recorded in its ``workers/rank<r>.json``. ``compile``: the encoder's forward through
    ``torch.compile`` (Inductor; the first steps pay the compile, docs/benchmarks.md says when
    it pays back). ``steps_per_epoch`` caps an epoch (demos, tests; ``None`` = the
    whole split). ``grad_clip``: max global gradient norm, ``None`` = off.

    ``accumulate``: k ≥ 1 encoder chunks per step (the "gradient cache"; 1 = off). A step
    still takes one loader batch of ``data.batch_size`` per worker (the global batch, steps
    per epoch and the LR scaling are unchanged); the encoder sees it as k chunks of
    ``batch_size / k`` (k must divide it), so activation memory is a chunk's, while the loss
    sees the whole batch: negatives, positives, graph targets, memory-bank writes and the
    gathers across workers are those of the unchunked step, and so is the gradient when the
    encoder has no batch-dependent layer. BatchNorm normalises each chunk with its own
    statistics — as k workers of ``batch_size / k`` would without SyncBN (``model.sync_bn``
    on GPUs: each chunk over every worker's same chunk) — and its running statistics take
    one update per chunk. Each chunk runs forward twice (about one extra forward pass of
    time): without a graph to compute the loss, then with one to backpropagate its slice
    (:class:`components.training.accumulate.GradCache`). A resume may change it."""

    epochs: int = 100
    seed: int = 0
    amp: Literal["none", "bf16", "fp16", "auto"] = "none"
    compile: bool = False
    grad_clip: float | None = None
    steps_per_epoch: int | None = None
    log_every_steps: int = 50
    accumulate: int = 1

    def __post_init__(self) -> None:
        check_at_least("train.epochs", self.epochs, 1)
        check_at_least("train.accumulate", self.accumulate, 1)
        if self.grad_clip is not None:
            check_positive("train.grad_clip", self.grad_clip)
        if self.steps_per_epoch is not None:
            check_at_least("train.steps_per_epoch", self.steps_per_epoch, 1)
        check_at_least("train.log_every_steps", self.log_every_steps, 1)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """Full-state checkpoint every ``every_epochs`` epochs and after the last one; the newest
    ``keep`` are kept."""

    every_epochs: int = 1
    keep: int = 2

    def __post_init__(self) -> None:
        check_at_least("checkpoint.every_epochs", self.every_epochs, 1)
        check_at_least("checkpoint.keep", self.keep, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingSection:
    """Ray Train workers. ``cpus_per_worker`` may be fractional: on a 2-CPU machine, 2 workers
    × 1 CPU leave nothing for Ray's own tasks and can hang (docs/ray-notes.md), use 0.5.
    ``max_failures``: restarts of the worker group from the latest checkpoint (after a node is
    lost the restart waits until the cluster has room again). ``placement_strategy``: Ray's
    placement-group strategy for the workers — ``PACK`` fills nodes first (fewest nodes,
    NCCL over NVLink), ``SPREAD`` / ``STRICT_SPREAD`` put them on different nodes (one per node
    when strict). ``host``: where the run trains — ``ray_train`` (a Ray Train worker group),
    ``in_process`` (one CPU worker in the ``simgraph pretrain`` process itself: no Ray start,
    controller or worker group, the same weights; no restarts) or ``auto``: ``in_process`` for
    a one-worker CPU run without restarts (``max_failures`` 0) on this machine (no
    ``RAY_ADDRESS``), else ``ray_train``."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 1.0
    max_failures: int = 0
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    host: Literal["auto", "in_process", "ray_train"] = "auto"

    def __post_init__(self) -> None:
        check_at_least("scaling.num_workers", self.num_workers, 1)
        if self.host == "in_process":
            why = ("scaling.num_workers=1" if self.num_workers != 1 else
                   "scaling.use_gpu=false" if self.use_gpu else
                   "scaling.max_failures=0 (nothing restarts a process)"
                   if self.max_failures != 0 else None)
            if why is not None:
                raise ConfigError(f"scaling.host=in_process needs {why}: use scaling.host="
                                  "ray_train (or auto) for this run")
        check_positive("scaling.cpus_per_worker", self.cpus_per_worker)
        check_positive("scaling.gpus_per_worker", self.gpus_per_worker)
        if self.use_gpu:
            check_gpu_share("scaling.num_workers", self.num_workers, "scaling.gpus_per_worker",
                            self.gpus_per_worker)
        if self.max_failures < -1:
            raise ConfigError(
                f"scaling.max_failures={self.max_failures} is not allowed: -1 (retry forever) "
                "or a count >= 0"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class KNNConfig:
    """Online weighted-kNN monitor (Wu et al. 2018): unaugmented backbone features of the
    ``bank_split`` vote for each ``query_split`` image, weights ``exp(cos / temperature)``.
    ``every_epochs: 0`` turns it off."""

    every_epochs: int = 1
    k: int = 200
    temperature: float = 0.07
    bank_split: str = "train"
    query_split: str = "val"

    def __post_init__(self) -> None:
        check_at_least("knn.every_epochs", self.every_epochs, 0)
        check_at_least("knn.k", self.k, 1)
        check_positive("knn.temperature", self.temperature)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    """Online linear probe (as solo-learn / lightly run beside pretraining): a linear
    classifier ``nn.Linear(feature_dim, classes)`` on the detached backbone features (those the
    kNN reads) of every view of each training batch, trained at every step with its own AdamW
    (``lr``, decoupled ``weight_decay``; constant LR, zero-initialised) outside the encoder's
    graph, autocast and gradient scaler: it never changes the encoder's training. Its top-1 on
    the unaugmented ``split`` images (``null``: ``knn.query_split``, whose features the kNN
    extracts anyway) is ``probe_top1`` (and its binomial standard error ``probe_top1_se``) in
    ``metrics.csv``, every ``every_epochs`` epochs and after the last. ``every_epochs: 0``
    (the default, and what a run stored before the probe existed resumes with) turns it off;
    it needs a labelled dataset. AdamW rather than SGD: the backbone features' scale drifts as
    the encoder trains and differs between backbones, and Adam's steps do not depend on it, so
    one ``lr`` fits every run; it is not scaled with the global batch (the probe's gradient is
    the mean over the global batch, as one process's). A resume may change every key (the
    probe starts fresh when the checkpoint holds none)."""

    every_epochs: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    split: str | None = None

    def __post_init__(self) -> None:
        check_at_least("probe.every_epochs", self.every_epochs, 0)
        check_positive("probe.lr", self.lr)
        check_non_negative("probe.weight_decay", self.weight_decay)
        if self.split is not None and (not isinstance(self.split, str) or not self.split):
            raise ConfigError(f"probe.split={clip(self.split)} is not allowed: name a split of "
                              "the dataset (e.g. val), or null for knn.query_split")

    def split_of(self, knn: KNNConfig) -> str:
        """The split the probe reports on: ``split``, or ``knn.query_split`` when null."""
        return knn.query_split if self.split is None else self.split


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    """Opt-in experiment trackers, beside ``metrics.csv`` and TensorBoard (always written).

    ``mlflow: true`` logs the flattened config as parameters and every epoch's metrics
    (step = epoch) to MLflow, from rank 0: to ``mlflow_uri``, by default an SQLite store in
    the run dir (``sqlite:///<run dir>/mlflow.db``; ``mlflow ui --backend-store-uri`` that
    URI shows it), in experiment ``mlflow_experiment``. A resumed run continues the same
    MLflow run. Needs the ``mlflow-skinny`` package (``pip install -e '.[tracking]'``).

    ``wandb: true`` logs the config and every epoch's metrics (x-axis ``epoch``) to Weights &
    Biases from rank 0, in project ``wandb_project``; ``wandb_mode: offline`` (the default)
    writes the run under ``<run dir>/wandb/`` without a network or account (``wandb sync``
    uploads it later), ``online`` needs ``WANDB_API_KEY`` or ``wandb login``. A resumed run
    continues the same W&B run id. Needs the ``wandb`` package.
    """

    mlflow: bool = False
    mlflow_uri: str | None = None
    mlflow_experiment: str = "simgraph"
    wandb: bool = False
    wandb_project: str = "simgraph"
    wandb_mode: str = "offline"

    def __post_init__(self) -> None:
        if not self.mlflow_experiment:
            raise ConfigError("tracking.mlflow_experiment='' is not allowed: name the "
                              "experiment, e.g. simgraph")
        check_wandb("tracking.", self.wandb_project, self.wandb_mode)


WANDB_MODES = ("offline", "online")


def check_wandb(prefix: str, project: str, mode: str) -> None:
    """The W&B settings of a pretrain config (``prefix`` ``tracking.``) or a sweep file
    (``prefix`` empty): a project name, and a mode of :data:`WANDB_MODES`."""
    if not project:
        raise ConfigError(f"{prefix}wandb_project='' is not allowed: name the project, "
                          "e.g. simgraph")
    if mode not in WANDB_MODES:
        raise ConfigError(f"{prefix}wandb_mode={clip(mode)} is not allowed: choose one of "
                          f"{', '.join(WANDB_MODES)} (offline writes the run locally; "
                          "`wandb sync` uploads it later)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecipeSection:
    """What a config reproduces, for people and for the paper estimate; it changes nothing in
    training (a run may change it on resume). ``name``: a short label
    (``supcon-imagenet-resnet50``); ``paper``: the citation and the section or table followed;
    ``train_images``: the paper's training-set size (ImageNet-1k: 1,281,167), which
    ``simgraph validate`` uses for the GPU-hours estimate when the dataset is not built here
    (0: unknown)."""

    name: str = ""
    paper: str = ""
    train_images: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.train_images, bool) or not isinstance(self.train_images, int) \
                or self.train_images < 0:
            raise ConfigError(f"recipe.train_images={clip(self.train_images)} is not allowed: "
                              "give the paper's number of training images, an integer >= 0 "
                              "(0: unknown)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainConfig:
    """``simgraph pretrain``: the run dir is ``storage/name``; re-running the same name resumes
    from its latest complete checkpoint (the stored config must match)."""

    name: str
    data: DataConfig
    storage: str = "runs"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=SimCLRConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    scaling: ScalingSection = dataclasses.field(default_factory=ScalingSection)
    knn: KNNConfig = dataclasses.field(default_factory=KNNConfig)
    probe: ProbeConfig = dataclasses.field(default_factory=ProbeConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    recipe: RecipeSection = dataclasses.field(default_factory=RecipeSection)

    tagged_unions: ClassVar[dict[str, dict[str, type]]] = {"loss": LOSS_CONFIGS}

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(
                f"name={clip(self.name)} is not allowed: give a run name without '/' (the run "
                f"dir is storage/name)"
            )
        blocks = self.model.blocks
        # Every crop side the encoder sees: evaluation's, then each view group's.
        sides = {"data.augment.resolution": self.data.augment.resolution}
        for i, g in enumerate(self.data.view_groups):
            if g.resolution is not None and g.resolution != self.data.augment.resolution:
                sides.setdefault(f"data.view_groups[{i}].resolution", g.resolution)
        for key, side in sides.items():
            if self.model.backbone == "convnet" and side < 2**blocks:
                raise ConfigError(
                    f"model.blocks={blocks} halves {key}={side} {blocks} times; a "
                    f"{blocks}-block convnet needs resolution >= {2**blocks}: lower "
                    f"model.blocks to <= {side.bit_length() - 1} or raise the resolution")
        if is_timm(self.model.backbone):  # patch size vs resolution; the size timm accepts
            name, side = timm_name(self.model.backbone), self.data.augment.resolution
            if timm_probe(name, side).takes_img_size and len(sides) > 1:
                key, other = list(sides.items())[1]
                raise ConfigError(
                    f"{key}={other} is not allowed with model.backbone={self.model.backbone}: "
                    f"it is built for data.augment.resolution={side} (position embeddings of "
                    "one input size); give every view group that resolution, or use a "
                    "convolutional backbone for multi-crop")
            for other in list(sides.values())[1:]:
                timm_probe(name, other)
        k, b = self.train.accumulate, self.data.batch_size
        if b % k:
            divisors = [str(d) for d in range(1, b + 1) if b % d == 0]  # [1, …, b]
            allowed = (", ".join(divisors[:-1]) + f" or {divisors[-1]}" if len(divisors) <= 12
                       else ", ".join(divisors[:11]) + ", …")
            raise ConfigError(
                f"train.accumulate={k} does not divide data.batch_size={b}: a step splits "
                f"each worker's batch into train.accumulate equal encoder chunks; use one of "
                f"{allowed} (or change data.batch_size)")
        # a contrastive loss with no positive for any anchor is 0 every step: a run that
        # trains nothing, silently (SimCLR's positive is the other view of its image)
        if isinstance(self.loss, SimCLRConfig) and self.data.views < 2:
            raise ConfigError(
                f"loss.name='simclr' with data.views={self.data.views}: an image's positive "
                "is its other view, so no anchor has one and the loss is 0 every step; use "
                "data.views=2 (or more)")
        gathered = self.data.views * self.data.batch_size * self.scaling.num_workers
        if isinstance(self.loss, ContrastiveConfig) and gathered < 2 and not self.loss.bank_size:
            raise ConfigError(
                f"loss.name={self.loss.name!r} with data.views={self.data.views} and "
                f"data.batch_size={self.data.batch_size} on {self.scaling.num_workers} worker: "
                "each step contrasts one view with nothing (the loss is 0 every step); raise "
                "data.batch_size or data.views")
        if self.scaling.use_gpu is False and self.train.amp == "fp16":
            raise ConfigError("train.amp='fp16' needs scaling.use_gpu=true; on CPU use 'bf16' "
                              "or 'none'")

