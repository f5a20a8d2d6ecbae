"""X-Sample Contrastive loss (X-CLR), Sobal et al. (xclr.txt Sec. 2.2, A.12, A.14).

Soft targets from a sample-similarity graph G replace SimCLR's one-hot target:

    t_ij = exp(G_ij / τ_s) / Σ_{k≠i} exp(G_ik / τ_s)      (j ≠ i)
    loss_i = H(t_i, p_i) = logsumexp_{j≠i} s_ij − Σ_{j≠i} t_ij s_ij,   s_ij = cos(z_i, c_j)/τ

G is either ``graph='class'``: a [C, C] class-similarity matrix indexed by labels (ImageNet
recipe: captions "a photo of a {class}" embedded once, A.12), or ``graph='caption'``: cosine
similarity of per-sample caption embeddings. As τ_s → 0 with a class graph whose diagonal is
its row maximum, t_i becomes uniform over same-class candidates: SupCon L_out (A.14). The
normalisation runs over j ≠ i (docs/design.md), not over all 2N_b as printed in Sec. 2.2.

Extra metric ``true_positive_weight``: mean target mass on the other views of the anchor's
own image (xclr.txt A.13, Fig. 8b; 1 for SimCLR).

Shapes: ``batch.z`` [B, V, D]; ``labels`` [B] for the class graph; ``captions`` [B, E] for the
caption graph; ``ema_z`` with a bank.

Raises:
    ValueError: τ ≤ 0, τ_s ≤ 0, an unknown graph, a class graph without a square matrix, labels
    outside the matrix, missing labels/captions, bad shapes, non-finite inputs.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from components.objectives.batch import DeferredCheck
from components.objectives.core import BatchContrastive, check_positive
from components.objectives.pairing import Pairs, at_least_fp32
from components.objectives.reducers import graph_cross_entropy, masked_logits
from components.objectives.targets import (
    caption_similarity_graph,
    class_label_check,
    class_similarity_graph,
    soft_targets,
)


class XCLR(BatchContrastive):
    class_similarity: Tensor

    def __init__(
        self,
        tau: float = 0.1,
        *,
        tau_s: float = 0.1,
        graph: Literal["class", "caption"] = "class",
        class_similarity: Tensor | None = None,
        bank_size: int = 0,
        dim: int = 0,
        caption_dim: int = 0,
    ) -> None:
        if graph not in ("class", "caption"):
            raise ValueError(f"X-CLR graph={graph!r} is not allowed: choose 'class' or 'caption'")
        super().__init__(tau, bank_size=bank_size, dim=dim,
                         caption_dim=caption_dim if graph == "caption" else 0)
        self.tau_s = check_positive("tau_s", tau_s)
        self.graph = graph
        self.requires = self.requires | {"labels" if graph == "class" else "captions"}
        if graph == "class":
            if class_similarity is None:
                raise ValueError("X-CLR graph='class' needs class_similarity, a [C, C] matrix")
            s = torch.as_tensor(class_similarity)
            s = at_least_fp32(s if s.is_floating_point() else s.float()).detach().clone()
            if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] < 1:
                raise ValueError(
                    f"class_similarity must be a square [C, C] matrix, got {tuple(s.shape)}"
                )
            if not bool(torch.isfinite(s).all()):
                raise ValueError("class_similarity has non-finite values")
            self.register_buffer("class_similarity", s)
        elif bank_size and caption_dim < 1:
            raise ValueError("X-CLR graph='caption' with a bank needs caption_dim >= 1")

    def deferred_checks(self, pairs: Pairs) -> list[DeferredCheck]:
        """The class graph's labels lie in [0, C): read with the loss statistics."""
        if self.graph != "class":
            return []
        check = class_label_check(pairs, self.class_similarity.shape[0])
        return [] if check is None else [check]

    def per_anchor(self, pairs: Pairs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        if self.graph == "class":
            # checked in deferred_checks (compute's one read); clamped until then
            similarity = class_similarity_graph(pairs, self.class_similarity, check=False)
        else:
            similarity = caption_similarity_graph(pairs)
        targets = soft_targets(similarity, pairs, self.tau_s)
        loss, valid = graph_cross_entropy(masked_logits(pairs, self.tau), targets)
        # Every anchor with at least one other candidate has a full target distribution.
        valid = valid & (pairs.candidates.shape[0] > 1)
        # Target mass on the other views of the anchor's own image: those are the V columns
        # of its sample in the batch part of the candidates (its own column holds 0).
        sample = pairs.self_index // pairs.views  # [A] global sample row
        cols = sample[:, None] * pairs.views + torch.arange(pairs.views, device=sample.device)
        return loss, valid, {"true_positive_weight": targets.gather(1, cols).sum(1)}
