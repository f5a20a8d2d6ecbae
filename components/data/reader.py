"""Read a preprocessed dataset dir: V augmented views per image for one DDP rank.

:class:`DatasetInfo` reads and checks ``manifest.json``; :class:`ViewLoader` wraps one FFCV
``Loader`` over ``<split>.beton``:

* **Sharding.** :class:`RankOrder` permutes the whole split with
  ``default_rng([seed, epoch])`` (the same on every rank) and deals it out ``perm[rank::W]``,
  so ranks see disjoint samples, a new shuffle each epoch, reproducible from (seed, epoch).
  With ``drop_last`` the permutation is cut to a multiple of ``W × batch`` first, so every rank
  runs the same number of steps (DDP collectives need that) and nothing is repeated; without
  it every sample is read exactly once (evaluation). FFCV's own ``distributed=True`` pads
  with repeats (``DistributedSampler``), which is why it is not used.
* **Views.** View 0 reads the stored ``image`` field; views 1..V-1 are extra
  ``PipelineSpec("image", ...)`` entries, each with its own random crop, flip and colour ops.
  On CPU colour jitter and grayscale run inside FFCV's compiled pipeline and blur as a batched
  torch op; on CUDA the crop and flip run in FFCV and the rest as batched torch ops on the
  device after ``ToDevice``.
* **Output.** :class:`Batch` with ``images`` ``[B, V, 3, H, W]`` float32 normalised (cloned:
  FFCV reuses its buffers), ``labels`` / ``sample_ids`` ``[B]`` int64 (``[1]`` for a batch of
  one image: only the per-sample dim is squeezed), ``captions`` ``[B, E]`` float32 or ``None``.
* **Devices.** CUDA devices always carry their index (``cuda:N``): FFCV's loader thread makes
  the reader's device its current one (``torch.cuda.set_device``), which refuses a bare
  ``cuda``. :func:`resolve_device` picks a stage's device from what it was given (``--device``,
  or a Ray task's GPUs), never from ``torch.cuda.is_available()`` alone.
* **No hang.** FFCV's loader thread fills a queue the consumer waits on. An exception in that
  thread is re-raised in the consumer (:class:`LoaderError`, with the thread's traceback text);
  a thread that produces nothing for ``stall_timeout`` seconds (default
  :data:`STALL_TIMEOUT_S`, or ``$SIMGRAPH_LOADER_TIMEOUT_S``) fails the consumer
  (:class:`LoaderStalledError`), naming the split file. FFCV 1.0.2's own iterator waits forever.

FFCV compiles each new Loader with numba (15–45 s here): build it once per worker and reuse
it across epochs (:meth:`ViewLoader.set_epoch`); ``jit=False`` skips compilation (tests).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.config import AugmentConfig
from components.data.shards import F16_BITS, FORMAT, MANIFEST
from components.errors import SimgraphError


class DatasetError(SimgraphError, ValueError):
    """The dataset dir is missing, incomplete or lacks what the run needs."""


class ReaderSettingError(SimgraphError, ValueError):
    """A bad reader setting: a device that is not ``cpu`` / ``cuda:N`` (or a GPU torch cannot
    see), a bad stall timeout. Exit 2, as a bad argument."""

    exit_code = 2


class LoaderError(SimgraphError, RuntimeError):
    """FFCV's loader thread failed while reading a split file; the message names the file and
    holds the thread's traceback (the thread's exception is the ``__cause__``)."""


class LoaderStalledError(LoaderError):
    """FFCV's loader thread produced no batch within the stall timeout."""


STALL_TIMEOUT_S = 300.0  # default: generous (a first batch includes numba compiling, 15-45 s)
STALL_TIMEOUT_ENV = "SIMGRAPH_LOADER_TIMEOUT_S"


def stall_timeout_s(value: float | None = None) -> float:
    """Seconds a consumer waits for FFCV's next batch before it fails: ``value``, else
    ``$SIMGRAPH_LOADER_TIMEOUT_S``, else :data:`STALL_TIMEOUT_S`.

    Raises:
        ReaderSettingError: not a finite number of seconds > 0.
    """
    if value is not None:
        where, raw = "stall_timeout", str(value)
    else:
        raw = os.environ.get(STALL_TIMEOUT_ENV, "").strip()
        if not raw:
            return STALL_TIMEOUT_S
        where = STALL_TIMEOUT_ENV
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ReaderSettingError(
            f"{where}={raw} is not a number of seconds > 0: set it to how long a reader may "
            f"wait for one batch before it fails (default {STALL_TIMEOUT_S:g}), or unset it")
    return seconds


