"""The one formulation every objective shares (docs/design.md, "Objectives: one
formulation").

An objective scores **anchors** (this rank's batch, all views) against **candidates** (every
rank's batch gathered with autograd, then optionally a memory bank). Logits are
``s_ij = cos(z_i, c_j) / tau`` in float32 (even under autocast), with each anchor's own column
masked. A loss is then a *target graph* over candidates (``targets.py``) and a *reducer*
below; anchors and candidates are never assumed to be the same set, so no function here
assumes a square or symmetric logit matrix.

Layout: a batch ``z`` of shape [B, V, D] is flattened sample-major (row ``b·V + v``);
gathered candidates are rank 0's rows, then rank 1's, …, then the bank's.

Memory: for A anchors and M candidates the reducers hold the logits plus one or two further
A×M float32 buffers (listed per function), and the graph (an A×M bool or float32 matrix,
or for SimCLR / SupCon only the positive pairs: :class:`PositivePairs`; below
:data:`DENSE_GRAPH_ENTRIES` entries, where a few A×M buffers are at most a few MiB, their
0/1 float mask: :class:`PositiveMask`, :func:`hard_graph_loss`).
Every loss here is row-wise — anchor i's loss needs only row i of the logits and the graph —
so large batches run in row chunks (:func:`chunked_rows`): each chunk's A_c×M buffers exist
only while it is computed, and again in backward (recomputed, ``torch.utils.checkpoint``),
so the peak is one chunk's, not A×M. Chunking is automatic above :data:`LOGIT_BUDGET_BYTES`
of logits; the values and gradients are those of the unchunked computation.

Host synchronisation: every device-to-host read (``.item()``, ``bool(t)``, ``.tolist()``)
makes the host wait for the device. Every objective's step reads once: the global loss
statistics (:func:`fused_global_means`), which also carry the batch's input checks (finite
values, labels ≥ 0) when the batch was built inside :func:`hot_path` (training's step), and
the objective's own input checks (:class:`DeferredCheck`: labels < C, labels inside a class
graph); outside :func:`hot_path` a :class:`ContrastiveBatch` checks itself when built (one
read). Until the read, inputs that would index out of bounds are clamped (a failed check
still raises, after the read, before anything is stored). Inside
:func:`hot_path` every rank's batch may also be declared equally large, so the gathers skip
their size exchange (:attr:`ContrastiveBatch.rank_sizes`); otherwise the sizes are exchanged
once per step, not once per gather.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from components import checks
from components.errors import NonFiniteError
from components.objectives.memory import MemoryBank
from components.runtime import distributed

Metrics = dict[str, float]

# Logits of one chunk at most (float32): 128 MiB is 1,024 rows at M = 32,768 candidates. With
# the graph and the reducer's buffers a chunk needs a few times this.
LOGIT_BUDGET_BYTES = 128 << 20

# Hard graphs (SimCLR's, SupCon's) of at most this many anchor × candidate entries are built
# as A×M masks and reduced in one fused function (:func:`hard_graph_loss`): a few
# whole-matrix kernels, fewer than the positive pairs' sort, searches and index passes, which
# cost more than they save on small matrices. Above it, positive pairs (O(#positives) work
# beyond the logits, no mask). Per objective (:attr:`BatchContrastive.dense_graph_entries`):
# SimCLR's sparse path pays for V − 1 positives per anchor, SupCon's for ~M / classes, so
# SupCon's crossover is higher. Measured with ``bench/objectives_small.py`` (2 threads, 10
# classes: masks win up to 2B = 384 for SimCLR, up to 768 for SupCon, which switches at
# 512: with 100 classes pairs win there; docs/benchmarks.md).
DENSE_GRAPH_ENTRIES = 3 << 16
# On an accelerator the sparse path's data-shaped operations (``repeat_interleave`` of the
# per-anchor pair counts, ``bincount``, ``nonzero``) are host synchronisations: the H100 run
# (docs/gpu.md) measured 7.8 a step with SupCon at 2B = 1024, two of them per step from this
# path. There masks are used up to as many entries as one chunk of logits holds
# (:data:`LOGIT_BUDGET_BYTES` of float32), where their buffers (~2.3 × A·M float32 kept for
# backward) are a few hundred MiB at most; beyond it, chunked rows as before.
ACCELERATOR_DENSE_GRAPH_ENTRIES = LOGIT_BUDGET_BYTES // 4
# Set by tests/test_sync_audit.py to audit, on the CPU, the paths an accelerator takes.
AUDIT_ACCELERATOR_PATHS = False


def accelerator_paths(device: torch.device) -> bool:
    """Whether the host-sync-free variants are taken: on every device but the CPU."""
    return device.type != "cpu" or AUDIT_ACCELERATOR_PATHS


def dense_graph_limit(objective: object, device: torch.device) -> int:
    """The most A×M entries for which ``objective``'s hard graphs are masks on ``device``: its
    ``dense_graph_entries`` (tuned for CPU time) on the CPU, at least
    :data:`ACCELERATOR_DENSE_GRAPH_ENTRIES` elsewhere (no host sync; module docstring)."""
    own = int(getattr(objective, "dense_graph_entries", DENSE_GRAPH_ENTRIES))
    return max(own, ACCELERATOR_DENSE_GRAPH_ENTRIES) if accelerator_paths(device) else own


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _raise_non_finite(name: str, x: Tensor) -> None:
    """Count ``x``'s non-finite values (a second read, on the failure path only) and raise."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:  # a sum (or min/max in a narrower dtype) can overflow although x is finite
        raise NonFiniteError(f"{name} has {bad} non-finite value(s) (NaN or inf); fix the "
                             "model/input")


# The float fields a batch checks for NaN / inf, in the order the errors are reported.
_FLOAT_FIELDS = ("z", "captions", "logits", "ema_z", "ema_logits")


@dataclasses.dataclass(frozen=True)
class _StepHints:
    defer_checks: bool = False
    equal_batches: bool = False


_HINTS: contextvars.ContextVar[_StepHints | None] = contextvars.ContextVar(
    "simgraph_step_hints", default=None)  # None: outside hot_path
_HOT = {eq: _StepHints(defer_checks=True, equal_batches=eq) for eq in (False, True)}


class hot_path(contextlib.AbstractContextManager[None]):  # noqa: N801 (used as a function)
    """``with hot_path(equal_batches=False):`` the training step's context: inside it a
    :class:`ContrastiveBatch` defers its input checks into the objective's one device-to-host
    read (the loss statistics, read anyway) instead of reading them back itself, and with
    ``equal_batches`` it records every rank's batch as this rank's size
    (:attr:`ContrastiveBatch.rank_sizes`), so gathers exchange no sizes. Declare
    ``equal_batches`` only when every rank's batch has the same number of samples (the
    training loader's ``drop_last``): gathers with wrong sizes fail or hang.

    A batch built here must reach an objective: its checks run there (and raise there).

    (A class, not a ``contextlib.contextmanager`` generator: it is entered every step, where
    the generator's machinery costs as much as a few of a small batch's kernels.)
    """

    __slots__ = ("_hints", "_token")

    def __init__(self, equal_batches: bool = False) -> None:
        self._hints = _HOT[bool(equal_batches)]

    def __enter__(self) -> None:
        self._token = _HINTS.set(self._hints)

    def __exit__(self, *exc: object) -> None:
        _HINTS.reset(self._token)


