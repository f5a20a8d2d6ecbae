"""The pretraining step, independent of Ray: model assembly, one optimisation step, the online
kNN monitor and per-epoch seeding. ``pipelines/pretrain.py`` drives these inside Ray Train.

Layout: a batch of ``B`` images with ``V`` views, ``images [B, V, 3, H, W]``, is run through
the encoder as one ``[B·V, 3, H, W]`` tensor (sample-major, row ``b·V + v``: the layout
:class:`~components.objectives.ContrastiveBatch` expects), so BatchNorm sees every view.
Multi-crop (views of several sizes, a :class:`~components.data.multicrop.MultiCrop`): one
encoder call per size on that size's views, the outputs put back in view order
(:meth:`PretrainModel.encode`), so every loss still gets ``z [B, V, D]``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from components.config import LossConfig, ModelConfig, TrainConfig
from components.data.multicrop import Images, MultiCrop, batch_views, size_groups, view_of
from components.errors import NonFiniteError, SimgraphError
from components.models.encoders import Encoder, build_encoder
from components.objectives import ContrastiveBatch, Metrics, Objective, build_objective
from components.objectives.memory import EMA, cosine_momentum
from components.runtime import distributed
from components.training.accumulate import GradCache
from components.training.online_probe import OnlineProbe


class NonFiniteLossError(SimgraphError, RuntimeError):
    """The loss became NaN/inf: the run stops, keeping its last good checkpoint (the recipe
    adds which one, and what to change)."""


class SkippedStep(RuntimeError):
    """``amp='fp16'``: the step's loss was NaN/inf (float16 overflow in the forward pass) and
    the step was skipped — no optimizer or EMA update, the schedule advanced — as the gradient
    scaler skips a step whose gradients overflow. Every rank skips it: the loss is global.
    :class:`SkipGuard` stops the run when skips persist."""


class SkipGuard:
    """Counts fp16's skipped steps; stops the run after ``limit`` in a row (a model that
    overflows every step is diverging, not unlucky)."""

    def __init__(self, limit: int = 20) -> None:
        self.limit, self.in_a_row, self.total = limit, 0, 0

    def ok(self) -> None:
        self.in_a_row = 0

    def skipped(self, e: SkippedStep, where: str) -> None:
        """Raises:
            NonFiniteLossError: ``limit`` steps in a row were skipped (``where``: the last)."""
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.limit:
            raise NonFiniteLossError(
                f"{where}: {self.in_a_row} steps in a row had a non-finite loss under "
                f"amp='fp16' (last: {e}); stopping")


# Fields a batch offers beyond z; an objective receives those it `requires` (+ ids, for banks).
_OPTIONAL = ("labels", "captions", "logits", "ema_z", "ema_logits")


class PretrainModel(nn.Module):
    """Encoder + objective as one module, so DDP syncs every trainable parameter (the CLIP
    baseline's head lives in the objective) and the memory bank is saved with the model.

    ``forward(images [B, V, 3, H, W], labels [B], sample_ids [B], captions [B, E] | None,
    ema) -> (loss, metrics)`` where ``ema`` is the EMA encoder when the objective needs keys.
    With ``keep_features`` set (the online probe's steps), the forward also keeps the
    detached backbone features ``h [B·V, F]`` of the batch for :meth:`take_features`.
    ``images`` may be a :class:`~components.data.multicrop.MultiCrop` (views of several
    sizes): see :meth:`encode`. The EMA encoder (memory-bank keys, CoNe's ``Q_p``) sees every
    view, the small crops included, through the same per-size calls: ``ema_z`` / ``ema_logits``
    are per view as ``z`` / ``logits`` are (CoNe pairs each view's logits with its own EMA
    distribution, and a bank stores every view's key, as with one size).
    """

    def __init__(self, encoder: Encoder, objective: Objective, channels_last: bool = False):
        super().__init__()
        self.encoder = encoder
        self.objective = objective
        self.channels_last = channels_last
        self.keep_features = False
        self._features: Tensor | None = None

    def take_features(self) -> Tensor:
        """The last forward's detached backbone features ``[B·V, F]`` (row ``b·V + v``), handed
        over once (the model keeps no reference to them after).

        Raises:
            RuntimeError: no forward kept any (``keep_features`` was off).
        """
        h, self._features = self._features, None
        if h is None:
            raise RuntimeError("no backbone features kept: set keep_features before the forward")
        return h

    def forward(
        self,
        images: Images,
        labels: Tensor,
        sample_ids: Tensor,
        captions: Tensor | None,
        ema: EMA | None = None,
    ) -> tuple[Tensor, Metrics]:
        if isinstance(images, MultiCrop):
            h, z, logits = self.encode_full(images)
            ez, el = self.encode(images, ema) if ema is not None else (None, None)
        else:  # one flattened copy for both encoders
            b, v = images.shape[:2]
            x = self._flat(images)
            out = self.encoder(x)  # (h [B·V, F], z [B·V, D], logits [B·V, C] | None)
            h = out[0].view(b, v, -1)
            z, logits = _per_view(out, b, v)
            ez = el = None
            if ema is not None:
                ez, el = _per_view(ema(x), b, v)
        if self.keep_features:
            self._features = h.detach().flatten(0, 1)  # [B·V, F], row b·V + v
        return self.objective(
            self.contrastive_batch(z, logits, ez, el, labels, sample_ids, captions))

    def _flat(self, images: Tensor) -> Tensor:
        """``images [B, V, 3, H, W]`` as the encoder's ``[B·V, 3, H, W]`` (row ``b·V + v``)."""
        x = images.flatten(0, 1)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def encode(self, images: Images, encoder: nn.Module | None = None
               ) -> tuple[Tensor, Tensor | None]:
        """``(z [B, V, D], logits [B, V, C] | None)`` of ``images [B, V, 3, H, W]`` through
        ``encoder`` (default: this model's; the EMA for keys): :meth:`encode_full`'s."""
        _, z, logits = self.encode_full(images, encoder)
        return z, logits

    def encode_full(self, images: Images, encoder: nn.Module | None = None
                    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(h [B, V, F], z [B, V, D], logits [B, V, C] | None)``: the backbone features
        too (the online probe's).

        A :class:`~components.data.multicrop.MultiCrop`: one encoder call per crop size, on
        ``[B·V_s, 3, H_s, W_s]`` (that size's views, sample-major), so BatchNorm normalises
        each size's views together (SwAV / DINO practice: the 224 px and the 96 px crops are
        separate forward passes); the outputs are put back in view order. A compiled encoder
        (``train.compile``) compiles once per size (one recompilation, then cached).
        """
        enc = self.encoder if encoder is None else encoder
        if not isinstance(images, MultiCrop):
            b, v = images.shape[:2]
            out = enc(self._flat(images))
            return (out[0].view(b, v, -1), *_per_view(out, b, v))
        b, _ = batch_views(images)
        hs: list[Tensor | None] = [None] * len(images.blocks)
        zs: list[Tensor | None] = [None] * len(images.blocks)
        ls: list[Tensor | None] = [None] * len(images.blocks)
        for idx in size_groups(images).values():
            parts = [images.blocks[i] for i in idx]
            x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # [B, V_s, 3, H, W]
            out = enc(self._flat(x))
            z, logits = _per_view(out, b, x.shape[1])
            h = out[0].view(b, x.shape[1], -1)
            counts = [p.shape[1] for p in parts]
            for i, hi, zi in zip(idx, h.split(counts, dim=1), z.split(counts, dim=1),
                                 strict=True):
                hs[i], zs[i] = hi, zi
            if logits is not None:
                for i, li in zip(idx, logits.split(counts, dim=1), strict=True):
                    ls[i] = li
        h_all = torch.cat([t for t in hs if t is not None], dim=1)  # [B, V, F]
        z_all = torch.cat([t for t in zs if t is not None], dim=1)  # [B, V, D]
        have = [t for t in ls if t is not None]
        return h_all, z_all, (torch.cat(have, dim=1) if have else None)

    def contrastive_batch(
        self, z: Tensor, logits: Tensor | None, ema_z: Tensor | None,
        ema_logits: Tensor | None, labels: Tensor, sample_ids: Tensor,
        captions: Tensor | None,
    ) -> ContrastiveBatch:
        """The objective's batch: ``z`` and the fields it ``requires`` (shapes as
        :meth:`encode`'s; ``labels`` / ``sample_ids`` [B], ``captions`` [B, E])."""
        fields: dict[str, Tensor | None] = {
            "labels": labels, "captions": captions, "logits": logits,
            "ema_z": ema_z, "ema_logits": ema_logits,
        }
        needs = self.objective.requires
        kept = {k: fields[k] for k in _OPTIONAL if k in needs}
        return ContrastiveBatch(z=z, sample_ids=sample_ids, **kept)


def _per_view(out: tuple[Tensor, Tensor, Tensor | None], b: int, v: int
              ) -> tuple[Tensor, Tensor | None]:
    """An encoder's ``(h, z [B·V, D], logits [B·V, C] | None)`` as ``(z [B, V, D], logits
    [B, V, C] | None)``."""
    _, z, logits = out
    return z.view(b, v, -1), None if logits is None else logits.view(b, v, -1)


def build_model(
    model_cfg: ModelConfig,
    loss_cfg: LossConfig,
    num_classes: int,
    class_similarity: Tensor | None,
    caption_dim: int,
    resolution: int | None = None,
) -> tuple[PretrainModel, EMA | None]:
    """The encoder (classifier head when the loss reads ``logits``), its objective, and the
    EMA copy when the objective needs keys (memory bank, CoNe). ``resolution``: the crops'
    side (``data.augment.resolution``), which a timm ViT-like backbone is built for.

    Raises:
        ValueError: the dataset lacks what the loss needs (see ``build_objective``).
    """
    encoder = build_encoder(model_cfg, resolution)
    objective = build_objective(loss_cfg, model_cfg.projector_dim, num_classes=num_classes,
                                class_similarity=class_similarity, caption_dim=caption_dim)
    if "logits" in objective.requires:  # drawn after the objective's weights (CLIP's head),
        encoder.add_classifier(num_classes)  # as every run so far: seeded inits unchanged
    ema = EMA(encoder) if {"ema_z", "ema_logits"} & objective.requires else None
    return PretrainModel(encoder, objective), ema


def compile_encoder(model: PretrainModel) -> None:
    """``train.compile``: the encoder's forward (backbone, projector, classifier) through
    ``torch.compile`` in place (``nn.Module.compile``: parameter names, ``state_dict`` and
    checkpoints stay those of the eager model). The objective stays eager: its pairing and
    graph targets have data-dependent shapes, and at these sizes it is not the step's cost."""
    model.encoder.compile()


def uses_projector(objective: Objective) -> bool:
    """Whether every step's loss reads ``z``. Cross-entropy only reads ``logits``; CoNe reads
    ``z`` only once its bank holds neighbours. Otherwise DDP must be told
    (``find_unused_parameters``) that the projector may get no gradient."""
    return bool(getattr(objective, "always_uses_z", True))


def seed_everything(seed: int, epoch: int, rank: int) -> None:
    """Seed torch, numpy and ``random`` from (seed, epoch, rank) at each epoch start.

    The state at an epoch boundary is then a function of the epoch alone, so a run resumed
    from an end-of-epoch checkpoint draws the same augmentations and dropout as an
    uninterrupted one. (FFCV's numba-compiled augmentations draw from numba's per-thread
    generators, which Python cannot reseed: with ``data.jit: true`` the views of a resumed
    epoch differ; with ``jit: false`` they use numpy's global generator, seeded here.)
    """
    s = int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 matmuls and convolutions in hardware: a CPU with
    AVX-512 BF16 or AMX tiles (oneDNN's bf16 kernels; elsewhere bf16 is emulated and slower
    than float32), a CUDA GPU of compute capability ≥ 8.0."""
    if device.type == "cuda":
        return bool(torch.cuda.get_device_capability(device)[0] >= 8)
    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def resolve_amp(amp: str, device: torch.device) -> str:
    """``train.amp`` for this worker: ``auto`` becomes ``bf16`` where :func:`native_bf16`,
    else ``none``; any other value is returned as given."""
    if amp != "auto":
        return amp
    return "bf16" if native_bf16(device) else "none"


def autocast(device: torch.device, amp: str) -> AbstractContextManager[Any]:
    """Autocast for ``train.amp``: ``none`` | ``bf16`` | ``fp16`` | ``auto``
    (:func:`resolve_amp`)."""
    amp = resolve_amp(amp, device)
    if amp == "none":
        return nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclasses.dataclass
class StepState:
    """Running sums over an epoch's steps (averaged by :meth:`summary`).

    A metric given as a 0-d tensor (``train_step``'s ``grad_norm``: reading it each step
    would make the host wait for the device) is summed on its device in float64, the
    precision of the float sums, and read once, by :meth:`summary`: the same sums, with one
    device read per epoch instead of one per step.
    """

    steps: int = 0
    sums: dict[str, float | Tensor] = dataclasses.field(default_factory=dict)

    def add(self, metrics: dict[str, Any]) -> None:  # float or 0-d tensor values
        self.steps += 1
        for k, v in metrics.items():
            if isinstance(v, Tensor):  # float(v) would read it back: stay on the device
                v = v.detach().to(torch.float32 if v.device.type == "mps" else torch.float64)
            else:
                v = float(v)
            prev = self.sums.get(k)
            self.sums[k] = v if prev is None else prev + v  # 0 + v is v: the float sum exactly

    def summary(self) -> dict[str, float]:
        """Per-step means; ``anchors*`` counts are summed over the epoch."""
        on_device = {k: v for k, v in self.sums.items() if isinstance(v, Tensor)}
        read: dict[str, float] = {}
        if on_device:  # one device read for all of them
            values = torch.stack(list(on_device.values())).tolist()
            read = dict(zip(on_device, values, strict=True))
        out = {}
        for k, v in self.sums.items():
            total = read[k] if k in read else float(v)
            out[k] = total if k.startswith("anchors") else total / max(self.steps, 1)
        return out


def train_step(
    model: nn.Module,
    ema: EMA | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    batch: Any,
    *,
    train_cfg: TrainConfig,
    device: torch.device,
    step: int,
    total_steps: int,
    ema_momentum: float,
    where: str,
    equal_batches: bool = True,
    probe: OnlineProbe | None = None,
) -> dict[str, Any]:
    """One optimisation step on a reader ``Batch``; returns the objective's metrics + lr
    (floats) and, with ``train.grad_clip``, ``grad_norm`` as a 0-d device tensor (reading it
    would make the host wait for the device each step; :class:`StepState` sums it on the
    device).

    Host reads: one per step, for every loss — the objective's read of its loss statistics,
    which also carries the batch's input checks and the loss's own label checks
    (:func:`components.objectives.batch.hot_path`; budgets in tests/training/test_sync_audit.py);
    ``amp='fp16'`` adds the gradient scaler's read of its inf/NaN flag in ``scaler.step``.
    ``equal_batches``: every rank's batch has the same size, as the training loader's
    ``drop_last`` guarantees (:mod:`components.data.reader`), so the gathers exchange no
    sizes; pass False for batches that may differ between ranks.

    ``train_cfg.accumulate`` > 1: the encoder runs in that many chunks of the batch
    (:class:`GradCache`); the loss, the schedule and every update stay once per step.

    ``probe``: the online linear probe (:class:`~components.training.online_probe.
    OnlineProbe`) takes one step on the batch's detached backbone features after the
    encoder's update (its mean loss as ``probe_loss``, a 0-d device tensor); nothing of the
    encoder's step depends on it.

    Raises:
        NonFiniteLossError: the global loss is NaN/inf (``where`` says which epoch/step);
            the optimizer has not been stepped, so the last checkpoint stays good.
        SkippedStep: the same with a gradient scaler (``amp='fp16'``): the step is skipped
            instead (:class:`SkipGuard` decides when to stop).
    """
    from components.objectives.batch import hot_path

    optimizer.zero_grad(set_to_none=True)
    if probe is not None or isinstance(getattr(model, "module", model), PretrainModel):
        _unwrap(model).keep_features = probe is not None
    problem = None
    cache = (GradCache(model, _unwrap(model), train_cfg.accumulate)
             if train_cfg.accumulate > 1 else None)
    with autocast(device, train_cfg.amp), hot_path(equal_batches=equal_batches):
        try:
            if cache is None:
                loss, metrics = model(batch.images, batch.labels, batch.sample_ids,
                                      batch.captions, ema)
            else:  # pass 1: the loss on the whole batch, from chunks embedded without a graph
                loss, metrics = cache.forward(batch, ema)
        except NonFiniteError as e:
            problem = str(e)
    if problem is None and not math.isfinite(metrics["loss"]):
        problem = f"the loss is {metrics['loss']} (non-finite)"
    if problem is not None:
        if scaler is not None:  # fp16 overflow: skip the step, as the scaler would
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            raise SkippedStep(f"{where}: {problem}")
        raise NonFiniteLossError(
            f"{where}: {problem}; stopping (the optimizer was not stepped)")
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if cache is not None:  # pass 2: each chunk's slice of d loss / d z through the encoder
        with autocast(device, train_cfg.amp):
            cache.backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    out: dict[str, Any] = dict(metrics)
    if train_cfg.grad_clip is not None:  # [] total norm before clipping, left on the device
        out["grad_norm"] = torch.nn.utils.clip_grad_norm_(
            model.parameters(), train_cfg.grad_clip).detach()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    out["lr"] = float(optimizer.param_groups[0]["lr"])
    scheduler.step()
    if ema is not None:
        encoder = _unwrap(model).encoder
        ema.update(encoder, cosine_momentum(step, total_steps, base=ema_momentum))
    if probe is not None:  # detached features: its own optimiser, after the encoder's step
        out["probe_loss"] = probe.step(_unwrap(model).take_features(), batch.labels,
                                       batch.images.shape[1])
    return out


def _unwrap(model: nn.Module) -> PretrainModel:
    inner = getattr(model, "module", model)
    if not isinstance(inner, PretrainModel):
        raise TypeError(f"expected a PretrainModel (optionally in DDP), got {type(inner)}")
    return inner


@torch.no_grad()
def sync_buffers(module: nn.Module) -> None:
    """Average floating-point buffers (BatchNorm running statistics) over ranks, so every rank
    evaluates — and rank 0 saves — the same model. Memory-bank buffers are identical on every
    rank already and are skipped (they live under ``objective``)."""
    if not distributed.is_distributed():
        return
    world = distributed.world_size()
    for name, buf in module.named_buffers():
        if buf.is_floating_point() and not name.startswith("objective."):
            buf.copy_(distributed.all_reduce_sum(buf) / world)


@torch.no_grad()
def extract_features(
    encoder: Encoder, batches: Iterable[Any], device: torch.device, amp: str = "none",
    projector: bool = False,
) -> tuple[Tensor, Tensor]:
    """Backbone features ``[N, F]`` (or projector outputs ``[N, D]``) float32 and labels
    ``[N]`` of the first view of each image, in eval mode (this rank's share)."""
    was = encoder.training
    encoder.eval()
    feats, labels = [], []
    for b in batches:
        with autocast(device, amp):
            h = encoder.backbone(view_of(b.images, 0))
            if projector:
                h = encoder.projector(h)
        feats.append(h.float())
        labels.append(b.labels)
    encoder.train(was)
    if not feats:  # a rank with no samples: still the right width for a gather
        last = list(encoder.projector.modules())[-1]
        width = int(getattr(last, "out_features", 0)) if projector else encoder.feat_dim
        return (torch.zeros(0, width, device=device),
                torch.zeros(0, dtype=torch.long, device=device))
    return torch.cat(feats), torch.cat(labels).to(device)
