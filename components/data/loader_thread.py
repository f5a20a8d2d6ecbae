"""FFCV's ``Loader`` as the reader runs it: seeded augmentations, no hang, no CUDA on CPU.

FFCV's loader thread fills a queue the consumer waits on. An exception in that thread is
re-raised in the consumer (:class:`~components.data.reader_errors.LoaderError`, with the
thread's traceback text); a thread that produces nothing for ``stall_timeout`` seconds (default
:data:`STALL_TIMEOUT_S`, or ``$SIMGRAPH_LOADER_TIMEOUT_S``) fails the consumer
(:class:`~components.data.reader_errors.LoaderStalledError`), naming the split file. FFCV
1.0.2's own iterator waits forever.

Owns: the decoding threads a loader may have here (:func:`decode_threads`), the stall
timeout (:func:`stall_timeout_s`), the seeded ``Loader`` class and its epoch
iterator (:func:`seeded_loader_class`: a copy of FFCV's ``EpochIterator`` without CUDA for a
CPU reader), its unpinned host buffers (:func:`_host_buffers`) and FFCV's stage order made
deterministic (:func:`_order_stages_by_id`).
"""

from __future__ import annotations

import collections
import math
import os
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from components.data.reader_errors import LoaderError, LoaderStalledError, ReaderSettingError

STALL_TIMEOUT_S = 300.0  # default: generous (a first batch includes numba compiling, 15-45 s)
STALL_TIMEOUT_ENV = "SIMGRAPH_LOADER_TIMEOUT_S"


_CAPPED: set[tuple[int, int]] = set()  # (asked, allowed) already said in this process


def decode_threads(asked: int) -> int:
    """The FFCV decoding threads a loader gets for ``data.num_workers=asked``: at most numba's
    thread limit here (``NUMBA_NUM_THREADS``, this machine's CPUs), which FFCV's ``Loader``
    otherwise fails on with numba's traceback — in training, and in ``evaluate`` / ``embed``
    of a run trained on a bigger machine, whose config cannot be changed. Decoding threads
    change the speed only, never a batch. Said once per process on stderr when capped."""
    import sys

    import numba

    allowed = max(1, int(numba.config.NUMBA_NUM_THREADS))
    if asked <= allowed:
        return asked
    if (asked, allowed) not in _CAPPED:
        _CAPPED.add((asked, allowed))
        print(f"simgraph: data.num_workers={asked} is more than the {allowed} decoding threads "
              f"this machine allows (numba's limit: its CPUs); using {allowed}",
              file=sys.stderr, flush=True)
    return allowed


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


def seeded_loader_class() -> type:
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
    a GPU machine (:func:`seeded_loader_class`). A buffer an op declares on a device is
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
