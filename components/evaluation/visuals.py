"""What an evaluation shows besides its numbers: a 2-D map of the query embeddings, a grid of
nearest neighbours and the kNN recall of each class (``simgraph evaluate``'s report.md).

* **Embedding map** (:func:`embedding_map`): t-SNE (van der Maaten & Hinton 2008,
  ``sklearn.manifold.TSNE``) of at most :data:`MAP_POINTS` query images, drawn coloured by
  label. The features are L2-normalised first, so the Euclidean distances t-SNE preserves are
  monotone in the cosine the kNN ranks by (``‖a − b‖² = 2 − 2 cos``), and reduced to
  :data:`MAP_PCA_DIMS` dimensions by PCA when wider (the usual t-SNE preprocessing: it
  removes noise dimensions and makes the neighbour search cheap). The subsample is stratified
  by label with a fixed seed (:func:`stratified_subsample`), so every class is on the map and
  the same run gives the same picture. t-SNE keeps neighbourhoods, not distances between
  clusters: the map shows which images an encoder groups, not how far apart the groups are.
  UMAP (``umap-learn``) would be faster at hundreds of thousands of points; at the 2,000
  points drawn here t-SNE takes seconds on a 2-core CPU and needs no new dependency.
* **Nearest neighbours** (:func:`nearest_neighbours`, :func:`plot_neighbours`): for a few
  query images spread over the labels (:func:`pick_queries`), their k nearest bank (train)
  images by the cosine of the features the kNN classifier uses; a neighbour of another label
  gets a red frame.
* **Per-class recall** (:func:`per_class_recall`): the share of each label's query images the
  kNN classifier gets right (its top-1 hits averaged per label), with a bootstrap interval
  over that label's images (:func:`components.evaluation.intervals.mean_interval`), worst
  first.

The images of the grid are read by :func:`centre_views` through the evaluation's own
:class:`~components.data.reader.ViewLoader` (the centre view the features were computed from),
un-normalised for display; nothing here decodes images itself.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from components.evaluation.intervals import Interval, mean_interval

__all__ = [
    "ClassRecall",
    "EmbeddingMap",
    "GridLayout",
    "MAP_POINTS",
    "NeighbourGrid",
    "centre_views",
    "embedding_map",
    "nearest_neighbours",
    "per_class_recall",
    "pick_queries",
    "plot_map",
    "plot_neighbours",
    "pyplot",
    "stratified_subsample",
    "to_uint8",
    "with_images",
    "write_map_csv",
]

MAP_POINTS = 2000  # t-SNE is O(n log n) per iteration: seconds at 2,000 points on 2 cores
MAP_PCA_DIMS = 50
MAP_PERPLEXITY = 30.0  # sklearn's default; lowered for tiny query splits (it must be < n)
SEED = 0  # fixed: the same run evaluated twice draws the same map and picks the same queries
GRID_QUERIES = 8
GRID_K = 5
WRONG = "#d62728"  # the red frame of a neighbour of another label


# ---------------------------------------------------------------------------------------------
# Per-class recall.


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassRecall:
    """kNN top-1 recall of one label over its query images."""

    label: int
    name: str
    n: int  # query images of this label
    recall: Interval  # mean of their hits, with its bootstrap interval (NaN when n = 0)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "class": self.name, "n": self.n, **self.recall.as_dict()}


def per_class_recall(hits: np.ndarray | Tensor, labels: np.ndarray | Tensor,
                     classes: Sequence[str]) -> list[ClassRecall]:
    """Per label: the mean of ``hits`` [Q] (0/1 per query image) over the images of that label
    (``labels`` [Q], ids into ``classes``), worst first (ties: by label id); labels without
    query images last.

    Raises:
        ValueError: ``hits`` and ``labels`` differ in length, or a label is outside
            ``classes``.
    """
    h = np.asarray(hits, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.int64).ravel()
    if h.shape != y.shape:
        raise ValueError(f"hits [{h.size}] and labels [{y.size}] must have one entry per image")
    if y.size and (y.min() < 0 or y.max() >= len(classes)):
        raise ValueError(f"labels must lie in [0, {len(classes)}); got [{y.min()}, {y.max()}]")
    rows = [ClassRecall(label=c, name=name, n=int((y == c).sum()),
                        recall=mean_interval(h[y == c]))
            for c, name in enumerate(classes)]
    return sorted(rows, key=lambda r: (r.n == 0, r.recall.value if r.n else 0.0, r.label))


# ---------------------------------------------------------------------------------------------
# Embedding map.


@dataclasses.dataclass(kw_only=True)
class EmbeddingMap:
    """A 2-D t-SNE map of (a subsample of) the query images; row ``i`` of every field is one
    point."""

    index: np.ndarray  # [P] int64: rows of the query split, ascending
    labels: np.ndarray  # [P] int64: what the evaluation scores against (class or group)
    xy: np.ndarray  # [P, 2] float32
    total: int  # query images the subsample was drawn from
    perplexity: float
    pca_dims: int | None  # dimensions after PCA; None = none needed

    def __len__(self) -> int:
        return len(self.index)


def stratified_subsample(labels: np.ndarray | Tensor, cap: int, seed: int = SEED) -> np.ndarray:
    """At most ``cap`` row indices of ``labels`` [N], ascending: all of them when N ≤ ``cap``,
    else each label's share in proportion to its size, each label at least once while
    ``cap`` ≥ the number of labels.

    Each label's rows are put in a seeded random order; the j-th row of a label of size n_c
    gets the key j / n_c, and the ``cap`` smallest keys are kept (ties: by label). Every
    label's first row has key 0, and a label keeps about ``cap · n_c / N`` rows.
    """
    y = np.asarray(labels, dtype=np.int64).ravel()
    if cap < 1:
        raise ValueError(f"cap={cap} must be >= 1")
    if len(y) <= cap:
        return np.arange(len(y), dtype=np.int64)
    rng = np.random.default_rng(seed)
    keys = np.empty(len(y), dtype=np.float64)
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        keys[rng.permutation(rows)] = np.arange(len(rows)) / len(rows)
    order = np.lexsort((y, keys))  # by key, then label
    return np.sort(order[:cap]).astype(np.int64)


def embedding_map(features: Tensor | np.ndarray, labels: Tensor | np.ndarray, *,
                  cap: int = MAP_POINTS, seed: int = SEED) -> EmbeddingMap:
    """t-SNE of ``features`` [N, D] (labels [N]) on at most ``cap`` points (module docstring).

    Fewer than 4 points cannot be embedded by t-SNE (its perplexity must lie in (1, n)); they
    are placed on a line.
    """
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    x = torch.as_tensor(features).detach()
    y = np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64).ravel()
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"features {tuple(x.shape)} must be [N, D] with one label per row "
                         f"({len(y)} labels)")
    index = stratified_subsample(y, cap, seed)
    # only the drawn rows leave the features' device
    drawn = F.normalize(x[torch.as_tensor(index, device=x.device)].float().cpu(), dim=1)
    pts = drawn.numpy().astype(np.float64)
    n = len(index)
    pca_dims = None
    if pts.shape[1] > MAP_PCA_DIMS and n > MAP_PCA_DIMS:
        pca_dims = MAP_PCA_DIMS
        pts = PCA(MAP_PCA_DIMS, svd_solver="full", random_state=seed).fit_transform(pts)
    # sklearn requires perplexity < n; a third of n keeps a few neighbours' worth of mass
    # for tiny query splits (the tests' 32 images).
    perplexity = float(min(MAP_PERPLEXITY, max(1.5, (n - 1) / 3)))
    if n < 4:
        xy = np.stack([np.arange(n, dtype=np.float64), np.zeros(n)], axis=1)
    else:
        xy = TSNE(2, perplexity=perplexity, init="pca", learning_rate="auto",
                  random_state=seed).fit_transform(pts)
    return EmbeddingMap(index=index, labels=y[index], xy=xy.astype(np.float32), total=len(y),
                        perplexity=perplexity, pca_dims=pca_dims)


def write_map_csv(m: EmbeddingMap, classes: Sequence[str], path: Path) -> None:
    """``index,label,class,x,y``: one row per point of the map (``index``: row of the query
    split, in its file order)."""
    from components.io.files import atomic_open

    with atomic_open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["index", "label", "class", "x", "y"])
        for i, c, (px, py) in zip(m.index.tolist(), m.labels.tolist(), m.xy.tolist(),
                                  strict=True):
            w.writerow([i, c, classes[c], f"{px:.4f}", f"{py:.4f}"])


def _colours(n: int) -> list[Any]:
    """``n`` distinct colours: matplotlib's qualitative tables up to 20, else a hue wheel."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["hsv"](i / n) for i in range(n)]


