"""Objectives: every loss is called as ``objective(batch) -> (loss, metrics)``.

See :mod:`components.objectives.core` for the shared formulation and
:func:`build_objective` to make one from its config.
"""

from __future__ import annotations

from torch import Tensor

from components.config import (
    CEConfig,
    CLIPConfig,
    CoNeConfig,
    EpsSupInfoNCEConfig,
    LossConfig,
    SimCLRConfig,
    SINCEREConfig,
    SupConConfig,
    XCLRConfig,
)
from components.objectives.batch import ContrastiveBatch, Metrics
from components.objectives.clip import CLIP
from components.objectives.cone import CoNe, CrossEntropy
from components.objectives.core import Objective
from components.objectives.infonce import InfoNCE
from components.objectives.sincere import SINCERE
from components.objectives.supcon import SupCon
from components.objectives.xclr import XCLR

__all__ = [
    "CLIP",
    "CoNe",
    "ContrastiveBatch",
    "CrossEntropy",
    "InfoNCE",
    "Metrics",
    "Objective",
    "SINCERE",
    "SupCon",
    "XCLR",
    "build_objective",
]


def build_objective(
    cfg: LossConfig,
    dim: int,
    num_classes: int = 0,
    class_similarity: Tensor | None = None,
    caption_dim: int = 0,
) -> Objective:
    """The objective a loss config describes.

    Args:
        cfg: one of the loss configs in :mod:`components.config`.
        dim: projector output dimension D (memory banks, CLIP head).
        num_classes: C, for CoNe and CE.
        class_similarity: [C, C] matrix for X-CLR ``graph='class'``.
        caption_dim: caption-embedding size E (X-CLR caption graph with a bank).

    Raises:
        ValueError: the dataset lacks what the loss needs (no classes for CoNe, …).
    """
    match cfg:
        case SimCLRConfig():
            return InfoNCE(cfg.tau, bank_size=cfg.bank_size, dim=dim)
        case SupConConfig():
            return SupCon(cfg.tau, variant=cfg.variant, bank_size=cfg.bank_size, dim=dim)
        case XCLRConfig():
            return XCLR(
                cfg.tau,
                tau_s=cfg.tau_s,
                graph=cfg.graph,
                class_similarity=class_similarity,
                bank_size=cfg.bank_size,
                dim=dim,
                caption_dim=caption_dim,
            )
        case SINCEREConfig():
            return SINCERE(cfg.tau, epsilon=0.0, bank_size=cfg.bank_size, dim=dim)
        case EpsSupInfoNCEConfig():
            return SINCERE(cfg.tau, epsilon=cfg.epsilon, bank_size=cfg.bank_size, dim=dim)
        case CoNeConfig():
            return CoNe(
                num_classes,
                dim,
                lambda_sup=cfg.lambda_sup,
                lambda_dc=cfg.lambda_dc,
                tau_sup=cfg.tau_sup,
                tau_dc=cfg.tau_dc,
                bank_size=cfg.bank_size,
                top_n=cfg.top_n,
                label_smoothing=cfg.label_smoothing,
                neighbours_from=cfg.neighbours_from,
            )
        case CEConfig():
            return CrossEntropy(num_classes, cfg.label_smoothing)
        case CLIPConfig():
            return CLIP(dim, cfg.caption_dim, cfg.tau)
    raise TypeError(f"not a loss config: {cfg!r}")
