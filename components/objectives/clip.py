"""CLIP / LiT-style image↔caption baseline (Radford et al. 2021; Zhai et al. 2022).

The caption embeddings are frozen (precomputed by sentence-transformers, as LiT locks one
tower); a trainable linear head maps them to the image embedding space. For each view v:

    i2t = mean_b −log softmax_m(cos(z_bv, h(c_m)) / τ)[b]      (candidates: all captions)
    t2i = mean_b −log softmax_m(cos(h(c_b), z_mv) / τ)[b]      (candidates: all images, view v)
    loss = mean_v (i2t + t2i) / 2

Candidates are gathered from every rank; each rank's labels are offset by its first global
row (open_clip). Two samples with the same caption text are still negatives, as in CLIP.

Shapes: ``batch.z`` [B, V, D], ``batch.captions`` [B, E].

Raises:
    ValueError: τ ≤ 0, dims < 1, missing captions, caption size ≠ E, bad shapes, non-finite.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from components.objectives.batch import ContrastiveBatch, Metrics
from components.objectives.core import Objective, check_positive
from components.objectives.global_means import fused_global_means
from components.objectives.pairing import unit
from components.objectives.reducers import LOGIT_BUDGET_BYTES, chunk_rows, chunked_rows
from components.runtime import distributed


class CLIP(Objective):
    requires = frozenset({"captions"})
    logit_budget_bytes: int = LOGIT_BUDGET_BYTES  # per chunk (reducers.chunk_rows)
    folds_batch_checks = True  # one read: the loss and the batch's checks

    def __init__(self, dim: int, caption_dim: int = 384, tau: float = 0.07) -> None:
        super().__init__()
        if dim < 1 or caption_dim < 1:
            raise ValueError(f"dim={dim} and caption_dim={caption_dim} must be >= 1")
        self.tau = check_positive("tau", tau)
        self.caption_dim = caption_dim
        self.head = nn.Linear(caption_dim, dim)

    def compute(self, batch: ContrastiveBatch) -> tuple[Tensor, Metrics]:
        assert batch.captions is not None
        if batch.captions.shape[1] != self.caption_dim:
            raise ValueError(
                f"captions have {batch.captions.shape[1]} dims, the CLIP head expects "
                f"{self.caption_dim} (loss.caption_dim)"
            )
        b, v, _ = batch.z.shape
        images = unit(batch.z)  # [B, V, D]
        texts = unit(self.head(batch.captions.to(self.head.weight.dtype)))  # [B, D]
        # Every rank's B, for all three: exchanged once per step at most (none for equal
        # batches, hot_path), not once per gather.
        sizes = batch.sizes_per_rank()
        all_images = distributed.gather(images, sizes=sizes)  # [N, V, D]
        all_texts = distributed.gather(texts, sizes=sizes)  # [N, D]
        offset = distributed.row_offset(b, batch.z.device, sizes=sizes)
        targets = offset + torch.arange(b, device=batch.z.device)

        def rows(start: int, stop: int, images: Tensor, texts: Tensor, targets: Tensor,
                 all_images: Tensor, all_texts: Tensor) -> tuple[Tensor]:
            per_sample = images.new_zeros(stop - start)
            for view in range(v):
                i2t = images[:, view] @ all_texts.T / self.tau  # [B_c, N]
                t2i = texts @ all_images[:, view].T / self.tau  # [B_c, N]
                per_sample = per_sample + (
                    F.cross_entropy(i2t, targets, reduction="none")
                    + F.cross_entropy(t2i, targets, reduction="none")
                ) / (2 * v)
            return (per_sample,)

        # Row chunks above the logit budget (two B_c×N matrices per view at a time).
        (per_sample,) = chunked_rows(rows, [images, texts, targets], [all_images, all_texts],
                                     chunk_rows(b, 2 * all_texts.shape[0],
                                                self.logit_budget_bytes))
        everyone = torch.ones(b, dtype=torch.bool, device=batch.z.device)
        # One read: the global mean and the batch's deferred checks.
        ((share, value, _, _),) = fused_global_means([(per_sample, everyone)], batch)
        return share, {"loss": value}
