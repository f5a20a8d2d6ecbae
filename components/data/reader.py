"""Read a preprocessed dataset dir: V augmented views per image for one DDP rank.

:class:`DatasetInfo` reads and checks ``manifest.json``; :class:`ViewLoader` wraps one FFCV
``Loader`` over ``<split>.beton``:

* **Sharding.** Ranks see disjoint samples, a new shuffle each epoch, reproducible from
  (seed, epoch); with ``drop_last`` every rank runs the same number of steps, without it every
  sample is read exactly once (evaluation): :mod:`components.data.sample_order`.
* **Views.** View 0 reads the stored ``image`` field; later views are extra
  ``PipelineSpec("image", ...)`` entries, each view with its own random crop, flip and colour
  ops. On CPU colour jitter and grayscale run inside FFCV's compiled pipeline and blur and
  solarization as batched torch ops; on CUDA the crop and flip run in FFCV and the rest as
  batched torch ops on the device after ``ToDevice``. Views of one augmentation with nothing
  but the crop in FFCV (CUDA, or no jitter / grayscale) share one pipeline that decodes each
  image once for all of them (:func:`~components.data.view_ops.view_slots`). On CUDA the
  training crops themselves are made on the device: FFCV decodes and draws each view's crop
  and flip, the GPU resizes (``device_crops``,
  :mod:`~components.data.augment.device_crop`).
* **View groups** (multi-crop, ``data.view_groups``): each view takes its group's crop size,
  crop scale and op probabilities, in FFCV and in the batched ops alike.
* **Output.** :class:`Batch` with ``images`` ``[B, V, 3, H, W]`` float32 normalised (never
  FFCV's buffers, which it reuses: on CPU a buffer of
  :class:`~components.data.normalise.HostBatchPool`, reused only once nothing references the
  batch it held) when every view has one size, else a
  :class:`~components.data.multicrop.MultiCrop` of ``[B, V_i, 3, H_i, W_i]`` blocks;
  ``labels`` / ``sample_ids`` ``[B]`` int64 (``[1]`` for a batch of one image: only the
  per-sample dim is squeezed), ``captions`` ``[B, E]`` float32 or ``None``.
* **Devices.** CUDA devices always carry their index (``cuda:N``); a bare ``cuda`` is refused:
  :mod:`components.data.devices` (:func:`~components.data.devices.resolve_device`).
* **No hang.** An exception in FFCV's loader thread is re-raised in the consumer
  (:class:`LoaderError`); a thread that produces nothing for ``stall_timeout`` seconds fails it
  (:class:`LoaderStalledError`): :mod:`components.data.loader_thread`.

FFCV compiles each new Loader with numba (15–45 s here): build it once per worker and reuse
it across epochs (:meth:`ViewLoader.set_epoch`); ``jit=False`` skips compilation (tests).

Owns: the dataset dir as a reader sees it (:class:`DatasetInfo`, :class:`DatasetError`), the
batch (:class:`Batch`), FFCV's JIT switch (:func:`set_jit`) and :class:`ViewLoader`. Its parts:
:mod:`~components.data.sample_order`, :mod:`~components.data.view_ops` (FFCV's ops of each
output), :mod:`~components.data.loader_thread`, :mod:`~components.data.devices`,
:mod:`~components.data.reader_errors`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.config import AugmentConfig, PretrainConfig
from components.data.loader_thread import decode_threads, seeded_loader_class, stall_timeout_s
from components.data.multicrop import Images, MultiCrop
from components.data.reader_errors import (
    LoaderError as LoaderError,  # pickled by path in older sweep dirs
)
from components.data.reader_errors import (
    LoaderStalledError as LoaderStalledError,  # pickled by path in older sweep dirs
)
from components.data.reader_errors import (
    ReaderSettingError as ReaderSettingError,  # pickled by path in older sweep dirs
)
from components.data.sample_order import order_factory
from components.data.shards import F16_BITS, FORMAT, MANIFEST
from components.data.view_ops import field_spec, pipeline_ops, view_slots
from components.errors import SimgraphError


class DatasetError(SimgraphError, ValueError):
    """The dataset dir is missing, incomplete or lacks what the run needs."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetInfo:
    root: Path
    classes: list[str]
    splits: dict[str, int]  # split -> sample count
    caption_dim: int  # 0 = no caption field
    manifest: dict[str, Any]

    @classmethod
    def load(cls, root: str | Path) -> DatasetInfo:
        """Read ``manifest.json``.

        Raises:
            DatasetError: no manifest (preprocessing not run or not finished), or another format.
        """
        root = Path(root)
        try:
            m = json.loads((root / MANIFEST).read_text())
        except FileNotFoundError:
            raise DatasetError(
                f"{root} has no {MANIFEST}: run `simgraph preprocess` for it first (or let an "
                "interrupted run finish)"
            ) from None
        except (OSError, ValueError) as e:
            raise DatasetError(f"cannot read {root / MANIFEST}: {e}") from None
        if m.get("format") != FORMAT or not m.get("complete"):
            raise DatasetError(
                f"{root / MANIFEST} is not a complete {FORMAT} dataset (format "
                f"{m.get('format')!r}, complete={m.get('complete')}); re-run preprocessing"
            )
        caption = m["fields"].get("caption")
        return cls(
            root=root,
            classes=list(m["classes"]),
            splits={k: int(v["samples"]) for k, v in m["splits"].items()},
            caption_dim=int(caption["shape"][0]) if caption else 0,
            manifest=m,
        )

    def split_file(self, split: str) -> Path:
        if self.splits.get(split, 0) == 0:
            have = [s for s, n in self.splits.items() if n]
            raise DatasetError(f"{self.root} has no samples in split {split!r}; it has {have}")
        return self.root / self.manifest["splits"][split]["file"]

    def class_similarity(self) -> np.ndarray | None:
        """``[C, C]`` cosine similarity of the class captions (X-CLR's class graph)."""
        name = self.manifest.get("class_files", {}).get("class_similarity")
        return np.load(self.root / name) if name else None


