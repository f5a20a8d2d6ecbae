"""The random-init baseline of an evaluation: the encoder of the run's config at the weights
the run started from, scored the same way — for a run with ``model.init``, the **init
weights** (:func:`initial_encoder`, its row named :data:`INIT_BASELINE`).

"How much did pretraining buy?" is the gain over this encoder: a random convolutional network
already separates simple images far above chance (its kNN top-1 on Fashion-MNIST is tens of
points), so a run's accuracy alone says little. :func:`random_init_encoder` rebuilds the
encoder exactly as the training recipe does before its first step
(``torch.manual_seed(train.seed)`` then :func:`components.models.encoders.build_encoder`, on
the CPU), without loading a checkpoint;
the caller extracts its features through the same loaders as the run's, and
:func:`score_baseline` computes the weighted kNN top-1 at one k and the linear probe's top-1
with their per-image hits, so :meth:`Baseline.gain` is a paired difference over the same
query images (:func:`components.evaluation.intervals.paired_mean_difference`).

The backbone and projector are built before the objective and the classifier head, so their
initial weights depend on the model section and the seed only: runs of the same model and seed
share one baseline whatever their loss (:attr:`Baseline.key`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from components.evaluation.intervals import Interval, mean_interval, paired_mean_difference

if TYPE_CHECKING:  # torch loads when a baseline is built (the report's types need none)
    import torch
    from torch import Tensor

    from components.config import PretrainConfig
    from components.models.encoders import Encoder

__all__ = ["BASELINE", "INIT_BASELINE", "Baseline", "initial_encoder", "random_init_encoder",
           "score_baseline"]

BASELINE = "random init"
INIT_BASELINE = "init weights"  # a run with model.init: the file's weights it started from


@dataclasses.dataclass(kw_only=True)
class Baseline:
    """kNN and probe scores of the random-init encoder on the run's query images."""

    seed: int  # train.seed: the weights the run started from
    k: int  # the kNN's k (the report's headline k)
    knn_top1: float
    probe_top1: float
    knn_hits: np.ndarray  # [Q] bool per query image, the run's query order
    probe_hits: np.ndarray | None  # [Q] bool
    key: str  # identifies the random encoder and what it was scored on (module docstring)
    name: str = BASELINE  # INIT_BASELINE for a run that started from model.init

    def intervals(self) -> dict[str, Interval]:
        """``knn@k`` and ``probe`` top-1 with their bootstrap intervals."""
        out = {f"knn@{self.k}": mean_interval(self.knn_hits)}
        if self.probe_hits is not None:
            out["probe"] = mean_interval(self.probe_hits)
        return out

    def gain(self, knn_hits: dict[int, np.ndarray],
             probe_hits: np.ndarray | None) -> dict[str, Interval]:
        """The trained run minus this baseline, paired over the same query images:
        ``knn@k`` (when the run has hits at this k) and ``probe``.

        Raises:
            ValueError: the hits are not over the same number of images.
        """
        out = {}
        if self.k in knn_hits:
            out[f"knn@{self.k}"] = paired_mean_difference(knn_hits[self.k], self.knn_hits)
        if probe_hits is not None and self.probe_hits is not None:
            out["probe"] = paired_mean_difference(probe_hits, self.probe_hits)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "k": self.k, "knn_top1": self.knn_top1,
                "probe_top1": self.probe_top1,
                "intervals": {k: iv.as_dict() for k, iv in self.intervals().items()}}


def random_init_encoder(cfg: PretrainConfig) -> Encoder:
    """The encoder (backbone and projector) of ``cfg`` at the initial weights of its training
    run, on the CPU: ``torch.manual_seed(cfg.train.seed)``, then
    :func:`~components.models.encoders.build_encoder` — the recipe's first draws
    (:func:`components.training.step.build_model` builds it first, before the objective and a
    classifier head). The global torch generator is left as it was (the seeding runs in a
    forked RNG state)."""
    import torch

    from components.models.encoders import build_encoder

    with torch.random.fork_rng(devices=[]):  # the CPU generator only: the build is on the CPU
        torch.manual_seed(cfg.train.seed)
        return build_encoder(cfg.model, cfg.data.augment.resolution)


def initial_encoder(cfg: PretrainConfig) -> tuple[Encoder, str]:
    """The encoder a run started from and its row's name: :func:`random_init_encoder`
    (:data:`BASELINE`), and for a run with ``model.init`` the file's tensors loaded into it as
    the recipe's fresh start does (:func:`components.models.init_weights.load_init`:
    the backbone, the projector where the file has one; :data:`INIT_BASELINE`).

    Raises:
        InitWeightsError: the init file is missing, unreadable or no longer fits.
    """
    encoder = random_init_encoder(cfg)
    if not cfg.model.init:
        return encoder, BASELINE
    from components.models.init_weights import load_init

    load_init(encoder, cfg.model.init, cfg.model.backbone)
    return encoder, INIT_BASELINE


def score_baseline(bank_features: Tensor, bank_labels: Tensor, query_features: Tensor,
                   query_labels: Tensor, num_classes: int, *, k: int, seed: int, key: str,
                   probe_epochs: int = 100, device: torch.device | None = None,
                   temperature: float = 0.07, name: str = BASELINE) -> Baseline:
    """Weighted kNN top-1 at ``k`` (votes exp(cos / ``temperature``): the run's kNN rule,
    :class:`~components.evaluation.knn.KnnRule`) and the linear probe's top-1 of the
    random-init encoder's features: bank ``[N, D]`` with labels ``[N]``, queries ``[Q, D]``
    with labels ``[Q]``."""
    from components.evaluation.knn import knn_hits, weighted_knn_predict
    from components.evaluation.probe import linear_probe

    k = min(k, len(bank_features))
    scores = weighted_knn_predict(bank_features, bank_labels, query_features, k, num_classes,
                                  temperature=temperature)
    hits = knn_hits(scores[k], query_labels.to(scores[k].device), 1).cpu().numpy()
    pr = linear_probe(bank_features, bank_labels, query_features, query_labels, num_classes,
                      epochs=probe_epochs, device=device)
    return Baseline(seed=seed, k=k, knn_top1=float(hits.mean()) if hits.size else float("nan"),
                    probe_top1=pr.top1, knn_hits=hits,
                    probe_hits=None if pr.hits1 is None else pr.hits1.numpy(), key=key,
                    name=name)