class _PendingChecks(NamedTuple):
    """A batch's input checks, computed on the device, not yet read: ``values`` holds the sum
    of each field in ``names`` (NaN / ±inf propagate into it), then the smallest label if
    ``labels``."""

    names: tuple[str, ...]
    labels: bool
    values: Tensor  # [len(names) + labels] in the fields' float type, on z's device


@dataclasses.dataclass
class ContrastiveBatch:
    """What every objective receives: this rank's part of the batch.

    Attributes:
        z: [B, V, D] projector outputs for V ≥ 1 views of B samples (any float dtype; they are
            L2-normalised in float32 inside the objective).
        labels: [B] int64 class ids ≥ 0, for supervised losses.
        sample_ids: [B] int64 dataset-wide sample ids. Needed to recognise the same image in a
            memory bank; without them the batch position is used and bank rows never match.
        captions: [B, E] caption embeddings (X-CLR per-sample graph, CLIP).
        logits: [B, V, C] classifier logits of the online model (CoNe, CE).
        ema_z: [B, V, D] EMA-encoder projector outputs ("keys"): fill the memory bank.
        ema_logits: [B, V, C] EMA classifier logits (CoNe's Q_p).
        rank_sizes: (not an argument) every rank's B in rank order when known, so the
            gathers skip their size exchange: ``(B,) × W`` for a batch built inside
            ``hot_path(equal_batches=True)``, else None.

    Values are checked (labels ≥ 0, finite floats) with one device read when the batch is
    built, or, inside :func:`hot_path`, in the objective's one read of its loss statistics
    (:meth:`check` reads them now).

    Raises:
        ValueError: wrong ranks/shapes/dtypes, mismatched B or V, negative labels;
            NonFiniteError (a ValueError): non-finite values.
    """

    z: Tensor
    labels: Tensor | None = None
    sample_ids: Tensor | None = None
    captions: Tensor | None = None
    logits: Tensor | None = None
    ema_z: Tensor | None = None
    ema_logits: Tensor | None = None
    rank_sizes: tuple[int, ...] | None = dataclasses.field(default=None, init=False)
    _pending: _PendingChecks | None = dataclasses.field(default=None, init=False, repr=False,
                                                        compare=False)

    def __post_init__(self) -> None:
        z = self.z
        _check(isinstance(z, Tensor), f"z must be a torch.Tensor, got {type(z).__name__}")
        _check(
            z.ndim == 3 and z.is_floating_point(),
            f"z must be a float tensor [batch, views, dim], got {z.dtype} {tuple(z.shape)}",
        )
        b, v, _ = z.shape
        for name in ("labels", "sample_ids"):
            t = getattr(self, name)
            if t is not None:
                _check(
                    t.shape == (b,) and not t.is_floating_point() and t.dtype != torch.bool,
                    f"{name} must be an integer tensor of shape [{b}], "
                    f"got {t.dtype} {tuple(t.shape)}",
                )
        if self.captions is not None:
            c = self.captions
            _check(
                c.ndim == 2 and c.shape[0] == b and c.is_floating_point(),
                f"captions must be a float tensor [{b}, E], got {c.dtype} {tuple(c.shape)}",
            )
        if self.ema_z is not None:
            _check(
                self.ema_z.shape == z.shape,
                f"ema_z must match z's shape {tuple(z.shape)}, got {tuple(self.ema_z.shape)}",
            )
        for name in ("logits", "ema_logits"):
            t = getattr(self, name)
            if t is not None:
                _check(
                    t.ndim == 3 and t.shape[:2] == (b, v) and t.is_floating_point(),
                    f"{name} must be a float tensor [{b}, {v}, classes], got {tuple(t.shape)}",
                )
        if self.logits is not None and self.ema_logits is not None:
            _check(
                self.logits.shape == self.ema_logits.shape,
                f"ema_logits {tuple(self.ema_logits.shape)} must match logits "
                f"{tuple(self.logits.shape)}",
            )
        hints = _HINTS.get() or _StepHints()
        if hints.equal_batches:
            self.rank_sizes = (b,) * distributed.world_size()
        self._pending = self._device_checks()
        if not hints.defer_checks:
            self.check()

    @property
    def views(self) -> int:
        return self.z.shape[1]

    def _device_checks(self) -> _PendingChecks | None:
        """Each float field's sum and the smallest label in one vector on the device (a few
        small kernels; nothing is read back here). A sum is NaN or ±inf if any value is (it
        can also overflow with finite values: the failure path counts, and raises only for
        real NaN / inf)."""
        names = tuple(n for n in _FLOAT_FIELDS if (t := getattr(self, n)) is not None
                      and t.is_floating_point() and t.numel())
        # 0-dim each; float16 summed in float32: a sum of finite halves cannot overflow, so a
        # non-finite sum means a NaN / inf in the field (what fused_global_means tells every
        # rank, which must all decide alike)
        parts = [t.sum(dtype=torch.float32) if (t := getattr(self, n).detach()).dtype
                 == torch.float16 else t.sum() for n in names]
        labels = self.labels is not None and self.labels.numel() > 0
        if labels:
            assert self.labels is not None
            least = self.labels.min()  # its sign survives any float type stack promotes to
            parts.append(least if least.device == self.z.device else least.to(self.z.device))
        # one stack, in the fields' promoted float type (read later as Python floats)
        return _PendingChecks(names, labels, torch.stack(parts)) if parts else None

    def take_checks(self) -> _PendingChecks | None:
        """The input checks not yet read (None if there are none), handed over: the caller
        reads ``values`` with its own device read and passes them to :meth:`raise_failed`."""
        pending, self._pending = self._pending, None
        return pending

    def raise_failed(self, checks: _PendingChecks, values: Sequence[float]) -> None:
        """Raise for the first failed check, given ``checks.values`` read back as floats.

        Raises:
            ValueError: a label < 0. NonFiniteError: a field holds NaN or inf (the message
                counts them, which reads that field once more).
        """
        if checks.labels and not values[-1] >= 0:
            raise ValueError("labels must be >= 0 class ids")
        for name, total in zip(checks.names, values, strict=False):  # labels' last, if any
            if not math.isfinite(total):
                _raise_non_finite(name, getattr(self, name))

    def check(self) -> None:
        """Read and apply the input checks still pending (one device read; none if none).

        Raises:
            as :meth:`raise_failed`.
        """
        pending = self.take_checks()
        if pending is not None:
            self.raise_failed(pending, pending.values.tolist())

    def sizes_per_rank(self) -> list[int]:
        """Every rank's B in rank order: :attr:`rank_sizes`, or exchanged now (one all-gather
        and device read when distributed; ``[B]`` for free otherwise)."""
        if self.rank_sizes is not None:
            return list(self.rank_sizes)
        return distributed.gathered_sizes(self.z.shape[0], self.z.device)