# ---------------------------------------------------------------------------------------------
# The loader.


@dataclasses.dataclass(kw_only=True)
class Batch:
    images: Images  # [B, V, 3, H, W] float32, normalised; a MultiCrop for several sizes
    labels: torch.Tensor  # [B] int64 (-1 = unlabelled)
    sample_ids: torch.Tensor  # [B] int64
    captions: torch.Tensor | None  # [B, E] float32 (L2-normalised) or None


def set_jit(enabled: bool) -> None:
    """Switch FFCV's numba compilation on or off (off: no 15–45 s compile, slow pipeline)."""
    from ffcv.pipeline.compiler import Compiler

    Compiler.set_enabled(enabled)


# The largest batch of device-crop slots (uint8, one per image the size of the file's widest)
# a loader hands FFCV and copies to the device: 256 images of 512 x 512 are 192 MiB.
DEVICE_CROP_BATCH_BYTES = 512 * 2**20


class ViewLoader:
    """FFCV loader for one split and one rank; see the module docstring.

    Args:
        path: the split's ``.beton`` file (``DatasetInfo.split_file``).
        batch_size: per-rank batch.
        views: augmented views per image (``train``) — evaluation always gives one.
        augment: crop / colour parameters (evaluation's, and every view's without
            ``view_groups``).
        view_groups: ``(count, augmentation)`` per group of training views, in view order
            (:meth:`components.config.DataConfig.groups`); replaces ``views`` (their total)
            and ``augment`` for the training views.
        train: random views and a shuffled order; otherwise a centre crop in file order.
        seed, rank, world_size: the order (``rank_order``).
        device: ``cpu`` or an indexed CUDA device, ``cuda:N`` (then the colour ops run batched
            on the GPU; a bare ``cuda`` is refused: see :func:`resolve_device`).
        num_workers: FFCV decoding threads.
        drop_last: equal step counts on all ranks (training) or every sample once (eval).
        with_captions: read the caption embeddings if the file has them.
        max_batches: cap an epoch at this many batches (the first of each epoch's order; the
            order itself is unchanged, so capped epochs stay disjoint across ranks).
        batched_augment: colour jitter, grayscale and blur as batched torch ops on ``device``
            after the loader (default: on CUDA only; ``True`` on CPU runs the GPU path's
            augmentation there) instead of FFCV's per-sample ops; also where batches are
            made: ``False`` in reused host buffers (the CPU path), ``True`` as new tensors on
            ``device`` (the GPU path's, whose caching allocator reuses device memory).
        stall_timeout: seconds to wait for one batch before failing (:func:`stall_timeout_s`).
        device_crops: training views' crops made on ``device`` after the loader, FFCV only
            decoding and drawing them (:mod:`~components.data.augment.device_crop`; bilinear
            views with batched colour ops): the GPU path's default; ``True`` on CPU runs it
            there (tests). Not for a file whose batch of slots would pass
            :data:`DEVICE_CROP_BATCH_BYTES` (its crops stay in FFCV).

    Raises:
        ReaderSettingError: a CUDA device without an index, a bad ``stall_timeout``.
        DatasetError: the file cannot be read as an FFCV file.
        LoaderError / LoaderStalledError: while iterating, see the module docstring.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        batch_size: int,
        views: int = 2,
        augment: AugmentConfig | None = None,
        view_groups: Sequence[tuple[int, AugmentConfig]] | None = None,
        train: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        num_workers: int = 2,
        drop_last: bool | None = None,
        os_cache: bool = True,
        with_captions: bool = True,
        max_batches: int | None = None,
        batched_augment: bool | None = None,
        stall_timeout: float | None = None,
        device_crops: bool | None = None,
    ) -> None:
        from ffcv.reader import Reader

        if view_groups is not None:
            if not view_groups or any(n < 1 for n, _ in view_groups):
                raise ValueError(f"view_groups={list(view_groups)!r}: give (count >= 1, "
                                 "augmentation) pairs, at least one")
            views = sum(n for n, _ in view_groups)
        if views < 1:
            raise ValueError(f"views={views} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")
        self.augment = augment or AugmentConfig()
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            raise ReaderSettingError(
                f"device {str(device)!r} has no index: FFCV's loader thread makes the reader's "
                "device its current CUDA device, which needs one; pass cuda:0 (or cuda:N; "
                "components.data.devices.resolve_device picks it from a stage's resources)")
        self.stall_timeout = stall_timeout_s(stall_timeout)
        self.path = Path(path)
        self.train = train
        self.views = views if train else 1
        # One augmentation per view: its group's (training) or ``augment``'s.
        groups = list(view_groups) if (train and view_groups is not None) else \
            [(self.views, self.augment)]
        self.view_augments = [a for n, a in groups for _ in range(n)]
        drop_last = train if drop_last is None else drop_last
        try:
            reader = Reader(str(path))
            handlers = reader.handlers
        except (ValueError, OSError, IndexError, KeyError) as e:  # FFCV's header/table reads
            raise DatasetError(
                f"{path} cannot be read as an FFCV file ({type(e).__name__}: {e}): it is "
                "truncated or corrupt; restore it, or rebuild the dataset with `simgraph "
                "preprocess`") from None
        fields = list(handlers)
        self.has_captions = with_captions and "caption" in fields
        # float16 captions are stored as int16 bits (shards.write_shard); viewed back below.
        self._f16_bits = "caption" in fields and handlers["caption"].dtype == F16_BITS
        on_gpu = self.device.type == "cuda"
        # Colour ops as batched torch ops after the loader: always on CUDA; on CPU only when
        # asked (tests run the GPU path's augmentation this way), else inside FFCV.
        batched = on_gpu if batched_augment is None else batched_augment
        # Host buffers reused across batches for the CPU path; the batched (GPU path's) ops
        # allocate on their device, as the caching allocator there reuses memory already.
        pooled = not on_gpu and not batched
        device_crops = on_gpu if device_crops is None else device_crops
        if device_crops and not batched:
            raise ReaderSettingError("device_crops=True needs the batched colour ops "
                                     "(batched_augment=True; the default on CUDA)")
        if device_crops and train and "image" in fields:
            # a slot per image is the file's widest image: past DEVICE_CROP_BATCH_BYTES a
            # batch (a dataset stored at a large max_side) keeps its crops in FFCV instead
            meta = reader.metadata[f"f{fields.index('image')}"]
            if len(meta):
                from components.data.augment.device_crop import slot_bytes

                per_image = slot_bytes(int(meta["height"].max()), int(meta["width"].max()),
                                       self.views)
                device_crops = batch_size * per_image <= DEVICE_CROP_BATCH_BYTES
        self.pipeline_ops = pipeline_ops(fields, augment=self.augment, train=train,
                                         views=self.views, device=self.device,
                                         batched_augment=batched,
                                         with_captions=self.has_captions,
                                         view_augments=self.view_augments,
                                         device_crops=device_crops)
        self._view_slots = view_slots(self.pipeline_ops)  # (output, index in it) per view
        from components.data.augment.device_crop import DecodeForDeviceCrops

        # outputs of slots [B, S] whose views are cropped after the loader: key -> decoder
        self._device_crops = {k: ops[0] for k, ops in self.pipeline_ops.items()
                              if isinstance(ops[0], DecodeForDeviceCrops)}
        pipelines: dict[str, Any] = {
            k: (ops if k == "image" or not k.startswith("image") else field_spec("image", ops))
            for k, ops in self.pipeline_ops.items()
        }
        if "caption" in fields and not self.has_captions:
            pipelines["caption"] = None  # stored but not read
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches={max_batches} must be >= 1 or None")
        order = order_factory(max_batches=max_batches, seed=seed, rank=rank,
                               world_size=world_size,
                               batch_size=batch_size, shuffle=train, drop_last=drop_last)
        self.loader = seeded_loader_class()(
            str(path), batch_size=batch_size, num_workers=decode_threads(num_workers),
            order=order,
            os_cache=os_cache, drop_last=drop_last, pipelines=pipelines,
        )
        self.loader.aug_seed = (seed, rank)  # type: ignore[attr-defined]
        # What the epoch iterator's consumer side names and waits (SeededEpochIterator).
        self.loader.split_file = str(path)  # type: ignore[attr-defined]
        self.loader.stall_timeout = self.stall_timeout  # type: ignore[attr-defined]
        # FFCV's pipeline thread makes CUDA calls; the current device is per thread.
        self.loader.thread_device = self.device if on_gpu else None  # type: ignore[attr-defined]
        self._names = list(self.loader.pipeline_specs)
        mean = torch.tensor(self.augment.mean, device=self.device).view(1, 3, 1, 1) * 255
        std = torch.tensor(self.augment.std, device=self.device).view(1, 3, 1, 1) * 255
        self._mean, self._std = mean, std
        from components.data.normalise import HostBatchPool, normalise_table  # numba, as FFCV

        # The CPU kernel's [3, 256] table, and the host buffers batches are written into
        # (reused once the consumer dropped them): components/data/normalise.py
        self._table = None if on_gpu else normalise_table(mean.view(3).cpu().numpy(),
                                                          std.view(3).cpu().numpy())
        self._pool = HostBatchPool() if pooled else None
        # The batched ops after the loader of each view (None: none), one module per group.
        made: dict[int, torch.nn.Module | None] = {}
        self._post_ops: list[torch.nn.Module | None] = []
        for a in self.view_augments:
            if id(a) not in made:
                made[id(a)] = (None if not train else self._gpu_augment(a) if batched
                               else self._blur_only(a)
                               if max(a.blur_p, a.solarize_p) > 0 else None)
            self._post_ops.append(made[id(a)])
        # Runs of consecutive views of one size: the output's blocks (one: a plain tensor).
        sides = [a.resolution for a in self.view_augments]
        self._blocks: list[tuple[int, int]] = []  # (first view, views)
        for v, side in enumerate(sides):
            if v and side == sides[v - 1]:
                self._blocks[-1] = (self._blocks[-1][0], self._blocks[-1][1] + 1)
            else:
                self._blocks.append((v, 1))
        # FFCV reuses a few slots of pinned host buffers and device buffers. It makes the next
        # copy into a slot wait (on the GPU) for an event recorded on the consumer's stream when
        # a later batch is handed over, but (a) the host may record it before the consumer has
        # enqueued its work on the earlier batch, and (b) its CPU pipeline writes the next
        # batch into the pinned slot without waiting for the GPU copy out of it. With the GPU
        # several batches behind, a batch can then be read after it was overwritten. Training
        # is safe: each step reads its loss statistics back (a host sync), so the GPU is never
        # a step behind. Evaluation loops (feature extraction, the online kNN) have no read per
        # batch: there the consumer's stream is drained before the next batch is taken, which
        # keeps FFCV's thread prefetching on the CPU while the GPU finishes the last batch.
        self._drain_between_batches = on_gpu and not train

    @staticmethod
    def _gpu_augment(a: AugmentConfig) -> torch.nn.Module:
        from components.data.augment import BatchedSimCLRAugment

        return BatchedSimCLRAugment(
            brightness=a.brightness, contrast=a.contrast, saturation=a.saturation, hue=a.hue,
            jitter_p=a.jitter_p, grayscale_p=a.grayscale_p, blur_p=a.blur_p,
            sigma=(a.blur_sigma[0], a.blur_sigma[1]), solarize_p=a.solarize_p,
        )

    @staticmethod
    def _blur_only(a: AugmentConfig) -> torch.nn.Module:
        """CPU: what FFCV's pipeline does not run (blur, then solarization)."""
        from components.data.augment import BatchedSimCLRAugment

        return BatchedSimCLRAugment(jitter_p=0.0, grayscale_p=0.0, blur_p=a.blur_p,
                                    sigma=(a.blur_sigma[0], a.blur_sigma[1]),
                                    solarize_p=a.solarize_p)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads ``epoch``'s order (resume: set the epoch, then iterate)."""
        self.loader.next_epoch = epoch

    @property
    def epoch(self) -> int:
        return int(self.loader.next_epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Generator[Batch, None, None]:
        epoch = iter(self.loader)  # FFCV's EpochIterator: a thread filling a queue
        try:
            yield from self._batches(epoch)
        finally:  # stopped early (close(), break): end the thread, or exit aborts the process
            epoch.close()
            # A stalled thread cannot be ended (it is stuck in the pipeline); it is a daemon.
            epoch.join(timeout=0 if epoch.stalled else 5)

    def _batches(self, epoch: Iterator[Any]) -> Iterator[Batch]:
        from components.data.augment.device_crop import crop_views
        from components.data.normalise import normalise_hwc_into  # numba: with FFCV's

        for out in epoch:
            got = dict(zip(self._names, out, strict=True))
            for key, dec in self._device_crops.items():  # [B, S] -> [B, V, 3, H, W] uint8
                got[key] = crop_views(got[key], views=dec.views, size=dec.output_size,
                                      max_hw=dec.max_hw)
            blocks: list[torch.Tensor] = []
            for first, n in self._blocks:
                block: torch.Tensor | None = None
                for j in range(n):
                    v = first + j
                    key, k = self._view_slots[v]
                    # [B, 3, H, W] uint8, a view over FFCV's [B, (V,) H, W, 3] buffer (or
                    # over the device crops' [B, V, 3, H, W])
                    x = (got[key] if k is None else got[key][:, k] if key in self._device_crops
                         else got[key][:, k].permute(0, 3, 1, 2))
                    op = self._post_ops[v]
                    if op is not None:
                        x = op(x)
                    if block is None:  # a tensor per batch no one else holds: the consumer's
                        shape = (x.shape[0], n, *x.shape[1:])
                        block = (self._pool.take(shape) if self._pool is not None else
                                 torch.empty(shape, dtype=torch.float32, device=x.device))
                    # (x.float() - mean) / std written in place: the same float32 values,
                    # without three temporaries per view and a stack (each a fresh mmap)
                    if op is None and x.device.type == "cpu":  # FFCV's HWC buffer, read once
                        normalise_hwc_into(x.permute(0, 2, 3, 1).numpy(),
                                           block[:, j].numpy(), self._table)
                    else:
                        torch.sub(x, self._mean, out=block[:, j]).div_(self._std)
                assert block is not None
                blocks.append(block)
            images: Images = blocks[0] if len(blocks) == 1 else MultiCrop(tuple(blocks))
            caps = got.get("caption") if self.has_captions else None
            yield Batch(
                images=images,
                labels=got["label"].long().clone(),
                sample_ids=got["sample_id"].long().clone(),
                captions=self._captions(caps) if caps is not None else None,
            )
            if self._drain_between_batches:  # the consumer's work on it is enqueued by now
                self._drain()


    def _drain(self) -> None:
        """Wait until the device has finished what the consumer enqueued on its batches."""
        torch.cuda.current_stream(self.device).synchronize()

    def _captions(self, caps: torch.Tensor) -> torch.Tensor:
        if self._f16_bits:  # [B, E] int16 bit patterns -> float16 -> float32 (a new tensor)
            return caps.view(torch.float16).float()
        return caps.float().clone()


def train_views(cfg: PretrainConfig, info: Any, rank: int, world: int, device: Any,
                with_captions: bool, batched_augment: bool | None = None) -> ViewLoader:
    """The training ``ViewLoader`` of one rank: what every worker reads (``simgraph preview``
    draws its batches from this same function). ``batched_augment``: see ``ViewLoader``; the
    GPU path's (``True``) makes its crops on the device too (``device_crops``)."""
    d = cfg.data
    return ViewLoader(
        info.split_file("train"), batch_size=d.batch_size, views=d.views, augment=d.augment,
        view_groups=d.groups() if d.view_groups else None, train=True, seed=cfg.train.seed,
        rank=rank, world_size=world, device=device,
        num_workers=d.num_workers, drop_last=True, os_cache=d.os_cache,
        with_captions=with_captions, max_batches=cfg.train.steps_per_epoch,
        batched_augment=batched_augment, device_crops=batched_augment,
    )