def plot_map(m: EmbeddingMap, classes: Sequence[str], path: Path, title: str) -> None:
    """``path``: the map's points coloured by label, a legend while there are ≤ 20 labels."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    colours = _colours(len(classes))
    size = 14 if len(m) <= 500 else 5
    for c, name in enumerate(classes):
        at = m.labels == c
        if at.any():
            ax.scatter(m.xy[at, 0], m.xy[at, 1], s=size, color=colours[c], label=name,
                       linewidths=0, alpha=0.85)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    if len(classes) <= 20:
        ax.legend(fontsize=7, markerscale=2 if size < 10 else 1, loc="center left",
                  bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Nearest neighbours.


@dataclasses.dataclass(kw_only=True)
class NeighbourGrid:
    """A few query images and their nearest bank images; row ``q`` is query ``q``."""

    queries: np.ndarray  # [Q] int64: rows of the query split
    query_labels: np.ndarray  # [Q] int64
    neighbours: np.ndarray  # [Q, k] int64: rows of the bank split, nearest first
    neighbour_labels: np.ndarray  # [Q, k] int64
    similarities: np.ndarray  # [Q, k] float32 cosine
    query_images: np.ndarray | None = None  # [Q, H, W, 3] uint8 (centre views)
    neighbour_images: np.ndarray | None = None  # [Q, k, H, W, 3] uint8

    @property
    def wrong(self) -> np.ndarray:
        """[Q, k] bool: the neighbour's label differs from its query's."""
        return self.neighbour_labels != self.query_labels[:, None]


def pick_queries(labels: np.ndarray | Tensor, n: int = GRID_QUERIES,
                 seed: int = SEED) -> np.ndarray:
    """``n`` rows of ``labels`` [N] (fewer if N < n), spread over the labels: with at least
    ``n`` labels, one image of each of ``n`` labels evenly spaced over the label ids; else
    the labels in turn (round robin). Within a label, images in a seeded random order."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    present = np.unique(y)
    if len(present) == 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(seed)
    pools = {int(c): list(rng.permutation(np.flatnonzero(y == c))) for c in present}
    if len(present) >= n:
        chosen = present[np.round(np.linspace(0, len(present) - 1, n)).astype(int)]
        return np.array([pools[int(c)][0] for c in chosen], dtype=np.int64)
    out: list[int] = []
    while len(out) < min(n, len(y)):
        for c in present:
            if pools[int(c)] and len(out) < n:
                out.append(int(pools[int(c)].pop(0)))
    return np.array(out, dtype=np.int64)