def at_least_fp32(x: Tensor) -> Tensor:
    """fp16/bf16 upcast to float32 (losses never run in half precision); float64 kept."""
    if x.dtype in (torch.float32, torch.float64):  # the common case, without a dispatch
        return x
    return x.to(torch.promote_types(x.dtype, torch.float32))


def unit(x: Tensor) -> Tensor:
    """Rows L2-normalised in at least float32.

    ``F.normalize(x, dim=-1)``'s operations (vector norm, clamp at 1e-12, divide) without its
    Python layers (``torch.norm``'s argument handling): the same kernels, the same values and
    gradients, a few microseconds less per call."""
    x = at_least_fp32(x)
    return x / torch.linalg.vector_norm(x, 2, -1, keepdim=True).clamp_min(1e-12)


@dataclasses.dataclass
class Pairs:
    """Anchors (this rank) against candidates (all ranks, then the bank), with their metadata.

    ``anchors`` [A, D] and ``candidates`` [M, D] are unit float32 rows; ``self_index`` [A] is
    each anchor's own column in the candidates; ``*_ids`` / ``*_labels`` are [A] / [M] int64
    (-1 where unknown); ``*_captions`` [A, E] / [M, E] or None.
    """

    anchors: Tensor
    candidates: Tensor
    self_index: Tensor
    anchor_ids: Tensor
    candidate_ids: Tensor
    anchor_labels: Tensor | None = None
    candidate_labels: Tensor | None = None
    anchor_captions: Tensor | None = None
    candidate_captions: Tensor | None = None
    views: int = 1  # V: batch candidates are [N·V] rows, sample-major
    # Hard graphs as [A, M] masks (small matrices) rather than positive pairs: decided once
    # per step for all of A × M (:data:`DENSE_GRAPH_ENTRIES`), so row chunks agree.
    dense_graphs: bool = False

    def rows(self, start: int, stop: int, anchors: Tensor | None = None,
             candidates: Tensor | None = None) -> Pairs:
        """The anchors ``start:stop`` against every candidate (``anchors`` / ``candidates``
        replace the tensors, e.g. by checkpoint's own inputs)."""

        def part(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[start:stop]

        return dataclasses.replace(
            self,
            anchors=self.anchors[start:stop] if anchors is None else anchors,
            candidates=self.candidates if candidates is None else candidates,
            self_index=self.self_index[start:stop], anchor_ids=self.anchor_ids[start:stop],
            anchor_labels=part(self.anchor_labels), anchor_captions=part(self.anchor_captions),
        )

    def self_mask(self) -> Tensor:
        """[A, M] bool, True at each anchor's own column."""
        mask = torch.zeros(
            self.anchors.shape[0],
            self.candidates.shape[0],
            dtype=torch.bool,
            device=self.anchors.device,
        )
        return mask.scatter_(1, self.self_index[:, None], True)


class PositivePairs(NamedTuple):
    """A hard graph as its True entries: ``rows`` [P] and ``cols`` [P] int64, row-major (the
    order ``mask.nonzero()`` lists them in), for reducers that only read the positives. Built
    without an A×M mask (:func:`components.objectives.targets.label_pairs`)."""

    rows: Tensor
    cols: Tensor


class PositiveMask(NamedTuple):
    """A hard graph as a 0/1 float mask ``mask`` [A, M] (the logits' dtype; 0 on each own
    column) and its row sums ``counts`` [A] (|P(i)|), for reducers that run on whole matrices:
    small batches (:data:`DENSE_GRAPH_ENTRIES`). Built by one compare
    (:func:`components.objectives.targets.label_positives`)."""

    mask: Tensor
    counts: Tensor

    def pairs(self) -> PositivePairs:
        """The same graph as :class:`PositivePairs` (one ``nonzero`` scan)."""
        return PositivePairs(*self.mask.nonzero(as_tuple=True))


@functools.lru_cache(maxsize=64)
def _row_numbers(n: int, views: int, device: torch.device) -> Tensor:
    """[n·views] int64 ``r // views`` (0, …, 0, 1, …: each of n rows once per view), cached
    per (n, views, device): every step of a run asks for the same few, and making them is
    a few kernel launches each time. Shared: read it, never write to it.

    Made outside inference mode (an inference tensor could not be saved for backward by
    a later step's autograd)."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.arange(n, device=device).repeat_interleave(views)


def pair_up(batch: ContrastiveBatch, bank: MemoryBank | None = None,
            sizes: Sequence[int] | None = None) -> Pairs:
    """Gather candidates from every rank (with autograd) and append the bank's rows.

    ``sizes``: every rank's B (default :meth:`ContrastiveBatch.sizes_per_rank`), shared by
    all the gathers here, so they exchange no sizes.
    """
    b, v, _ = batch.z.shape
    device = batch.z.device
    sizes = batch.sizes_per_rank() if sizes is None else list(sizes)
    offset = distributed.row_offset(b, device, sizes=sizes)
    anchors = unit(batch.z).flatten(0, 1)  # [B·V, D], row b·V + v
    candidates = distributed.gather(anchors, sizes=[n * v for n in sizes])  # [N·V, D]
    self_index = _row_numbers(b * v, 1, device)  # [B·V] this rank's rows: 0, 1, …
    if offset:
        self_index = self_index + offset * v

    def per_view(t: Tensor) -> Tensor:  # [B, ...] -> [B·V, ...]
        return t.repeat_interleave(v, dim=0)

    def as_index(t: Tensor) -> Tensor:  # int64 on z's device (no dispatch when it is)
        return t if t.dtype == torch.int64 and t.device == device else t.to(device, torch.int64)

    ids = batch.sample_ids
    dist = distributed.is_distributed()
    if not dist:  # no collective: expand ids and labels directly (no [B, 2] stack)
        if ids is None:  # batch positions (cached): unique, meaningless across steps
            anchor_ids = _row_numbers(b, v, device)
        else:
            anchor_ids = per_view(as_index(ids))
        anchor_labels = None if batch.labels is None else per_view(as_index(batch.labels))
        candidate_ids, candidate_labels = anchor_ids, anchor_labels  # the gather = this batch
    else:
        if ids is None:  # batch positions: unique across ranks, meaningless across steps
            ids = offset + torch.arange(b, device=device)
        labels = batch.labels if batch.labels is not None else torch.full_like(ids, -1)
        # Per-sample metadata travels once (not once per view), in one collective.
        meta = torch.stack([ids.to(device).long(), labels.to(device).long()], dim=1)  # [B, 2]
        anchor_ids, anchor_labels = per_view(meta).T.contiguous()  # [B·V] each
        all_meta = distributed.gather(meta, grad=False, sizes=sizes)  # [N, 2]
        candidate_ids, candidate_labels = per_view(all_meta).T.contiguous()  # [N·V] each
    pairs = Pairs(
        anchors=anchors,
        candidates=candidates,
        self_index=self_index,
        anchor_ids=anchor_ids,
        candidate_ids=candidate_ids,
        views=v,
    )
    if batch.labels is not None:
        pairs.anchor_labels = anchor_labels
        pairs.candidate_labels = candidate_labels
    if batch.captions is not None:
        captions = unit(batch.captions)  # [B, E]
        pairs.anchor_captions = per_view(captions)
        pairs.candidate_captions = per_view(distributed.gather(captions, grad=False,
                                                               sizes=sizes))

    if bank is not None and len(bank):
        rows = bank.valid()
        pairs.candidates = torch.cat([pairs.candidates, rows["features"].to(anchors.dtype)])
        pairs.candidate_ids = torch.cat([pairs.candidate_ids, rows["ids"]])
        if pairs.candidate_labels is not None:
            pairs.candidate_labels = torch.cat([pairs.candidate_labels, rows["labels"]])
        if pairs.candidate_captions is not None and bank.captions.shape[1]:
            pairs.candidate_captions = torch.cat(
                [pairs.candidate_captions, unit(rows["captions"]).to(anchors.dtype)]
            )
        else:  # a bank without captions: no caption graph over these candidates
            pairs.candidate_captions = None
    return pairs


def chunk_rows(rows: int, columns: int, budget_bytes: int = LOGIT_BUDGET_BYTES) -> int:
    """Rows per chunk so that one chunk's float32 logits fit ``budget_bytes``; ``rows`` (one
    chunk) when the whole matrix fits."""
    per_row = 4 * max(columns, 1)
    return rows if rows * per_row <= budget_bytes else max(1, budget_bytes // per_row)


def chunked_rows(fn: Callable[..., tuple[Tensor, ...]], row_inputs: Sequence[Tensor],
                 shared: Sequence[Tensor], rows: int) -> tuple[Tensor, ...]:
    """``fn(start, stop, *row_slices, *shared)`` over row chunks of ``rows``, concatenated.

    ``fn`` returns per-row tensors ([stop − start, ...] each) computed from row slices
    ``start:stop`` of ``row_inputs`` and all of ``shared``. With more than one chunk, each runs
    under ``torch.utils.checkpoint`` (non-reentrant): its intermediate buffers are freed after
    the forward and recomputed in backward, so the peak is one chunk's. The results and their
    gradients are those of one ``fn(0, n, ...)`` call: rows are independent.
    """
    n = row_inputs[0].shape[0]
    if rows >= n:
        return fn(0, n, *row_inputs, *shared)
    parts = []
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        parts.append(checkpoint(fn, start, stop, *(t[start:stop] for t in row_inputs),
                                *shared, use_reentrant=False))
    return tuple(torch.cat(col) for col in zip(*parts, strict=True))


def scaled_similarity(anchors: Tensor, candidates: Tensor, tau: float) -> Tensor:
    """``anchors @ candidatesᵀ / tau`` [A, M] with 1/τ applied inside the matrix product (the
    GEMM's alpha): no pass over the product or the rows for the divide, forward or backward
    (rounding differs from dividing afterwards in the last bit)."""
    return torch.addmm(anchors.new_zeros(()), anchors, candidates.T, beta=0, alpha=1 / tau)


def masked_logits(pairs: Pairs, tau: float) -> Tensor:
    """``s_ij = cos(a_i, c_j) / tau`` [A, M] float32, each anchor's own column at finfo.min."""
    # The mask in place: the matmul's backward needs its inputs, not this output.
    logits = scaled_similarity(pairs.anchors, pairs.candidates, tau)
    return logits.scatter_(1, pairs.self_index[:, None], torch.finfo(logits.dtype).min)


def graph_cross_entropy(logits: Tensor, weights: Tensor | PositivePairs) -> tuple[Tensor, Tensor]:
    """``H(t_i, softmax(s_i))`` with ``t_i = w_i / Σ_j w_ij`` — SimCLR, SupCon L_out, X-CLR.

    Since Σ_j t_ij = 1, ``H = logsumexp_j s_ij − Σ_j t_ij s_ij``: no log-softmax matrix is built.

    Args:
        logits: [A, M] masked logits (:func:`masked_logits`; the own column is excluded).
        weights: [A, M] non-negative graph weights (bool or float), 0 on the own column; or a
            hard graph's :class:`PositivePairs` (the same loss, without the A×M mask).

    Returns:
        per-anchor loss [A] and validity [A] (anchors with Σ_j w_ij > 0).

    A hard graph as :class:`PositivePairs` (or a bool mask, turned into them) is reduced
    sparsely (O(#positives) beyond the log-sum-exp); small batches' hard graphs take
    :func:`hard_graph_loss`'s fused path instead.
    """
    if isinstance(weights, PositivePairs) or weights.dtype == torch.bool:
        # hard graph: the positive logits summed sparsely, in one fused function
        pairs = weights if isinstance(weights, PositivePairs) else PositivePairs(
            *weights.nonzero(as_tuple=True))
        count = torch.bincount(pairs.rows, minlength=logits.shape[0]).to(logits.dtype)
        return _HardCrossEntropy.apply(logits, pairs.rows, pairs.cols, count), count > 0
    # soft graph: one fused function, gradient softmax(s) − t computed in place
    w = weights.detach().to(logits.dtype)
    mass = w.sum(1, keepdim=True)
    valid = mass.flatten() > 0
    targets = w / mass.clamp_min(torch.finfo(w.dtype).tiny)
    return _SoftCrossEntropy.apply(logits, targets), valid


def _flat_positions(rows: Tensor, cols: Tensor, width: int) -> Tensor:
    """[P] positions ``row·width + col`` of (rows, cols) in a flattened [A, width] matrix.

    Gathering / adding there with ``index_select`` / ``index_add_`` moves the same values as
    ``m[rows, cols]`` / ``index_put_((rows, cols), …, accumulate=True)`` (distinct pairs: each
    entry is read or added once), several times faster on CPU."""
    return rows.mul(width).add_(cols)


class _HardCrossEntropy(torch.autograd.Function):
    """``logsumexp(s_i) − (1/|P(i)|) Σ_{p∈P(i)} s_ip`` per row, P given as (rows, cols) pairs.

    Backward is ``softmax(s_i) · g_i`` with ``g_i / |P(i)|`` subtracted at the positives, built
    in one A×M buffer: the same operations, in the same order, as autograd of the two-term
    expression (so bitwise the same gradient), which would also allocate a zero A×M matrix for
    the positives' part and one more for the sum. Saves the logits, the log-sum-exp and the
    index lists.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, rows: Tensor, cols: Tensor,  # type: ignore[override]
                count: Tensor) -> Tensor:
        lse = torch.logsumexp(logits, dim=1)  # [A]
        count = count.clamp_min(1)  # anchors without a positive pull nothing (and are masked)
        at = _flat_positions(rows, cols, logits.shape[1])  # [P]
        picks = logits.reshape(-1).index_select(0, at)  # logits[rows, cols]
        pulled = logits.new_zeros(logits.shape[0]).index_add(0, rows, picks)
        ctx.save_for_backward(logits, lse, rows, at, count)
        return lse - pulled / count

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        logits, lse, rows, at, count = ctx.saved_tensors
        out = (logits - lse[:, None]).exp_().mul_(grad[:, None])
        # out[rows, cols] += (−g/|P|)[rows]: the positives' pull, each entry once
        out.view(-1).index_add_(0, at, (-grad / count).index_select(0, rows))
        return out, None, None, None


def _softmax_parts(logits: Tensor, bound: float | None = None
                   ) -> tuple[Tensor, Tensor, Tensor | float]:
    """``(e, sums, shift)``: ``e = exp(s − shift)`` [A, M] and ``sums = Σ_j e`` [A, 1]:
    ``logsumexp = log(sums) + shift`` and ``softmax = e / sums`` from one exp pass
    (``torch.logsumexp`` makes its own and keeps none).

    ``shift`` is the row max [A, 1] (``sums`` ≥ 1), or ``bound``, a known upper bound of
    every logit (1/τ for unit rows), when given: one reduction less, exact while no row lies
    more than :data:`SINGLE_SHIFT_SPREAD` below it (the caller's check)."""
    shift = logits.amax(1, keepdim=True) if bound is None else bound
    e = (logits - shift).exp_()
    return e, e.sum(1, keepdim=True), shift


# Largest row spread max_j s_ij − min_j s_ij (own column aside) for which one shift by the row
# max keeps every exp(s_ij − max) a normal float32 (> e^−87.3): no positive's share underflows.
SINGLE_SHIFT_SPREAD = 80.0


class _SoftCrossEntropy(torch.autograd.Function):
    """``H(t_i, softmax(s_i)) = logsumexp(s_i) − t_i·s_i`` per row; rows of t sum to 1.

    Backward is ``(softmax(s_i) − t_i) · g_i``, built in one A×M buffer; autograd of the
    two-term expression would allocate one per term. Saves the logits and targets.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor) -> Tensor:  # type: ignore[override]
        e, sums, shift = _softmax_parts(logits)
        pulled = torch.bmm(targets[:, None, :], logits[:, :, None]).flatten()
        ctx.save_for_backward(e, sums, targets)
        return (sums.log() + shift).flatten() - pulled

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        e, sums, targets = ctx.saved_tensors
        g = grad[:, None]
        return (e * (g / sums)).addcmul_(targets, g, value=-1), None


def _positive_entries(logits: Tensor, positives: Tensor | PositivePairs
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """Row index, logit and per-row count of every positive pair: O(#positives) given the
    pairs, O(A·M) for a mask (its ``nonzero``)."""
    if isinstance(positives, PositivePairs):
        rows, cols = positives
    else:
        rows, cols = positives.nonzero(as_tuple=True)
    count = torch.bincount(rows, minlength=logits.shape[0]).to(logits.dtype)
    return rows, logits[rows, cols], count


def _segment_logsumexp(rows: Tensor, values: Tensor, n: int, valid: Tensor) -> Tensor:
    """``logsumexp`` of ``values`` grouped by ``rows`` [n]; rows without entries get 0.

    The shift is detached (logsumexp's gradient does not depend on it), and empty rows take
    log(1) so that no −inf or NaN reaches the backward pass.
    """
    shift = torch.full(
        (n,), torch.finfo(values.dtype).min, dtype=values.dtype, device=values.device
    )
    shift = shift.scatter_reduce(0, rows, values.detach(), "amax")
    total = values.new_zeros(n).index_add(0, rows,
                                          torch.exp(values - shift.index_select(0, rows)))
    return torch.where(valid, torch.log(torch.where(valid, total, 1.0)) + shift, 0.0)


class _LogSumExpAndPicks(torch.autograd.Function):
    """``(logsumexp(s_i) [A], s[rows, cols] [P])`` with one A×M gradient buffer.

    Backward is ``softmax(s_i) · g_i`` with the picks' gradients added at (rows, cols): the
    same operations, in the same order, as autograd of ``torch.logsumexp`` and the indexing
    (so bitwise the same gradient), which would allocate a further zero A×M matrix for the
    picks, another for the sum, and one per step of the log-sum-exp's backward.
    (rows, cols) must be distinct pairs. Saves the logits, the log-sum-exp and the indices.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, rows: Tensor,  # type: ignore[override]
                cols: Tensor) -> tuple[Tensor, Tensor]:
        lse = torch.logsumexp(logits, dim=1)  # [A]
        at = _flat_positions(rows, cols, logits.shape[1])  # [P]
        ctx.save_for_backward(logits, lse, at)
        return lse, logits.reshape(-1).index_select(0, at)  # logits[rows, cols]

    @staticmethod
    def backward(ctx, grad_lse: Tensor,  # type: ignore[override]
                 grad_picks: Tensor) -> tuple[Tensor, None, None]:
        logits, lse, at = ctx.saved_tensors
        out = (logits - lse[:, None]).exp_().mul_(grad_lse[:, None])
        out.view(-1).index_add_(0, at, grad_picks)  # out[rows, cols] += the picks' gradient
        return out, None, None


def positive_log_mass(logits: Tensor, positives: Tensor | PositivePairs
                      ) -> tuple[Tensor, Tensor]:
    """``−log (1/|P(i)|) Σ_{p∈P(i)} softmax(s_i)_p`` — SupCon L_in (supcon.txt Eq. 3).

    ``positives``: :class:`PositivePairs` (or a bool mask, turned into them), reduced
    sparsely: the positives' log-sum-exp runs over the positive entries only, so the cost
    beyond the all-candidates log-sum-exp is O(#positives); one A×M float32 in backward
    (:class:`_LogSumExpAndPicks`; no mask). Small batches' masks take
    :func:`hard_graph_loss`'s fused path instead.
    """
    if not isinstance(positives, PositivePairs):
        positives = PositivePairs(*positives.nonzero(as_tuple=True))
    rows, cols = positives
    count = torch.bincount(rows, minlength=logits.shape[0]).to(logits.dtype)
    lse, values = _LogSumExpAndPicks.apply(logits, rows, cols)
    valid = count > 0
    pos_lse = _segment_logsumexp(rows, values, logits.shape[0], valid)
    return lse - pos_lse + torch.log(count.clamp_min(1)), valid


def hard_graph_loss(pairs: Pairs, tau: float, positives: PositiveMask | PositivePairs,
                    log_mass: bool = False) -> tuple[Tensor, Tensor]:
    """Per-anchor loss [A] and validity [A] over a hard graph: SimCLR / SupCon L_out
    (:func:`graph_cross_entropy`) or, with ``log_mass``, SupCon L_in
    (:func:`positive_log_mass`), from the pairs' unit rows at temperature ``tau``.

    A :class:`PositiveMask` (small batches) runs in one fused function from the rows to
    the losses (:class:`_DenseContrast`); L_in does so while its one exp pass cannot
    underflow a positive (2/τ ≤ :data:`SINGLE_SHIFT_SPREAD`: unit rows' logits lie within
    2/τ of each other), else from the mask's pairs. :class:`PositivePairs` go through
    :func:`masked_logits` and the sparse reducers. Either way the same loss and gradient,
    to rounding.
    """
    if isinstance(positives, PositiveMask):
        if not log_mass or 2 / tau <= SINGLE_SHIFT_SPREAD:
            loss = _DenseContrast.apply(pairs.anchors, pairs.candidates, pairs.self_index,
                                        positives.mask, positives.counts, tau, log_mass)
            return loss, positives.counts > 0
        positives = positives.pairs()
    logits = masked_logits(pairs, tau)
    if log_mass:
        return positive_log_mass(logits, positives)
    return graph_cross_entropy(logits, positives)


class _DenseContrast(torch.autograd.Function):
    """Small batches' hard-graph losses in one function, from unit anchors [A, D] and
    candidates [M, D] to per-anchor losses [A] (:func:`hard_graph_loss`): the logits of
    :func:`masked_logits` (the same kernels), then with ``e = exp(s − row max)``,

    * cross-entropy: ``log Σ_j e_ij + max_i − (1/|P(i)|) Σ_j mask_ij s_ij``;
    * L_in (``log_mass``): ``log Σ_j e_ij − log Σ_j mask_ij e_ij + log|P(i)|`` (one exp pass
      for both sums: exact while the rows' spread is at most :data:`SINGLE_SHIFT_SPREAD`).

    Backward builds the logits' gradient in one A×M buffer (``e`` weighted per row and at
    the positives), then the two matmuls: autograd of the same steps would add a node and
    an A×M pass for the divide, the own-column mask and the reducer each. Rows without a
    positive get a finite placeholder (to be masked). Saves ``e`` and the mask (A×M each).
    """

    @staticmethod
    def forward(ctx, anchors: Tensor, candidates: Tensor,  # type: ignore[override]
                self_index: Tensor, mask: Tensor, counts: Tensor, tau: float,
                log_mass: bool) -> Tensor:
        s = scaled_similarity(anchors, candidates, tau)  # masked_logits' kernels
        s.scatter_(1, self_index[:, None], torch.finfo(s.dtype).min)
        # unit rows: s ≤ 1/τ, and s ≥ −1/τ off the own column, so 1/τ serves as the shift
        # when 2/τ is within SINGLE_SHIFT_SPREAD (always so for L_in here)
        e, sums, shift = _softmax_parts(s, 1 / tau if 2 / tau <= SINGLE_SHIFT_SPREAD else None)
        if log_mass:
            # [A, 1] Σ_p e_ip (a row without a positive: tiny, not 0: no inf / NaN anywhere)
            per_row = torch.bmm(mask[:, None, :], e[:, :, None]).flatten(1).clamp_min_(
                torch.finfo(e.dtype).tiny)
            loss = (sums.log() - per_row.log()).flatten() + counts.clamp_min(1).log()
        else:
            per_row = counts.clamp_min(1)[:, None]  # anchors without a positive pull nothing
            # the own column holds finfo.min and mask 0 there: its product is −0, not −inf
            pulled = torch.bmm(mask[:, None, :], s[:, :, None]).flatten()  # Σ_j mask·s
            loss = (sums.log() + shift).flatten() - pulled / per_row.flatten()
        ctx.save_for_backward(anchors, candidates, e, sums, mask, per_row)
        ctx.tau, ctx.log_mass = tau, log_mass
        return loss

    @staticmethod
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, None, None, None, None, None]:
        anchors, candidates, e, sums, mask, per_row = ctx.saved_tensors
        g = (grad / ctx.tau)[:, None]  # s = a·cᵀ/τ: 1/τ folded into the row weights
        if ctx.log_mass:  # ∂/∂s = e · (1/Σe − mask/Σ_p e) · g
            ds = e * torch.addcmul(g / sums, mask, g / per_row, value=-1)
        else:  # ∂/∂s = softmax · g − mask · g/|P|
            ds = (e * (g / sums)).addcmul_(mask, g / per_row, value=-1)
        need_a, need_c = ctx.needs_input_grad[:2]
        return (torch.mm(ds, candidates) if need_a else None,
                torch.mm(ds.T, anchors) if need_c else None, None, None, None, None, None)


def noise_contrastive(
    logits: Tensor, positives: Tensor, self_mask: Tensor, margin: float = 0.0,
    dense: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """SINCERE / eps-SupInfoNCE: mean over p ∈ P(i) of
    ``−log e^{s_ip} / (e^{s_ip − margin} + Σ_{n∈N(i)} e^{s_in})``, N(i) = not positive, not i.

    ``margin`` is in logit units (ε/τ for a cosine margin ε). Buffers: one A×M float32 (the
    noise-masked logits); on the CPU the per-pair terms are computed on the positive entries
    only. ``dense`` (default: off the CPU) computes them for every entry and masks instead:
    two more A×M buffers, but no ``nonzero`` / ``bincount``, whose data-dependent sizes are
    host synchronisations on an accelerator (tests/test_sync_audit.py).
    """
    min_value = torch.finfo(logits.dtype).min
    noise = ~(positives | self_mask)
    noise_lse = torch.logsumexp(logits.masked_fill(~noise, min_value), dim=1)  # [A]
    if accelerator_paths(logits.device) if dense is None else dense:
        count = positives.sum(1, dtype=logits.dtype)  # [A]
        per_entry = torch.logaddexp(logits - margin, noise_lse[:, None]) - logits  # [A, M]
        total = torch.where(positives, per_entry, 0.0).sum(1)
        return total / count.clamp_min(1), count > 0
    rows, values, count = _positive_entries(logits, positives)
    per_pair = torch.logaddexp(values - margin, noise_lse[rows]) - values  # [#positives]
    total = logits.new_zeros(logits.shape[0]).index_add(0, rows, per_pair)
    return total / count.clamp_min(1), count > 0


class DeferredCheck(NamedTuple):
    """An objective's own input check, computed on the device and read back with the loss
    statistics (:func:`fused_global_means`) instead of in a read of its own.

    ``values``: a few numbers on the device (read as floats: keep them exact there, e.g.
    0/1 flags). ``raise_failed(values)``: given them read back, raise the check's error if
    it failed (it may read the inputs again to word the message: the failure path only).
    Until then the objective must not let a failing input do harm (e.g. clamp labels it
    indexes with: an out-of-range index is a device-side assert on CUDA).
    """

    values: Tensor
    raise_failed: Callable[[Sequence[float]], None]

    def apply(self) -> None:
        """Read the values now (one device read) and raise if the check failed."""
        self.raise_failed(self.values.reshape(-1).tolist())


class Objective(nn.Module):
    """Base of all objectives: ``objective(batch) -> (loss, metrics)``.

    ``loss`` is this rank's DDP share (:func:`components.runtime.distributed.global_mean`): call
    ``backward()`` on it; ``metrics['loss']`` is the global value to log. ``requires`` names
    the :class:`ContrastiveBatch` fields the objective needs, so a training loop can ask
    what to compute without branching on the loss name.

    A batch's deferred input checks (:func:`hot_path`) are read before :meth:`compute`
    (one device read) unless ``folds_batch_checks``: then ``compute`` passes the batch to
    :func:`fused_global_means`, whose one read carries them, before anything is stored (a
    memory bank) and after only the forward pass has run.
    """

    requires: frozenset[str] = frozenset()  # per class; an instance may add (e.g. "ema_z")
    folds_batch_checks: bool = False

    def forward(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        missing = sorted(f for f in self.requires if getattr(batch, f) is None)
        if missing:
            raise ValueError(
                f"{type(self).__name__} needs batch field(s) {', '.join(missing)}; "
                f"they are None (e.g. labels for a supervised loss, captions for "
                f"X-CLR graph='caption', ema_z when a memory bank is used)"
            )
        if not self.folds_batch_checks:
            # e.g. a label out of range would fail inside compute (a CUDA device assert)
            batch.check()
        # Logits in float32 even inside an autocast region: autocast would run the matmuls
        # in fp16/bf16, where cos/τ at small τ loses most of its digits. (Entering the
        # context costs tens of microseconds: only when autocast is on.)
        device_type = batch.z.device.type
        if torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type=device_type, enabled=False):
                out = self.compute(batch)
        else:
            out = self.compute(batch)
        batch.check()  # a no-op when compute's read carried them
        return out

    def compute(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        raise NotImplementedError


GlobalMean = tuple[Tensor, float, int, int]  # (share, value, count, total): global_mean's


def fused_global_means(terms: Sequence[tuple[Tensor, Tensor]],
                       batch: ContrastiveBatch | None = None,
                       checks: Sequence[DeferredCheck | None] = ()) -> list[GlobalMean]:
    """:func:`components.runtime.distributed.global_mean` of each ``(per_anchor [A_k], valid
    [A_k])``
    term, with one all-reduce and **one** device-to-host read for all of them.

    That read also carries ``batch``'s pending input checks (:meth:`ContrastiveBatch.
    take_checks`) and the objective's ``checks`` (None entries skipped), this rank's own,
    not reduced; they are raised after it, the batch's first, then ``checks`` in order. The
    values are global_mean's: the statistics are summed in the terms' common dtype (read
    alongside the checks as Python floats: exact widenings).

    Distributed, the all-reduce also carries the sum of the batch's field sums (its finite
    check): summed over ranks it is NaN / inf when any rank's batch holds a NaN / inf, and
    then :class:`NonFiniteError` is raised on **every** rank, after the same collectives:
    fp16's step skipping (``components.training.step.SkippedStep``) is decided for all ranks at
    once, so no rank goes on alone into the next collective (DDP's all-reduce, a memory
    bank's all-gather) while another skips — a hang on NCCL. It rides in the reduce the step
    makes anyway: one number more, no collective or device read of its own.

    Raises:
        ValueError / NonFiniteError: ``batch``'s checks or one of ``checks`` failed (every
            rank has taken part in the all-reduce by then); NonFiniteError also when another
            rank's batch is not finite (the message names the ranks).
    """
    device = terms[0][0].device
    wide = torch.float32 if device.type == "mps" else torch.float64  # no f64 there
    # where(): invalid rows may hold inf/NaN placeholders; never multiply them by 0.
    local_sums = [torch.where(valid, per_anchor, 0.0).sum() for per_anchor, valid in terms]
    pending = batch.take_checks() if batch is not None else None
    own = [c for c in checks if c is not None]
    parts = ([] if pending is None else [pending.values]) + [c.values.reshape(-1) for c in own]
    dist = distributed.is_distributed()
    if dist:  # sum, count, total per term, summed over ranks
        dtype = functools.reduce(torch.promote_types, [p.dtype for p, _ in terms])
        checked = [p.to(device=device, dtype=wide) for p in parts]
        stats: list[Tensor] = []
        for local_sum, (_, valid) in zip(local_sums, terms, strict=True):
            stats += [local_sum.detach().to(dtype), valid.sum().to(dtype),
                      torch.full((), valid.numel(), dtype=dtype, device=valid.device)]
        # + 1: the sum of this rank's field sums, summed over ranks: NaN / inf when any
        # rank's batch is not finite (one number on every rank, whatever its batch holds:
        # the all-reduce's shapes must agree)
        stats.append(pending.values[: len(pending.names)].sum().to(dtype)
                     if pending is not None and pending.names
                     else torch.zeros((), dtype=dtype, device=device))
        reduced = distributed.all_reduce_sum(torch.stack(stats))  # [3·T + 1]
        read = torch.cat([reduced.to(wide), *checked]) if checked else reduced
    else:
        # Nothing to sum over ranks: the statistics are read as they are, in one stack (the
        # count promoted to the sums' dtype: exact below 2**24) that cat promotes with the
        # checks (exact widenings; every value is read as a Python float); the totals are
        # the terms' sizes, known here — a few kernels fewer.
        stats = [x for local_sum, (_, valid) in zip(local_sums, terms, strict=True)
                 for x in (local_sum.detach(), valid.sum())]
        read = torch.stack(stats)
        if read.dtype not in (torch.float32, torch.float64):  # counts in a half type: inexact
            read = read.to(wide)
        read = torch.cat([read, *parts]) if parts else read
    values = read.tolist()  # the one device-to-host copy
    if not dist:  # put the totals in: (sum, count, total) per term
        sums_counts, rest = values[: len(stats)], values[len(stats):]
        values = [x for k, (_, valid) in enumerate(terms)
                  for x in (*sums_counts[2 * k : 2 * k + 2], float(valid.numel()))] + rest
    at = 3 * len(terms)
    everywhere_finite = True
    if dist:
        everywhere_finite = math.isfinite(values[at])
        at += 1
    if pending is not None and batch is not None:
        batch.raise_failed(pending, values[at : at + pending.values.numel()])
        at += pending.values.numel()
    if not everywhere_finite:  # another rank's batch: every rank stops this step alike
        raise NonFiniteError(
            f"a batch on another rank than {distributed.rank()} holds non-finite values (NaN "
            "or inf): every rank stops this step")
    for check in own:
        check.raise_failed(values[at : at + check.values.numel()])
        at += check.values.numel()
    out: list[GlobalMean] = []
    for k, local_sum in enumerate(local_sums):
        loss_sum, count_f, total_f = values[3 * k : 3 * k + 3]
        count, total = round(count_f), round(total_f)
        if count == 0:  # no valid anchor anywhere: a zero share that still has a graph
            out.append((local_sum * 0.0, 0.0, 0, total))
        else:
            out.append((local_sum * (distributed.world_size() / count), loss_sum / count,
                        count, total))
    return out


def reduce(per_anchor: Tensor, valid: Tensor, batch: ContrastiveBatch | None = None,
           means: Mapping[str, Tensor] | None = None,
           checks: Sequence[DeferredCheck | None] = (), **extra: float) -> tuple[Tensor, Metrics]:
    """Global mean over valid anchors plus the standard metrics, in one device read
    (:func:`fused_global_means`, which also applies ``batch``'s pending checks and
    ``checks``).

    ``means``: per-anchor values ([A] each, no gradient) logged as their mean over every
    rank's anchors; ``extra``: plain metrics added as given.
    """
    means = dict(means or {})
    terms = [(per_anchor, valid)] + [(v, torch.ones_like(v, dtype=torch.bool))
                                     for v in means.values()]
    (share, value, count, total), *averaged = fused_global_means(terms, batch, checks)
    metrics = {
        "loss": value,
        "anchors": float(total),
        "anchors_without_positive": float(total - count),
    }
    metrics.update({k: m[1] for k, m in zip(means, averaged, strict=True)})
    metrics.update(extra)
    return share, metrics


check_positive = checks.positive  # re-exported: the objectives' constructors use these names
check_non_negative = checks.non_negative


class BatchContrastive(Objective):
    """Shared skeleton of the batch-contrastive losses (SimCLR, SupCon, X-CLR, SINCERE, ε):
    pair anchors with gathered candidates (+ bank), score, reduce globally, then enqueue the
    EMA keys. Subclasses only say how to score: :meth:`per_anchor`.

    Args:
        tau: temperature τ > 0 of ``s_ij = cos / τ``.
        bank_size: 0 for no memory bank, else its capacity K ≥ 1 (needs ``ema_z`` in batches).
        dim: projector output dimension D (required when ``bank_size > 0``).
        caption_dim: caption-embedding size E to keep in the bank (0 = none).
    """

    def __init__(self, tau: float, bank_size: int = 0, dim: int = 0, caption_dim: int = 0):
        super().__init__()
        self.tau = check_positive("tau", tau)
        if isinstance(bank_size, bool) or not isinstance(bank_size, int) or bank_size < 0:
            raise ValueError(f"bank_size={bank_size!r} is not allowed: 0 (no bank) or >= 1")
        self.bank: MemoryBank | None = None
        if bank_size:
            if dim < 1:
                raise ValueError(f"a memory bank needs the embedding dim >= 1, got dim={dim}")
            self.bank = MemoryBank(bank_size, dim, caption_dim=caption_dim)
            self.requires = type(self).requires | {"ema_z"}

    # Logit bytes per chunk (:func:`chunk_rows`); tests lower it to force several chunks.
    logit_budget_bytes: int = LOGIT_BUDGET_BYTES
    # Hard graphs as masks up to this many A×M entries (:data:`DENSE_GRAPH_ENTRIES`); tests
    # set it to 0 or to a huge value to run either path.
    dense_graph_entries: int = DENSE_GRAPH_ENTRIES
    folds_batch_checks = True  # reduce() reads them, before the bank is written

    def compute(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        sizes = batch.sizes_per_rank()  # every rank's B: one exchange at most, for all gathers
        pairs = pair_up(batch, self.bank, sizes)
        pairs.dense_graphs = (pairs.anchors.shape[0] * pairs.candidates.shape[0]
                              <= dense_graph_limit(self, pairs.anchors.device))
        checks = self.deferred_checks(pairs)  # read with the loss statistics
        names: list[str] = []

        def rows(start: int, stop: int, anchors: Tensor,
                 candidates: Tensor) -> tuple[Tensor, ...]:
            whole = anchors is pairs.anchors and candidates is pairs.candidates  # one chunk
            loss, valid, extra = self.per_anchor(
                pairs if whole else pairs.rows(start, stop, anchors, candidates))
            names[:] = sorted(extra)
            return (loss, valid, *(extra[k].detach() for k in names))

        per_anchor, valid, *extra = chunked_rows(
            rows, [pairs.anchors], [pairs.candidates],
            chunk_rows(pairs.anchors.shape[0], pairs.candidates.shape[0],
                       self.logit_budget_bytes))
        # Extras are per-anchor values: their mean over every rank's anchors, in the same
        # read as the loss (and the batch's deferred checks, and the subclass's own).
        out = reduce(per_anchor, valid, batch, means=dict(zip(names, extra, strict=True)),
                     checks=checks)
        if self.bank is not None:
            out[1]["bank_fill"] = len(self.bank) / self.bank.size
            self._enqueue(batch, sizes)
        return out

    def per_anchor(self, pairs: Pairs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Per-anchor loss [A], validity [A] and extra per-anchor metrics ([A] each; logged as
        their mean over all ranks' anchors). Must be row-wise (anchor i's values from row i
        alone): :meth:`compute` may call it on row chunks of ``pairs``."""
        raise NotImplementedError

    def deferred_checks(self, pairs: Pairs) -> list[DeferredCheck]:
        """Input checks of the subclass over all of ``pairs`` (e.g. labels inside its class
        graph), computed on the device and raised after the loss statistics' one read,
        before the bank is written; :meth:`per_anchor` must stay harmless (no out-of-bounds
        index) on inputs that fail them. None by default."""
        return []

    @torch.no_grad()
    def _enqueue(self, batch: ContrastiveBatch, sizes: Sequence[int]) -> None:
        """Write the batch's EMA keys (all ranks', ``sizes[r]`` samples each) to the bank."""
        assert self.bank is not None and batch.ema_z is not None
        v = batch.views

        def per_view(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.repeat_interleave(v, dim=0)

        keep_captions = self.bank.captions.shape[1] > 0
        self.bank.enqueue(
            unit(batch.ema_z).flatten(0, 1),
            labels=per_view(batch.labels),
            # Positional ids are only meaningful within one step: store -1 (never matches).
            ids=per_view(batch.sample_ids),
            captions=per_view(unit(batch.captions))
            if keep_captions and batch.captions is not None
            else None,
            sizes=[n * v for n in sizes],  # [B_r·V] rows per rank
        )