def resolve_device(requested: str | torch.device | None = None) -> torch.device:
    """The device a stage (``simgraph evaluate``, ``embed``, a sweep's confirmation) reads and
    computes on: ``cpu`` or ``cuda:N``, never a bare ``cuda`` (see the module docstring).

    ``requested``: ``cpu``, ``cuda`` (= ``cuda:0``) or ``cuda:N`` (a ``--device``). ``None``:
    from the resources the stage was given. In a Ray task or actor that is the GPUs Ray gave
    it: ``cuda:0`` when it was given one (Ray sets ``CUDA_VISIBLE_DEVICES`` to them, so the
    first is index 0), else ``cpu`` — Ray 2.60 no longer hides a node's GPUs from CPU-only
    tasks, so ``torch.cuda.is_available()`` there says nothing about what the task holds.
    Elsewhere ``cuda:0`` when torch sees a GPU, else ``cpu``.

    Raises:
        ReaderSettingError: not ``cpu`` / ``cuda[:N]``, or a GPU that torch does not see.
    """
    what = f"--device {requested}"
    if requested is None:
        gpus = _ray_task_gpus()
        if gpus is None:
            return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        if not gpus:
            return torch.device("cpu")
        requested, what = "cuda:0", f"the GPU this Ray task was given (Ray's id {gpus[0]})"
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ReaderSettingError(f"{what!s} is not a device this reader uses: use cpu or cuda:N "
                                 "(N: the GPU's index, e.g. cuda:0)")
    if dev.type == "cpu":
        return torch.device("cpu")
    index = 0 if dev.index is None else dev.index
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ReaderSettingError(
            f"{what} asks for a GPU, but torch sees no CUDA device here (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); use --device cpu, or run "
            "where torch sees the GPU")
    if index >= count:
        raise ReaderSettingError(
            f"{what}: torch sees {count} CUDA device{'s' if count != 1 else ''} (cuda:0 to "
            f"cuda:{count - 1}, numbered within CUDA_VISIBLE_DEVICES); use one of those")
    return torch.device("cuda", index)


def _ray_task_gpus() -> list[Any] | None:
    """The GPU ids Ray gave the task or actor this process runs; ``None`` outside one (Ray not
    imported or not started, or the driver: its ``get_gpu_ids()`` is always empty)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray._private.worker import WORKER_MODE

    if ray.get_runtime_context().worker.mode != WORKER_MODE:
        return None
    return list(ray.get_gpu_ids())


@dataclasses.dataclass(frozen=True)
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
# Sample order.


def rank_order(
    n: int, *, seed: int, epoch: int, rank: int, world_size: int, batch_size: int,
    shuffle: bool, drop_last: bool,
) -> np.ndarray:
    """The sample indices ``rank`` reads in ``epoch`` (see the module docstring)."""
    perm = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    if drop_last:
        perm = perm[: (n // (world_size * batch_size)) * world_size * batch_size]
    return perm[rank::world_size]


def _order_factory(max_batches: int | None = None, **kwargs: Any) -> Any:
    """A ``TraversalOrder`` for FFCV's Loader.

    FFCV 1.0.2 accepts a custom order only as an *instance* that it then calls with the loader
    (``order(self)`` after ``isinstance(order, TraversalOrder)``), so the instance is a factory.
    """
    from ffcv.traversal_order.base import TraversalOrder

    class RankOrder(TraversalOrder):
        def __init__(self, loader: Any) -> None:
            super().__init__(loader)

        def sample_order(self, epoch: int) -> Sequence[int]:
            idx = np.asarray(self.indices)
            pick = rank_order(len(idx), epoch=epoch, **kwargs)
            if max_batches is not None:  # a capped epoch: the first batches of this order
                pick = pick[: max_batches * kwargs["batch_size"]]
            return idx[pick]

    class Factory(TraversalOrder):
        def __init__(self) -> None:  # built before the loader exists
            pass

        def __call__(self, loader: Any) -> TraversalOrder:
            return RankOrder(loader)

        def sample_order(self, epoch: int) -> Sequence[int]:
            raise NotImplementedError

    return Factory()


# ---------------------------------------------------------------------------------------------
# The loader.


@dataclasses.dataclass
class Batch:
    images: torch.Tensor  # [B, V, 3, H, W] float32, normalised
    labels: torch.Tensor  # [B] int64 (-1 = unlabelled)
    sample_ids: torch.Tensor  # [B] int64
    captions: torch.Tensor | None  # [B, E] float32 (L2-normalised) or None


def set_jit(enabled: bool) -> None:
    """Switch FFCV's numba compilation on or off (off: no 15–45 s compile, slow pipeline)."""
    from ffcv.pipeline.compiler import Compiler

    Compiler.set_enabled(enabled)


