"""Similarity-graph metrics on frozen embeddings: target–noise separation, class-similarity
matrices, and the label error / intra-class connectivity of the k-nearest-neighbour graph.

References:
    * SINCERE (sincere.txt Sec. 4.1 "Target-Noise Separation in Learned Embedding Space",
      Table 1, Fig. 2): for every test image, the cosine similarity to its nearest train
      neighbour of the same class ("Target") and of any other class ("Noise"); Table 1 reports
      the margin between the medians of the two distributions. → :func:`target_noise_separation`
    * X-CLR (xclr.txt Fig. 4 and App. "Visualising similarities"): the mean learned cosine
      similarity between the examples of two classes, drawn as a class × class heatmap.
      → :func:`class_similarity_matrix`
    * X-CLR (xclr.txt App. A.8, Table 9) "label error" and "intra-class connectivity",
      re-implemented by the X-CLR authors from Zhang et al. 2023 without published code or
      formulas. The paper gives none, so this module fixes its own definitions on the
      symmetric kNN graph (below). Table 9's connectivity values exceed 1 (1.233–2.193), so
      its numbers are NOT on the scale of :func:`intra_class_connectivity` (which lies in
      (0, 1]) and must not be compared with it. → :func:`label_error`,
      :func:`intra_class_connectivity`, :func:`class_connectivity`, :func:`graph_metrics`

Common conventions. Features are any-scale float rows; they are L2-normalised inside in
float32 (autocast off), so scaling a row by a positive constant changes nothing, and every
similarity is ``cos(x, y) = <x/‖x‖, y/‖y‖>``. An all-zero row has cosine 0 with everything
(itself included). Computation runs on the features' device; results come back on the CPU.
Where an N × M similarity matrix could be large it is built ``chunk_size`` rows at a time, so
the similarity buffer is O(chunk_size · M) float32. Labels are integer class ids ≥ 0; ``-1``
(unlabelled) is refused, since every metric here needs a label for each sample.

kNN graph (:func:`knn_graph`, used by the graph metrics). For samples ``x_1..x_N``:

    N_k(i) = the k indices j ≠ i with the largest cos(x_i, x_j)     (torch.topk order on ties)
    E      = { {i, j} : j ∈ N_k(i) or i ∈ N_k(j) }                  (undirected, no self-loops)

A pair that picks each other is ONE edge. Duplicated samples are distinct nodes (the self
index is excluded, not the value), so a duplicate is a neighbour with similarity 1. Which of
several exactly equal similarities at the k-th place is kept is decided by :func:`torch.topk`
(implementation-defined, may differ between CPU and CUDA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from components.evaluation import checks

__all__ = [
    "SeparationResult",
    "class_connectivity",
    "class_similarity_matrix",
    "graph_metrics",
    "intra_class_connectivity",
    "knn_graph",
    "label_error",
    "target_noise_separation",
]


# --------------------------------------------------------------------------- validation


_UNLABELLED_HINT = (
    "labels must be class ids ≥ 0. -1 marks unlabelled samples, and this metric needs "
    "a label for every sample: drop the unlabelled rows first"
)


def _check_labels(name: str, labels: object, rows: int, device: torch.device) -> Tensor:
    """[rows] int64 labels ≥ 0 on ``device``."""
    return checks.check_labels(name, labels, rows, None, hint=_UNLABELLED_HINT, device=device)


def _check_k(k: object, n: int) -> int:
    k = checks.as_int("k", k)
    if not 1 <= k <= n - 1:
        raise ValueError(
            f"k={k} is not allowed for N={n} samples: each sample has N - 1 = {n - 1} other "
            f"samples to link to; allowed: 1 ≤ k ≤ {n - 1}"
        )
    return k


def _normalize(x: Tensor) -> Tensor:
    """[rows, D] float32 unit rows (all-zero rows stay zero)."""
    return F.normalize(x.float(), dim=1)


def _median(values: Tensor) -> float:
    """numpy.median of a non-empty 1-D tensor: mean of the two middle values if even."""
    s = values.double().sort().values  # [M] ascending
    m = s.shape[0]
    return float((s[(m - 1) // 2] + s[m // 2]) / 2)


# --------------------------------------------------------------------------- SINCERE


@dataclass(frozen=True, eq=False, kw_only=True)
class SeparationResult:
    """Target–noise separation of a test set against a train set (sincere.txt Sec. 4.1).

    Attributes:
        target_sims: [M] float32 CPU, ``max_{j: y_j = y_q} cos(q, x_j)`` per test image q.
        noise_sims: [M] float32 CPU, ``max_{j: y_j ≠ y_q} cos(q, x_j)`` per test image q.
        target_median: ``median(target_sims)`` (numpy semantics: mean of the two middle
            values for an even count).
        noise_median: ``median(noise_sims)``, same semantics.
        margin: ``target_median - noise_median`` (Table 1; > 0 means separated on median).
        overlap: fraction of test images with ``noise_sim >= target_sim``, i.e. whose
            nearest train neighbour overall is not strictly of their own class (a tie counts
            as overlap).
    """

    target_sims: Tensor
    noise_sims: Tensor
    target_median: float
    noise_median: float
    margin: float
    overlap: float


@torch.no_grad()
def target_noise_separation(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    chunk_size: int = 1024,
) -> SeparationResult:
    """Target–noise separation of the nearest neighbours (sincere.txt Sec. 4.1, Table 1, Fig. 2).

    "For each CIFAR-10 test set image, we plot similarity to its nearest neighbor from the
    train set target and train set noise distributions"; "Table 1 ... measuring the margin
    between the median similarity values of the target and noise distribution". Exactly, for
    each test row q with label y_q, train rows x_j with labels y_j:

        target_sim(q) = max_{j : y_j = y_q} cos(q, x_j)
        noise_sim(q)  = max_{j : y_j ≠ y_q} cos(q, x_j)
        margin        = median_q target_sim(q) − median_q noise_sim(q)
        overlap       = (1/M) · #{q : noise_sim(q) ≥ target_sim(q)}

    ``median`` is numpy's: for an even count M it is the mean of the two middle values
    (``torch.median`` would return the lower one). The paper does not say which; the mean is
    the usual statistical definition.

    Args:
        train_features: [N, D] float, any scale (rows are L2-normalised inside).
        train_labels: [N] integer class ids ≥ 0; at least two distinct classes.
        test_features: [M, D] float, M ≥ 1, same device as ``train_features``.
        test_labels: [M] integer class ids ≥ 0, each present in ``train_labels``.
        chunk_size: test rows per chunk; memory is O(chunk_size · N).

    Returns:
        :class:`SeparationResult` (per-image similarities on the CPU, medians, margin, overlap).

    Raises:
        ValueError: wrong shapes/dtypes, mismatched D or device, non-finite features, negative
            labels, M == 0, fewer than two classes in train (no noise neighbour exists), a test
            class absent from train (named; no target neighbour exists), chunk_size < 1.
    """
    checks.check_features("train_features", train_features)
    checks.check_features("test_features", test_features)
    n, m = train_features.shape[0], test_features.shape[0]
    checks.check_same_width("test_features", test_features, "train_features", train_features)
    checks.check_same_device("test_features", test_features, "train_features", train_features)
    device = train_features.device
    chunk = checks.at_least_one("chunk_size", chunk_size)
    y_train = _check_labels("train_labels", train_labels, n, device)  # [N]
    y_test = _check_labels("test_labels", test_labels, m, device)  # [M]
    if m == 0:
        raise ValueError("test_features has M=0 rows; the separation needs at least one test row")
    train_classes = torch.unique(y_train)  # [C_train] sorted
    if train_classes.numel() < 2:
        present = train_classes.tolist()
        raise ValueError(
            f"train_labels hold {len(present)} class(es) {present}; the noise similarity "
            "needs a train sample of another class, so at least 2 classes are required"
        )
    missing = torch.unique(y_test[~torch.isin(y_test, train_classes)])  # [≤ M]
    if missing.numel():
        raise ValueError(
            f"test class(es) {missing.tolist()} have no train sample, so their target "
            f"similarity is undefined; allowed test labels: the train classes "
            f"{train_classes.tolist()}"
        )

    target = torch.empty(m, dtype=torch.float32, device=device)  # [M]
    noise = torch.empty(m, dtype=torch.float32, device=device)  # [M]
    with torch.autocast(device_type=device.type, enabled=False):
        train = _normalize(train_features)  # [N, D]
        for start in range(0, m, chunk):
            stop = min(start + chunk, m)
            sim = _normalize(test_features[start:stop]) @ train.T  # [B, N] cosine
            same = y_test[start:stop, None] == y_train[None, :]  # [B, N] target mask
            target[start:stop] = sim.masked_fill(~same, -math.inf).amax(dim=1)  # [B]
            noise[start:stop] = sim.masked_fill(same, -math.inf).amax(dim=1)  # [B]
    target_cpu, noise_cpu = target.cpu(), noise.cpu()
    t_med, n_med = _median(target_cpu), _median(noise_cpu)
    overlap = int((noise_cpu >= target_cpu).sum()) / m  # exact count / M
    return SeparationResult(
        target_sims=target_cpu,
        noise_sims=noise_cpu,
        target_median=t_med,
        noise_median=n_med,
        margin=t_med - n_med,
        overlap=overlap,
    )


# --------------------------------------------------------------------------- X-CLR Fig. 4


@torch.no_grad()
def class_similarity_matrix(features: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """Mean learned cosine similarity between the samples of two classes (xclr.txt Fig. 4).

    X-CLR's heatmap takes, for a pair of classes, "the Cartesian product" of their examples
    and averages the cosine similarities. Here, exactly, with ``I_a = {i : y_i = a}``,
    ``n_a = |I_a|`` and unit rows ``f_i = x_i / ‖x_i‖``:

        M[a, b] = (1 / (n_a · n_b))      · Σ_{i ∈ I_a} Σ_{j ∈ I_b} cos(x_i, x_j)     (a ≠ b)
        M[a, a] = (1 / (n_a · (n_a − 1))) · Σ_{i, j ∈ I_a, i ≠ j} cos(x_i, x_j)

    i.e. the mean over pairs (i in a, j in b, i ≠ j). Unlike the paper's Cartesian product,
    the diagonal leaves out the n_a self-pairs, whose similarity is trivially 1 and would pull
    small classes towards 1. M is symmetric. ``M[a, a]`` is NaN when ``n_a < 2``; row and
    column a are NaN when ``n_a = 0`` (absent class).

    Computed exactly through class sums ``S_a = Σ_{i ∈ I_a} f_i`` (float64):
    ``Σ_{i ∈ I_a, j ∈ I_b} cos = S_a · S_b``, and the diagonal subtracts the self terms
    ``Σ_{i ∈ I_a} ‖f_i‖²`` (= n_a, minus the all-zero rows, whose cosine is 0). Cost
    O(N · D + C² · D), no N × N matrix.

    Args:
        features: [N, D] float, any scale.
        labels: [N] integer class ids in ``[0, num_classes)``.
        num_classes: C ≥ 1.

    Returns:
        [C, C] float32 CPU tensor.

    Raises:
        ValueError: wrong shapes/dtypes, non-finite features, negative labels or labels
            ≥ num_classes, num_classes < 1.
    """
    checks.check_features("features", features)
    n, d = features.shape
    device = features.device
    num_classes = checks.at_least_one("num_classes", num_classes)
    y = _check_labels("labels", labels, n, device)  # [N]
    too_big = y >= num_classes
    if bool(too_big.any()):
        raise ValueError(
            f"labels has {int(too_big.sum())} label(s) ≥ num_classes={num_classes} "
            f"(e.g. {int(y[too_big][0])}); allowed: 0 ≤ label < {num_classes}"
        )
    with torch.autocast(device_type=device.type, enabled=False):
        f = _normalize(features).double()  # [N, D] unit rows, accumulated in float64
    sums = torch.zeros(num_classes, d, dtype=torch.float64, device=device)  # [C, D] S_a
    sums.index_add_(0, y, f)
    self_sim = torch.zeros(num_classes, dtype=torch.float64, device=device)  # [C] Σ ‖f_i‖²
    self_sim.index_add_(0, y, (f * f).sum(dim=1))
    counts = torch.bincount(y, minlength=num_classes).double()  # [C] n_a
    total = sums @ sums.T  # [C, C] Σ_{i∈a, j∈b} cos(x_i, x_j), self-pairs included
    pairs = counts[:, None] * counts[None, :]  # [C, C] n_a · n_b
    diag = torch.arange(num_classes, device=device)  # [C]
    total[diag, diag] -= self_sim  # drop i = j
    pairs[diag, diag] -= counts  # n_a · (n_a − 1)
    out = torch.where(pairs > 0, total / pairs.clamp_min(1.0), torch.full_like(total, math.nan))
    return out.float().cpu()


# --------------------------------------------------------------------------- kNN graph


@torch.no_grad()
def knn_graph(features: Tensor, k: int, chunk_size: int = 1024) -> Tensor:
    """Indices of the k most cosine-similar OTHER samples of every sample.

    ``out[i] = N_k(i)``: the k indices j ≠ i with the largest ``cos(x_i, x_j)``, in
    descending order of similarity (ties: :func:`torch.topk`, module docstring). The sample's
    own index is excluded (its value may reappear as a duplicate row).

    Args:
        features: [N, D] float, any scale.
        k: 1 ≤ k ≤ N − 1.
        chunk_size: rows per chunk; memory is O(chunk_size · N).

    Returns:
        [N, k] int64 CPU tensor.

    Raises:
        ValueError: wrong shape/dtype, non-finite features, k outside [1, N − 1],
            chunk_size < 1.
    """
    checks.check_features("features", features)
    n = features.shape[0]
    k = _check_k(k, n)
    chunk = checks.at_least_one("chunk_size", chunk_size)
    device = features.device
    out = torch.empty(n, k, dtype=torch.int64, device=device)  # [N, k]
    with torch.autocast(device_type=device.type, enabled=False):
        f = _normalize(features)  # [N, D]
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            sim = f[start:stop] @ f.T  # [B, N] cosine
            rows = torch.arange(stop - start, device=device)  # [B]
            sim[rows, rows + start] = -math.inf  # never link a sample to itself
            out[start:stop] = sim.topk(k, dim=1, largest=True, sorted=True).indices  # [B, k]
    return out.cpu()


def _edges(neighbors: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edges (lo < hi, each once) of the symmetrised kNN graph, as int64 arrays."""
    n, k = neighbors.shape
    src = torch.arange(n, dtype=torch.int64).repeat_interleave(k)  # [N·k]
    dst = neighbors.reshape(-1)  # [N·k]
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)  # [N·k]
    key = torch.unique(lo * n + hi)  # [E] each undirected edge once
    return (key // n).numpy(), (key % n).numpy()


def _label_error(lo: np.ndarray, hi: np.ndarray, y: np.ndarray) -> float:
    return float(np.count_nonzero(y[lo] != y[hi]) / lo.shape[0])  # E ≥ 1 since k ≥ 1


def _components_union_find(n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """[N] component id per node (a root index), by union–find with path halving."""
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.fromiter((find(a) for a in range(n)), dtype=np.int64, count=n)


def _components(n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """[N] connected-component id per node of the undirected graph (lo, hi)."""
    try:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components
    except ImportError:  # scipy is optional: fall back to a plain union–find
        return _components_union_find(n, lo, hi)
    adj = coo_matrix((np.ones(lo.shape[0], dtype=np.int8), (lo, hi)), shape=(n, n))
    _, comp = connected_components(adj.tocsr(), directed=False)
    return np.asarray(comp, dtype=np.int64)


def _class_connectivity(lo: np.ndarray, hi: np.ndarray, y: np.ndarray) -> dict[int, float]:
    """{class: LCC_c / n_c} for every class present in ``y`` (see intra_class_connectivity)."""
    n = y.shape[0]
    keep = y[lo] == y[hi]  # [E] intra-class edges only: the induced subgraphs
    lo, hi = lo[keep], hi[keep]
    comp = _components(n, lo, hi)  # [N]; a component never spans two classes
    _, comp_ids, comp_sizes = np.unique(comp, return_inverse=True, return_counts=True)
    classes, class_ids, class_sizes = np.unique(y, return_inverse=True, return_counts=True)
    largest = np.zeros(classes.shape[0], dtype=np.int64)  # [C_present]
    np.maximum.at(largest, class_ids, comp_sizes[comp_ids])  # largest component per class
    return {int(c): float(largest[i] / class_sizes[i]) for i, c in enumerate(classes.tolist())}


def _graph_inputs(
    features: Tensor, labels: Tensor, k: int, chunk_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    checks.check_features("features", features)
    n = features.shape[0]
    y = _check_labels("labels", labels, n, features.device).cpu().numpy()  # [N]
    k = _check_k(k, n)
    lo, hi = _edges(knn_graph(features, k, chunk_size=chunk_size))  # [E], [E]
    return lo, hi, y


def label_error(features: Tensor, labels: Tensor, k: int = 10, chunk_size: int = 1024) -> float:
    """Fraction of kNN-graph edges that join two different classes (xclr.txt App. A.8).

    X-CLR's Table 9 reports a "label error" re-implemented from Zhang et al. 2023 ("how
    similar samples of different classes are"), without a formula. simgraph's exact
    definition, on the symmetric cosine kNN graph E of the module docstring:

        label_error = |{ {i, j} ∈ E : y_i ≠ y_j }| / |E|

    0 means no edge crosses classes; labels independent of the features give, in
    expectation, ``1 − Σ_c n_c (n_c − 1) / (N (N − 1))`` (≈ ``1 − Σ_c p_c²``). A mutual pair
    is one edge, so |E| lies in [N·k/2, N·k]. Not on the scale of Table 9's numbers.

    Args:
        features: [N, D] float, any scale.
        labels: [N] integer class ids ≥ 0 (no unlabelled -1).
        k: neighbours per sample, 1 ≤ k ≤ N − 1.
        chunk_size: rows per chunk of the kNN search (memory O(chunk_size · N)).

    Raises:
        ValueError: as :func:`knn_graph`, and bad or negative labels.
    """
    lo, hi, y = _graph_inputs(features, labels, k, chunk_size)
    return _label_error(lo, hi, y)


def class_connectivity(
    features: Tensor, labels: Tensor, k: int = 10, chunk_size: int = 1024
) -> dict[int, float]:
    """Per-class connectivity ``{class: LCC_c / n_c}`` of :func:`intra_class_connectivity`.

    Only classes that occur in ``labels`` are keys. Raises as :func:`label_error`.
    """
    lo, hi, y = _graph_inputs(features, labels, k, chunk_size)
    return _class_connectivity(lo, hi, y)


def intra_class_connectivity(
    features: Tensor, labels: Tensor, k: int = 10, chunk_size: int = 1024
) -> float:
    """Mean over classes of the largest connected share of the class's kNN subgraph.

    X-CLR's Table 9 reports an "intra-class connectivity" re-implemented from Zhang et al.
    2023, without a formula (and on a scale above 1, unlike this one). simgraph's exact
    definition, on the symmetric cosine kNN graph E of the module docstring (built on ALL
    samples, so a sample's k neighbours may lie in other classes): for each class c present
    in ``labels``, with ``I_c = {i : y_i = c}`` and ``n_c = |I_c|``,

        G_c  = (I_c, { {i, j} ∈ E : i, j ∈ I_c })      (induced subgraph: intra-class edges)
        LCC_c = number of nodes in the largest connected component of G_c
        intra_class_connectivity = (1 / #classes) · Σ_c LCC_c / n_c

    Each class weighs the same whatever its size. A class that is one connected piece gives
    1; a class split into two disconnected halves gives 0.5; a one-sample class gives 1.
    Result in (0, 1].

    Args:
        features: [N, D] float, any scale.
        labels: [N] integer class ids ≥ 0 (no unlabelled -1).
        k: neighbours per sample, 1 ≤ k ≤ N − 1.
        chunk_size: rows per chunk of the kNN search (memory O(chunk_size · N)).

    Raises:
        ValueError: as :func:`label_error`.
    """
    per_class = class_connectivity(features, labels, k, chunk_size)
    return float(np.mean(list(per_class.values())))


def graph_metrics(
    features: Tensor, labels: Tensor, k: int = 10, chunk_size: int = 1024
) -> dict[str, float]:
    """``{"label_error": …, "intra_class_connectivity": …}`` from one kNN graph.

    Equal to :func:`label_error` and :func:`intra_class_connectivity` with the same
    arguments, but builds the kNN graph once. Raises as :func:`label_error`.
    """
    lo, hi, y = _graph_inputs(features, labels, k, chunk_size)
    per_class = _class_connectivity(lo, hi, y)
    return {
        "label_error": _label_error(lo, hi, y),
        "intra_class_connectivity": float(np.mean(list(per_class.values()))),
    }
