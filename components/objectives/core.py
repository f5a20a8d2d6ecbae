"""The one formulation every objective shares (docs/design.md, "Objectives: one
formulation"), and the base classes built on it: :class:`Objective` (every loss) and
:class:`BatchContrastive` (the batch-contrastive losses' skeleton).

An objective scores **anchors** (this rank's batch, all views) against **candidates** (every
rank's batch gathered with autograd, then optionally a memory bank). Logits are
``s_ij = cos(z_i, c_j) / tau`` in float32 (even under autocast), with each anchor's own column
masked. A loss is then a *target graph* over candidates (``targets.py``) and a *reducer*
(``reducers.py``); anchors and candidates are never assumed to be the same set, so no
function assumes a square or symmetric logit matrix.

Layout: a batch ``z`` of shape [B, V, D] is flattened sample-major (row ``b·V + v``);
gathered candidates are rank 0's rows, then rank 1's, …, then the bank's.

The layers, bottom up (each imports only those before it):

* ``batch.py``: :class:`~components.objectives.batch.ContrastiveBatch`, ``hot_path``, the
  input checks read once per step (host synchronisation: its docstring);
* ``pairing.py``: unit rows, ``pair_up`` → ``Pairs``, hard graphs as pairs or masks;
* ``reducers.py``: logits, the fused reducers, row chunks and the dense-graph / accelerator
  limits (memory: its docstring);
* ``global_means.py``: the loss statistics' one all-reduce and one read (``reduce``);
* here: the base classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from components import checks
from components.objectives.batch import ContrastiveBatch, DeferredCheck, Metrics
from components.objectives.global_means import reduce
from components.objectives.memory import MemoryBank
from components.objectives.pairing import Pairs, pair_up, unit
from components.objectives.reducers import (
    DENSE_GRAPH_ENTRIES,
    LOGIT_BUDGET_BYTES,
    chunk_rows,
    chunked_rows,
    dense_graph_limit,
)


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

    def __init__(
        self, tau: float, *, bank_size: int = 0, dim: int = 0, caption_dim: int = 0
    ):
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