class ViewLoader:
    """FFCV loader for one split and one rank; see the module docstring.

    Args:
        path: the split's ``.beton`` file (``DatasetInfo.split_file``).
        batch_size: per-rank batch.
        views: augmented views per image (``train``) — evaluation always gives one.
        augment: crop / colour parameters.
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
            augmentation there) instead of FFCV's per-sample ops.
        stall_timeout: seconds to wait for one batch before failing (:func:`stall_timeout_s`).

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
    ) -> None:
        from ffcv.reader import Reader

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
                "components.data.reader.resolve_device picks it from a stage's resources)")
        self.stall_timeout = stall_timeout_s(stall_timeout)
        self.path = Path(path)
        self.train = train
        self.views = views if train else 1
        drop_last = train if drop_last is None else drop_last
        try:
            handlers = Reader(str(path)).handlers
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
        self.pipeline_ops = pipeline_ops(fields, augment=self.augment, train=train,
                                         views=self.views, device=self.device,
                                         batched_augment=batched,
                                         with_captions=self.has_captions)
        self._image_keys = [k for k in self.pipeline_ops if k.startswith("image")]
        pipelines: dict[str, Any] = {
            k: (ops if k == "image" or not k.startswith("image") else _spec("image", ops))
            for k, ops in self.pipeline_ops.items()
        }
        if "caption" in fields and not self.has_captions:
            pipelines["caption"] = None  # stored but not read
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches={max_batches} must be >= 1 or None")
        order = _order_factory(max_batches=max_batches, seed=seed, rank=rank,
                               world_size=world_size,
                               batch_size=batch_size, shuffle=train, drop_last=drop_last)
        self.loader = _seeded_loader_class()(
            str(path), batch_size=batch_size, num_workers=num_workers, order=order,
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
        self._gpu_aug = self._gpu_augment() if (batched and train) else None
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
        self._cpu_blur = self._blur_only() if (train and not batched and self.augment.blur_p > 0) \
            else None

    def _gpu_augment(self) -> torch.nn.Module:
        from components.data.augment import BatchedSimCLRAugment

        a = self.augment
        return BatchedSimCLRAugment(
            brightness=a.brightness, contrast=a.contrast, saturation=a.saturation, hue=a.hue,
            jitter_p=a.jitter_p, grayscale_p=a.grayscale_p, blur_p=a.blur_p,
            sigma=(a.blur_sigma[0], a.blur_sigma[1]),
        )

    def _blur_only(self) -> torch.nn.Module:
        from components.data.augment import BatchedSimCLRAugment

        a = self.augment
        return BatchedSimCLRAugment(jitter_p=0.0, grayscale_p=0.0, blur_p=a.blur_p,
                                    sigma=(a.blur_sigma[0], a.blur_sigma[1]))

    def set_epoch(self, epoch: int) -> None:
        """The next iteration reads ``epoch``'s order (resume: set the epoch, then iterate)."""
        self.loader.next_epoch = epoch

    @property
    def epoch(self) -> int:
        return int(self.loader.next_epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        epoch = iter(self.loader)  # FFCV's EpochIterator: a thread filling a queue
        try:
            yield from self._batches(epoch)
        finally:  # stopped early (close(), break): end the thread, or exit aborts the process
            epoch.close()
            # A stalled thread cannot be ended (it is stuck in the pipeline); it is a daemon.
            epoch.join(timeout=0 if epoch.stalled else 5)

    def _batches(self, epoch: Iterator[Any]) -> Iterator[Batch]:
        for out in epoch:
            got = dict(zip(self._names, out, strict=True))
            views = []
            for key in self._image_keys:
                x = got[key]  # [B, 3, H, W] uint8, a reused FFCV buffer
                if self._gpu_aug is not None:
                    x = self._gpu_aug(x)
                elif self._cpu_blur is not None:
                    x = self._cpu_blur(x)
                views.append((x.float() - self._mean) / self._std)  # a new tensor: safe to keep
            caps = got.get("caption") if self.has_captions else None
            yield Batch(
                images=torch.stack(views, dim=1),
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


def _seeded_loader_class() -> type:
    """FFCV ``Loader`` whose random augmentations are reproducible from (seed, rank, epoch,
    batch index): before each batch the pipeline thread seeds numpy's generator (ops run as
    Python with ``data.jit: false``) and numba's (compiled ops; one generator per thread).

    Exact with ``jit=False`` or one decoding thread. With JIT and several threads, numba's
    parallel workers draw from their own, unseeded generators: views then vary run to run.
    """
    import numba
    from ffcv.loader import Loader, epoch_iterator
    from ffcv.loader.epoch_iterator import QUASIRANDOM_ERROR_MSG, EpochIterator, select_buffer
    from ffcv.pipeline.compiler import Compiler
    from ffcv.traversal_order.quasi_random import QuasiRandom
    from ffcv.utils import chunks

    global _LOADER_CLASS
    if _LOADER_CLASS is not None:
        return _LOADER_CLASS

    @numba.njit(cache=False)
    def numba_seed(s: int) -> None:
        np.random.seed(s)

    _order_stages_by_id()

    class SeededEpochIterator(EpochIterator):
        """FFCV's iterator, seeded, and safe for its consumer: FFCV 1.0.2's thread dies
        silently on an exception and its ``__next__`` waits on the output queue without a
        timeout, so a failure or a stall in the pipeline hung the consumer forever. Here the
        thread hands its exception (with its traceback text) to the queue, and ``__next__``
        waits at most ``loader.stall_timeout`` seconds for each batch.

        **A CPU reader never calls into CUDA.** FFCV decides once, at import, whether to use
        CUDA (``IS_CUDA = torch.cuda.is_available()``), not per loader: on a machine with a GPU
        its iterator takes the current stream, makes a stream and an event per buffer slot and
        pins every host buffer (``pin_memory``) even for a CPU pipeline, and each of those
        creates a CUDA context (~0.5 GB) on GPU 0 — in a preprocess task, a CPU sweep trial
        or ``evaluate --device cpu``, on a GPU some other process was given. So CUDA is used
        only when FFCV saw a GPU *and* the reader's device is CUDA (``loader.thread_device``,
        set by :class:`ViewLoader` for ``cuda:N`` only): then FFCV's own ``__init__`` / ``run``
        / ``run_pipeline`` run unchanged. Otherwise the ``_host_*`` methods run: the same code
        without the CUDA branches, with unpinned buffers (pinning only speeds up host-to-GPU
        copies, which a CPU reader never makes). ``torch.cuda.is_available()`` itself, at
        FFCV's import, counts devices without opening a context."""

        def __init__(self, loader: Any, order: Any, epoch: int) -> None:
            self.epoch = epoch  # before the thread starts (the base __init__ starts it)
            self.failure: tuple[BaseException, str] | None = None
            self.stalled = False
            self.delivered = 0
            self.uses_cuda = bool(epoch_iterator.IS_CUDA
                                  and getattr(loader, "thread_device", None) is not None)
            if self.uses_cuda:
                super().__init__(loader, order)
            else:
                self._host_init(loader, order)

        def _host_init(self, loader: Any, order: Any) -> None:
            """FFCV's ``EpochIterator.__init__`` without its streams and pinned buffers."""
            threading.Thread.__init__(self, daemon=True)
            self.loader = loader
            self.order = order
            self.metadata = loader.reader.metadata
            self.current_batch_slot = 0
            batches = list(chunks(order, loader.batch_size))
            self.iter_ixes = iter(batches)
            self.closed = False
            self.output_queue: queue.Queue[Any] = queue.Queue(loader.batches_ahead)
            self.terminate_event = threading.Event()
            self.memory_context = loader.memory_manager.schedule_epoch(batches)
            try:
                self.memory_context.__enter__()
            except MemoryError:
                if loader.traversal_order != QuasiRandom:
                    print(QUASIRANDOM_ERROR_MSG)
                    print("Full error below:")
                raise
            self.storage_state = self.memory_context.state
            slots = loader.batches_ahead + 2
            self.cuda_streams = [None] * slots
            self.memory_allocations = _host_buffers(loader.graph, loader.batch_size, slots)
            self.start()

        def run(self) -> None:
            try:
                # The current CUDA device is per thread: without this, the streams, events and
                # copies of every local rank's pipeline thread would open a context on GPU 0.
                device = getattr(self.loader, "thread_device", None)
                if device is not None:
                    torch.cuda.set_device(device)
                if self.uses_cuda:
                    super().run()
                else:
                    self._host_run()
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, re-raised there
                self.failure = (e, "".join(traceback.format_exception(e)))
                self._hand_over(_FAILED)

        def _host_run(self) -> None:
            """FFCV's ``EpochIterator.run`` without the CUDA events that guard a slot."""
            slots = self.loader.batches_ahead + 2
            b_ix = 0
            Compiler.set_num_threads(self.loader.num_workers)
            try:
                while True:
                    ixes = next(self.iter_ixes)
                    slot = self.current_batch_slot
                    self.current_batch_slot = (slot + 1) % slots
                    result = self.run_pipeline(b_ix, ixes, slot, None)
                    while True:
                        try:
                            self.output_queue.put((slot, result), block=True, timeout=0.5)
                            break
                        except queue.Full:
                            pass
                        if self.terminate_event.is_set():
                            return
                    b_ix += 1
            except StopIteration:
                self.output_queue.put(None)

        def _host_pipeline(self, b_ix: int, batch_indices: Any, batch_slot: int) -> Any:
            """FFCV's ``EpochIterator.run_pipeline`` without its CUDA stream."""
            self.memory_context.start_batch(b_ix)
            code, outputs = self.loader.code
            n = len(batch_indices)
            allocations = self.memory_allocations
            args = {
                "batch_indices": batch_indices,
                "storage_state": self.storage_state,
                "metadata": self.metadata,
                **{f"memory_{k}": select_buffer(v, batch_slot, n)
                   for k, v in allocations["operation"].items()},
                **{f"shared_memory_{k}": select_buffer(v, batch_slot, n)
                   for k, v in allocations["shared"].items()},
            }
            for stage_code, define_outputs in code:
                results = stage_code(**args)
                for node_id, result in zip(define_outputs, results, strict=False):
                    args[f"result_{node_id}"] = result
            return tuple(args[f"result_{x}"] for x in outputs)

        def _hand_over(self, item: Any) -> None:
            """Put ``item`` in the output queue once the consumer makes room (or closes)."""
            while not self.terminate_event.is_set():
                try:
                    self.output_queue.put(item, timeout=0.5)
                    return
                except queue.Full:
                    pass

        def __next__(self) -> Any:
            path = getattr(self.loader, "split_file", "the split file")
            timeout = float(getattr(self.loader, "stall_timeout", STALL_TIMEOUT_S))
            deadline = time.monotonic() + timeout
            while True:
                try:
                    item = self.output_queue.get(timeout=min(1.0, timeout))
                    break
                except queue.Empty:
                    if not self.is_alive():  # it ended: whatever it put is in the queue now
                        try:
                            item = self.output_queue.get_nowait()
                        except queue.Empty:
                            item = _FAILED
                        break
                    if time.monotonic() >= deadline:
                        self.stalled = True
                        raise LoaderStalledError(
                            f"reading {path}: FFCV's loader thread produced no batch for "
                            f"{timeout:g} s (batch {self.delivered + 1} of this epoch); it is "
                            "stuck (a hung read of the file's storage, a deadlocked decoder). "
                            f"If the storage is only slow, raise {STALL_TIMEOUT_ENV} (seconds; "
                            f"now {timeout:g})") from None
            if item is _FAILED:
                self.close()
                if self.failure is None:
                    raise LoaderError(f"reading {path}: FFCV's loader thread ended without a "
                                      "batch or an error")
                e, text = self.failure
                raise LoaderError(
                    f"reading {path}: FFCV's loader thread failed: {type(e).__name__}: {e}\n"
                    f"the thread's traceback:\n{text}") from e
            if item is None:  # the epoch's end (the base __next__'s)
                self.close()
                raise StopIteration
            slot, result = item
            if self.uses_cuda:  # wait for the slot's copy (the base __next__'s)
                self.current_stream.wait_stream(self.cuda_streams[slot])
            self.delivered += 1
            return result

        def run_pipeline(self, b_ix: int, *args: Any) -> Any:
            seed, rank = self.loader.aug_seed
            # Two seeds: compiled ops draw from numba's generator, Python ops (data.jit off)
            # from numpy's, and both are the same Mersenne Twister; one seed would hand a
            # pipeline that mixes the two kinds the same stream twice.
            s_np, s_nb = np.random.SeedSequence([seed, rank, self.epoch, b_ix]).generate_state(2)
            np.random.seed(int(s_np))
            numba_seed(int(s_nb))
            if self.uses_cuda:
                return super().run_pipeline(b_ix, *args)
            return self._host_pipeline(b_ix, *args[:2])

    class SeededLoader(Loader):
        iterator_class = SeededEpochIterator  # (tests patch its pipeline)

        def __iter__(self) -> Any:  # Loader.__iter__, with the seeded iterator
            Compiler.set_num_threads(self.num_workers)
            epoch = self.next_epoch
            order = self.next_traversal_order()
            selected = order[: len(self) * self.batch_size]
            self.next_epoch += 1
            if self.code is None or self.recompile:
                self.generate_code()
            return self.iterator_class(self, selected, epoch)

    _LOADER_CLASS = SeededLoader
    return SeededLoader


_LOADER_CLASS: type | None = None
_FAILED = object()  # what a failed loader thread puts in its output queue


def _host_buffers(graph: Any, batch_size: int, slots: int) -> dict[str, dict[int, Any]]:
    """FFCV's ``Graph.allocate_memory`` (``batches_ahead`` = ``slots``) without pinning: the
    same buffers (a list of ``slots`` tensors for a torch dtype, one ``[slots, batch, ...]``
    array for a numpy dtype) in pageable memory, since ``pin_memory`` opens a CUDA context on
    a GPU machine (:func:`_seeded_loader_class`). A buffer an op declares on a device is
    allocated there, as FFCV does."""
    from ffcv.pipeline.allocation_query import AllocationQuery

    def allocate(q: AllocationQuery) -> Any:
        shape = (batch_size, *q.shape)
        if isinstance(q.dtype, torch.dtype):
            return [torch.empty(*shape, dtype=q.dtype, device=q.device) for _ in range(slots)]
        dtype = torch.from_numpy(np.empty(0, dtype=q.dtype)).dtype
        return torch.empty(slots, *shape, dtype=dtype).numpy()

    requirements, _ = graph.collect_requirements()
    out: dict[str, dict[int, Any]] = collections.defaultdict(dict)  # as FFCV's: "shared" may lack
    for kind, queries in requirements.items():
        for node_id, q in queries.items():
            buffer: Any = None
            if isinstance(q, AllocationQuery):
                buffer = allocate(q)
            elif isinstance(q, Sequence):
                buffer = tuple(allocate(x) for x in q)
            out[kind][node_id] = buffer
    return out


def _order_stages_by_id() -> None:
    """Make FFCV's stage order deterministic.

    FFCV 1.0.2 groups pipeline operations into stages by popping from ``set``s of nodes, so the
    order in which, e.g., view 0's and view 1's crops run (and draw random numbers) depends on
    object addresses and differs between Loaders. This replaces ``Graph.group_operations``
    with the same grouping (alternating jitted / non-jitted stages, a node joins the first
    stage of its kind after its parents), visiting nodes in creation order (their ids).
    """
    from ffcv.pipeline.graph import Graph

    if getattr(Graph, "_simgraph_ordered", False):
        return

    def group_operations(self: Any) -> list[list[int]]:
        ident = self.node_to_id
        front = sorted(self.root_nodes.keys(), key=lambda n: ident[n])
        stages: list[list[int]] = []
        while front:
            jitted = len(stages) % 2 == 0
            stage: list[int] = []
            later: list[Any] = []
            queue = list(front)
            seen = set()
            while queue:
                node = queue.pop(0)
                if ident[node] in seen:
                    continue
                seen.add(ident[node])
                if node.is_jitted == jitted or node.is_jitted is None:
                    stage.append(ident[node])
                    queue.extend(sorted(self.adjacency_list[node], key=lambda n: ident[n]))
                else:
                    later.append(node)
            stages.append(stage)
            front = sorted({ident[n]: n for n in later}.values(), key=lambda n: ident[n])
        return stages

    Graph.group_operations = group_operations
    Graph._simgraph_ordered = True


def pipeline_ops(
    fields: Sequence[str], *, augment: AugmentConfig, train: bool, views: int,
    device: torch.device, batched_augment: bool, with_captions: bool,
) -> dict[str, list[Any]]:
    """The FFCV operations of every output, decoder first: ``label``, ``sample_id``,
    ``caption`` (when read), ``image`` and ``image_1`` … ``image_{V-1}`` (extra views of the
    stored ``image`` field). Built without a Loader, so tests can check what each op declares.

    For a CUDA ``device`` every output ends on the device: ``ToDevice`` copies the batch, and
    every op after it allocates there. ``ToTorchImage`` comes after ``ToDevice`` as a view
    (``channels_last=True``: ``[B, 3, H, W]`` over the copied ``[B, H, W, 3]`` buffer). With
    ``channels_last=False`` it would declare a buffer of no device, i.e. pinned *host* memory,
    and copy the CUDA batch back into it. On CPU the plain ``[B, 3, H, W]`` layout is kept.
    """
    from ffcv.fields.decoders import IntDecoder, NDArrayDecoder
    from ffcv.transforms import Squeeze, ToDevice, ToTensor, ToTorchImage

    on_gpu = device.type == "cuda"
    to_dev = [ToDevice(device, non_blocking=True)] if on_gpu else []
    # [B, 1] -> [B]: only the per-sample dim. A bare Squeeze() also dropped B when a batch held
    # one image (0-d labels broke torch.cat in feature extraction, and ToDevice's copy).
    out: dict[str, list[Any]] = {
        "label": [IntDecoder(), ToTensor(), Squeeze(1), *to_dev],
        "sample_id": [IntDecoder(), ToTensor(), Squeeze(1), *to_dev],
    }
    if with_captions and "caption" in fields:
        out["caption"] = [NDArrayDecoder(), ToTensor(), *to_dev]
    n = views if train else 1
    for key in ["image"] + [f"image_{v}" for v in range(1, n)]:
        out[key] = [*_image_ops(augment, train, batched_augment), ToTensor(), *to_dev,
                    ToTorchImage(channels_last=on_gpu)]
    return out


def _image_ops(a: AugmentConfig, train: bool, batched: bool) -> list[Any]:
    """Decoder (crop) and the per-sample ops FFCV runs; ``batched``: colour ops are left to
    the batched torch ops after the loader."""
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.transforms import RandomHorizontalFlip

    from components.data.augment.resize import BilinearCenterCrop, BilinearRandomResizedCrop

    size = (a.resolution, a.resolution)
    bilinear = a.interpolation == "bilinear"
    if not train:
        centre = BilinearCenterCrop if bilinear else CenterCropRGBImageDecoder
        return [centre(size, ratio=a.eval_crop_ratio)]
    crop = BilinearRandomResizedCrop if bilinear else RandomResizedCropRGBImageDecoder
    ops: list[Any] = [crop(size, scale=tuple(a.scale), ratio=tuple(a.ratio))]
    if a.flip_p > 0:
        ops.append(RandomHorizontalFlip(flip_prob=a.flip_p))
    if batched or max(a.jitter_p, a.grayscale_p) == 0:
        return ops
    from components.data.augment import RandomColorJitter, RandomGrayscale

    if a.jitter_p > 0:
        ops.append(RandomColorJitter(brightness=a.brightness, contrast=a.contrast,
                                     saturation=a.saturation, hue=a.hue, p=a.jitter_p))
    if a.grayscale_p > 0:
        ops.append(RandomGrayscale(p=a.grayscale_p))
    # Blur runs as a batched torch op after the loader (see _cpu_blur): a numba blur inside
    # the compiled pipeline stalled FFCV's worker threads at 8 px, so there is none.
    return ops


def _spec(field: str, ops: list[Any]) -> Any:
    from ffcv.pipeline import PipelineSpec

    return PipelineSpec(field, decoder=ops[0], transforms=ops[1:])
