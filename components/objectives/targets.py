"""Target graphs over candidates: which candidates an anchor should be close to, how much.

Each function returns an [A, M] matrix over (anchors, candidates) of a :class:`Pairs`, zero
(or False) on each anchor's own column. A new graph source (a WordNet distance, a random
graph, …) is one more function here returning such a matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from components.objectives.core import Pairs, at_least_fp32


def _without_self(mask: Tensor, pairs: Pairs) -> Tensor:
    return mask.scatter_(1, pairs.self_index[:, None], False)


def instance_graph(pairs: Pairs) -> Tensor:
    """[A, M] bool: the other views of the same image (same sample id), bank rows included."""
    same = pairs.anchor_ids[:, None] == pairs.candidate_ids[None, :]
    same &= pairs.candidate_ids[None, :] >= 0  # rows with unknown id never match
    return _without_self(same, pairs)


def label_graph(pairs: Pairs) -> Tensor:
    """[A, M] bool: candidates with the anchor's label (SupCon's P(i)); unlabelled never match."""
    if pairs.anchor_labels is None or pairs.candidate_labels is None:
        raise ValueError("label_graph needs labels for every anchor and candidate")
    same = pairs.anchor_labels[:, None] == pairs.candidate_labels[None, :]
    same &= pairs.candidate_labels[None, :] >= 0
    return _without_self(same, pairs)


def class_similarity_graph(pairs: Pairs, class_similarity: Tensor) -> Tensor:
    """[A, M] float: ``G_ij = S[y_i, y_j]`` from a [C, C] class-similarity matrix (xclr.txt A.12).

    Raises:
        ValueError: a label outside ``[0, C)`` or an unlabelled candidate.
    """
    if pairs.anchor_labels is None or pairs.candidate_labels is None:
        raise ValueError("the class-similarity graph needs labels for anchors and candidates")
    c = class_similarity.shape[0]
    for name, labels in (("anchor", pairs.anchor_labels), ("candidate", pairs.candidate_labels)):
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= c):
            raise ValueError(
                f"{name} labels span [{int(labels.min())}, {int(labels.max())}] but the class "
                f"similarity matrix is {c}×{c}: labels must lie in [0, {c})"
            )
    sim = class_similarity.to(pairs.anchors.device, pairs.anchors.dtype)
    return sim[pairs.anchor_labels][:, pairs.candidate_labels]


def caption_similarity_graph(pairs: Pairs) -> Tensor:
    """[A, M] float: cosine similarity of caption embeddings (xclr.txt Sec. 2.2, G^soft)."""
    if pairs.anchor_captions is None or pairs.candidate_captions is None:
        raise ValueError("the caption graph needs caption embeddings for anchors and candidates")
    return pairs.anchor_captions @ pairs.candidate_captions.T


def soft_targets(similarity: Tensor, pairs: Pairs, tau_s: float) -> Tensor:
    """X-CLR targets ``t_ij = softmax_{j≠i}(G_ij / tau_s)`` [A, M] float32, rows sum to 1.

    Computed in float32 with the own column at finfo.min, so tau_s = 1e-3 stays finite.
    The targets carry no gradient (a graph from captions or labels is data, not a model).
    """
    with torch.no_grad():  # the graph is a fixed target: no gradient, so work in place
        scaled = at_least_fp32(similarity).div(tau_s)
        scaled.scatter_(1, pairs.self_index[:, None], torch.finfo(scaled.dtype).min)
        # softmax in place (max-shifted, so exp never overflows): no second A×M buffer.
        scaled.sub_(scaled.amax(dim=1, keepdim=True)).exp_()
        return scaled.div_(scaled.sum(dim=1, keepdim=True))