@torch.no_grad()
def nearest_neighbours(bank_features: Tensor, bank_labels: Tensor, query_features: Tensor,
                       query_labels: Tensor, queries: np.ndarray | Sequence[int],
                       k: int = GRID_K) -> NeighbourGrid:
    """The ``k`` nearest rows of ``bank_features`` [N, D] to each query row ``queries`` [Q]
    of ``query_features`` [M, D], by cosine in float32 (what
    :func:`components.evaluation.knn.nearest` ranks by; it returns no indices), on the bank's
    device: ``[Q, N]`` similarities, no normalised copy of the bank. ``k`` is capped at N."""
    dev = bank_features.device
    q = torch.as_tensor(np.asarray(queries, dtype=np.int64))
    bank = bank_features.detach().float()
    query = F.normalize(query_features.detach()[q.to(query_features.device)].float().to(dev),
                        dim=1)
    sims = (query @ bank.T) / bank.norm(dim=1).clamp_min(1e-12)  # F.normalize's eps
    top, idx = sims.topk(min(k, len(bank)), dim=1, largest=True, sorted=True)
    idx = idx.cpu()
    return NeighbourGrid(
        queries=q.numpy(), query_labels=query_labels.detach().cpu().long()[q].numpy(),
        neighbours=idx.numpy(), neighbour_labels=bank_labels.detach().cpu().long()[idx].numpy(),
        similarities=top.cpu().numpy(),
    )


