"""CoNe: Contrast Your Neighbours (Zheng et al., cone.txt Eq. 1, 2, 9–13 and Alg. 1), and CE.

    L = CE(W·h_i, y_i) + λ_sup · L_in^sup + λ_dc · KL(p_dc_i ‖ p_class_i)

* L_in^sup over the top-N memory-bank neighbours J_i: the N bank keys most similar to the
  online query q_i, as the authors' released code picks them (``supcon_in(norm_q, …)``; the
  default), or to the EMA key k_i with ``neighbours_from='key'`` (the paper's text reads
  either way; the choice carries no gradient in both). Over those N,
  ``w_ij = softmax_{j∈J_i}(q_i·Q_j / τ_sup)`` and ``L_in,i = −log Σ_{j∈J_i, y_j = y_i} w_ij``
  (Eq. 2 restricted to the neighbours; no contrastive view is used, Sec. 3.3). Anchors with
  no same-label neighbour are excluded.
* Distributional consistency: ``p_inst_ij = softmax_j(k_i·Q_j / τ_dc)`` over the whole bank
  (Eq. 10, with the EMA key as in Alg. 1), ``p_dc_i = Σ_j p_inst_ij · Q^p_j`` (Eq. 11) with the
  EMA classifier's stored probabilities, and ``L_dc = KL(p_dc ‖ softmax(W·h_i))`` (Eq. 12); the
  target p_dc carries no gradient.
* After the loss the bank takes the EMA keys, labels and EMA class probabilities (Alg. 1).
  With an empty bank (first step) both auxiliary terms are 0.

With λ_sup = λ_dc = 0 this is exactly cross-entropy. Every view is a query with its own key.

Shapes: ``z`` / ``ema_z`` [B, V, D], ``logits`` / ``ema_logits`` [B, V, C], ``labels`` [B].

Raises:
    ValueError: λ < 0, τ ≤ 0, bank size or top-N < 1, a label ≥ C, bad shapes, non-finite.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor
from torch.nn import functional as F

from components.objectives.batch import ContrastiveBatch, DeferredCheck, Metrics
from components.objectives.core import Objective, check_non_negative, check_positive
from components.objectives.global_means import fused_global_means
from components.objectives.memory import MemoryBank
from components.objectives.pairing import at_least_fp32, unit


def _check_labels(batch: ContrastiveBatch, num_classes: int) -> DeferredCheck | None:
    """The logits' width, checked now (a shape), and labels < ``num_classes``, on the device:
    read with the loss statistics (:func:`fused_global_means`), which raises for it. Until
    then :func:`_cross_entropy` clamps the labels (the batch checks labels ≥ 0 likewise).

    Raises:
        ValueError: (now) logits with another number of classes; (``raise_failed``) a label
            ≥ ``num_classes``.
    """
    assert batch.labels is not None and batch.logits is not None
    if batch.logits.shape[-1] != num_classes:
        raise ValueError(
            f"logits have {batch.logits.shape[-1]} classes, the objective was built for "
            f"{num_classes}"
        )
    labels = batch.labels
    if not labels.numel():
        return None

    def raise_failed(flag: Sequence[float]) -> None:
        if flag[0]:  # the failure path: read the label for the message
            raise ValueError(f"label {int(labels.max())} is out of range for {num_classes} "
                             "classes")

    return DeferredCheck((labels.max() >= num_classes).view(1), raise_failed)


def _cross_entropy(batch: ContrastiveBatch, label_smoothing: float) -> Tensor:
    """Per-query CE [B·V] (torch's label smoothing: (1−ε)·onehot + ε/C).

    The labels are clamped into ``[0, C)``: the identity on valid labels; invalid ones are
    refused after the loss statistics' read (:func:`_check_labels`, the batch's labels ≥ 0
    check), and must not reach ``F.cross_entropy`` before (a device assert on CUDA).
    """
    assert batch.logits is not None and batch.labels is not None
    logits = at_least_fp32(batch.logits).flatten(0, 1)
    labels = batch.labels.clamp(0, logits.shape[-1] - 1).repeat_interleave(batch.views)
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="none")


class CrossEntropy(Objective):
    """Softmax cross-entropy on the classifier head (cone.txt Eq. 1): the supervised baseline."""

    requires = frozenset({"labels", "logits"})
    # Only the classifier head trains: DDP must not wait for projector gradients.
    always_uses_z = False

    def __init__(self, num_classes: int, label_smoothing: float = 0.0) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes} must be >= 1")
        self.num_classes = num_classes
        self.label_smoothing = check_non_negative("label_smoothing", label_smoothing)

    folds_batch_checks = True  # one read: the loss, the batch's checks and labels < C

    def compute(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        check = _check_labels(batch, self.num_classes)
        ce = _cross_entropy(batch, self.label_smoothing)
        ((share, value, _, _),) = fused_global_means(
            [(ce, torch.ones_like(ce, dtype=torch.bool))], batch, [check])
        return share, {"loss": value, "ce": value}


class CoNe(Objective):
    requires = frozenset({"labels", "logits", "ema_z", "ema_logits"})
    # z enters the loss only once the bank holds neighbours (not on the first step).
    always_uses_z = False

    def __init__(
        self,
        num_classes: int,
        dim: int,
        *,
        lambda_sup: float = 0.7,
        lambda_dc: float = 0.4,
        tau_sup: float = 0.1,
        tau_dc: float = 0.07,
        bank_size: int = 4096,
        top_n: int = 32,
        label_smoothing: float = 0.0,
        neighbours_from: Literal["key", "query"] = "query",
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes={num_classes} must be >= 1")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n={top_n!r} is not allowed: it must be an int >= 1")
        if neighbours_from not in ("key", "query"):
            raise ValueError(f"neighbours_from={neighbours_from!r}: choose 'key' or 'query'")
        self.num_classes = num_classes
        self.lambda_sup = check_non_negative("lambda_sup", lambda_sup)
        self.lambda_dc = check_non_negative("lambda_dc", lambda_dc)
        self.tau_sup = check_positive("tau_sup", tau_sup)
        self.tau_dc = check_positive("tau_dc", tau_dc)
        self.top_n = top_n
        self.label_smoothing = check_non_negative("label_smoothing", label_smoothing)
        self.neighbours_from = neighbours_from
        self.bank = MemoryBank(bank_size, dim, num_classes=num_classes)

    folds_batch_checks = True  # one read: CE, L_in, dc, the batch's checks and labels < C

    def compute(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        assert batch.labels is not None and batch.logits is not None
        assert batch.ema_z is not None and batch.ema_logits is not None
        check = _check_labels(batch, self.num_classes)
        q = unit(batch.z).flatten(0, 1)  # [A, D] queries
        k = unit(batch.ema_z).flatten(0, 1)  # [A, D] EMA keys
        logits = at_least_fp32(batch.logits).flatten(0, 1)  # [A, C]
        per_view = functools.partial(torch.repeat_interleave, repeats=batch.views, dim=0)
        labels = per_view(batch.labels)  # [A]
        everyone = torch.ones_like(labels, dtype=torch.bool)

        ce_term = (_cross_entropy(batch, self.label_smoothing), everyone)
        bank_fill = len(self.bank) / self.bank.size
        rows = self.bank.valid()
        # One read for every term's global mean and the checks, before the bank is written.
        if len(self.bank) == 0:
            ((ce_share, ce, _, anchors),) = fused_global_means([ce_term], batch, [check])
            zero = logits.sum() * 0.0
            sup_in, dc, without = 0.0, 0.0, float(anchors)
            loss = ce_share + zero
        else:
            bank_z = rows["features"].to(q.dtype)
            with torch.no_grad():
                key_sim = k @ bank_z.T  # [A, K]: picks neighbours and weighs p_dc
            sup_term = self._neighbour_sup_in(q, key_sim, labels, bank_z, rows["labels"])
            dc_term = (self._dc(key_sim, logits, rows["probs"].to(q.dtype)), everyone)
            (ce_share, ce, _, _), (sup_share, sup_in, count, total), (dc_share, dc, _, _) = (
                fused_global_means([ce_term, sup_term, dc_term], batch, [check]))
            without = float(total - count)
            loss = ce_share + self.lambda_sup * sup_share + self.lambda_dc * dc_share
        metrics: Metrics = {"ce": ce, "bank_fill": bank_fill}
        metrics.update(
            sup_in=sup_in,
            dc=dc,
            anchors_without_positive=without,
            loss=ce + self.lambda_sup * sup_in + self.lambda_dc * dc,
        )
        with torch.no_grad():
            self.bank.enqueue(
                k,
                labels=labels,
                ids=None
                if batch.sample_ids is None
                else batch.sample_ids.repeat_interleave(batch.views),
                probs=torch.softmax(at_least_fp32(batch.ema_logits).flatten(0, 1), dim=1),
                # every rank's B·V rows: sizes exchanged once per step at most, none for
                # equal batches (hot_path)
                sizes=[n * batch.views for n in batch.sizes_per_rank()],
            )
        return loss, metrics

    def _neighbour_sup_in(
        self, q: Tensor, key_sim: Tensor, labels: Tensor, bank_z: Tensor, bank_labels: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Per-query L_in over the top-N neighbours [A] and validity [A]."""
        n = min(self.top_n, bank_z.shape[0])
        with torch.no_grad():
            chooser = key_sim if self.neighbours_from == "key" else q.detach() @ bank_z.T
            neighbours = chooser.topk(n, dim=1).indices  # [A, N]
        # Score only the chosen rows: [A, N, D] · [A, D] — avoids an A×K logit matrix.
        logits = torch.einsum("and,ad->an", bank_z[neighbours], q) / self.tau_sup
        positives = bank_labels[neighbours] == labels[:, None]  # [A, N]
        min_value = torch.finfo(logits.dtype).min
        pos_lse = torch.logsumexp(logits.masked_fill(~positives, min_value), dim=1)
        return torch.logsumexp(logits, dim=1) - pos_lse, positives.any(1)

    def _dc(self, key_sim: Tensor, logits: Tensor, bank_probs: Tensor) -> Tensor:
        """Per-query KL(p_dc ‖ p_class) [A]; p_dc from the EMA key's similarities, no gradient."""
        with torch.no_grad():
            p_dc = torch.softmax(key_sim / self.tau_dc, dim=1) @ bank_probs  # [A, C]
        log_p_class = torch.log_softmax(logits, dim=1)
        return (torch.xlogy(p_dc, p_dc) - p_dc * log_p_class).sum(1)
