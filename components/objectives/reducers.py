"""Logits and the per-anchor reducers: ``s_ij = cos(a_i, c_j) / tau`` with each anchor's own
column masked (:func:`masked_logits`), the graph cross-entropy (SimCLR, SupCon L_out, X-CLR),
SupCon L_in and SINCERE's noise-contrastive reducer as fused autograd functions, and how large
their matrices may get: row chunks under a logit budget (:func:`chunked_rows`,
:data:`LOGIT_BUDGET_BYTES`), hard graphs as masks below :data:`DENSE_GRAPH_ENTRIES`
(:func:`dense_graph_limit`), and the host-sync-free variants an accelerator takes
(:func:`accelerator_paths`; :data:`AUDIT_ACCELERATOR_PATHS` takes them on the CPU).

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from components.objectives.pairing import Pairs, PositiveMask, PositivePairs

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
# Set by tests/training/test_sync_audit.py to audit, on the CPU, the paths an accelerator takes.
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
    host synchronisations on an accelerator (tests/training/test_sync_audit.py).
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