def to_uint8(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Normalised images ``[B, 3, H, W]`` (as the reader gives them) → ``[B, H, W, 3]``
    uint8: the reader's ``(x − 255·mean) / (255·std)`` undone."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    x = (images.detach().float().cpu() * s + m).clamp(0, 1) * 255
    return x.round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def centre_views(loader: Iterable[Any], rows: Iterable[int], mean: Sequence[float],
                 std: Sequence[float]) -> dict[int, np.ndarray]:
    """``{row: [H, W, 3] uint8}``: the centre view of each wanted row of a split, from an
    evaluation loader (a :class:`~components.data.reader.ViewLoader` with ``train=False``:
    file order, every image once; pass the one the features came from, so its compiled
    pipeline is reused). Stops after the batch holding the last wanted row.

    Raises:
        ValueError: a wanted row is past the end of the split.
    """
    want = sorted({int(r) for r in rows})
    out: dict[int, np.ndarray] = {}
    if not want:
        return out
    start = 0
    for batch in loader:
        n = len(batch.labels)
        here = [r for r in want if start <= r < start + n]
        if here:
            views = batch.images[torch.as_tensor([r - start for r in here]), 0]  # [h, 3, H, W]
            out.update(zip(here, to_uint8(views, mean, std), strict=True))
        start += n
        if start > want[-1]:
            break
    if len(out) != len(want):
        raise ValueError(f"rows {[r for r in want if r not in out]} are past the end of the "
                         f"split ({start} images)")
    return out


def with_images(g: NeighbourGrid, query_loader: Iterable[Any], bank_loader: Iterable[Any],
                mean: Sequence[float], std: Sequence[float]) -> NeighbourGrid:
    """``g`` with its query and neighbour images (centre views, uint8) read by
    :func:`centre_views` from the loaders of the query and the bank split."""
    q = centre_views(query_loader, g.queries.tolist(), mean, std)
    b = centre_views(bank_loader, g.neighbours.ravel().tolist(), mean, std)
    if not q:  # no query image: nothing to draw, but the shapes stay consistent
        return dataclasses.replace(g, query_images=np.zeros((0, 1, 1, 3), np.uint8),
                                   neighbour_images=np.zeros((0, *g.neighbours.shape[1:],
                                                              1, 1, 3), np.uint8))
    queries = np.stack([q[i] for i in g.queries.tolist()])
    neighbours = np.stack([b[i] for i in g.neighbours.ravel().tolist()])
    return dataclasses.replace(g, query_images=queries, neighbour_images=neighbours.reshape(
        *g.neighbours.shape, *neighbours.shape[1:]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tile:
    """One drawn tile of the neighbour grid, as read back from the figure."""

    row: int
    col: int  # 0 = the query
    title: str
    has_image: bool
    marked_wrong: bool  # drawn with the red frame


@dataclasses.dataclass(frozen=True)
class GridLayout:
    """What :func:`plot_neighbours` drew: ``rows`` × ``cols`` tiles."""

    rows: int
    cols: int
    tiles: list[Tile]

    def at(self, row: int, col: int) -> Tile:
        return next(t for t in self.tiles if (t.row, t.col) == (row, col))


def plot_neighbours(g: NeighbourGrid, classes: Sequence[str], path: Path,
                    title: str) -> GridLayout:
    """``path``: one row per query — the query image, then its neighbours nearest first, each
    titled with its label and cosine similarity, a neighbour of another label in a red frame.
    Returns the layout read back from the drawn figure.

    Raises:
        ValueError: the grid carries no images (:func:`centre_views` fills them).
    """
    if g.query_images is None or g.neighbour_images is None:
        raise ValueError("the neighbour grid has no images: fill query_images and "
                         "neighbour_images first")
    plt = pyplot()
    rows, k = g.neighbours.shape
    cols = 1 + k
    height = 1.42 * rows + 0.35
    fig, axes = plt.subplots(rows, cols, figsize=(1.25 * cols, height), squeeze=False)
    wrong = g.wrong
    for r in range(rows):
        cells: list[tuple[np.ndarray, str, bool | None]] = [
            (g.query_images[r], f"query\n{classes[g.query_labels[r]]}", None)]
        cells += [(g.neighbour_images[r, j],
                   f"{classes[g.neighbour_labels[r, j]]}\n{g.similarities[r, j]:.3f}",
                   bool(wrong[r, j])) for j in range(k)]
        for c, (img, text, bad) in enumerate(cells):
            ax = axes[r, c]
            ax.imshow(img, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(text, fontsize=6.5, color=WRONG if bad else "black", pad=2)
            for spine in ax.spines.values():
                if bad:  # another label: a thick red frame
                    spine.set_edgecolor(WRONG)
                    spine.set_linewidth(3)
                elif c == 0:  # the query: a black frame
                    spine.set_linewidth(1.5)
                else:
                    spine.set_visible(False)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(pad=0.4, h_pad=0.5, w_pad=0.3, rect=(0, 0, 1, 1 - 0.3 / height))
    fig.savefig(path, dpi=110)
    layout = GridLayout(rows=rows, cols=cols, tiles=[
        Tile(row=r, col=c, title=axes[r, c].get_title(), has_image=bool(axes[r, c].images),
             marked_wrong=_framed(axes[r, c]))
        for r in range(rows) for c in range(cols)])
    plt.close(fig)
    return layout


def _framed(ax: Any) -> bool:
    """Whether ``ax`` carries the red frame of a wrong-label neighbour."""
    from matplotlib.colors import to_rgba

    spine = ax.spines["left"]
    return bool(spine.get_visible()) and math.isclose(spine.get_linewidth(), 3) and \
        to_rgba(spine.get_edgecolor()) == to_rgba(WRONG)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only: no display on a cluster node);
    every evaluation plot draws through it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
