"""Graph metrics on frozen embeddings (components/evaluation/graph.py): SINCERE target–noise
separation, X-CLR class-similarity matrix, kNN-graph label error and intra-class connectivity.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from components.evaluation import graph
from components.evaluation.graph import (
    class_connectivity,
    class_similarity_matrix,
    graph_metrics,
    intra_class_connectivity,
    knn_graph,
    label_error,
    target_noise_separation,
)


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def _clusters(
    sizes: list[int], d: int = 8, spread: float = 0.05, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tight clusters around orthogonal axes e_0, e_1, …: cluster c has label c."""
    gen = torch.Generator().manual_seed(seed)
    feats, labels = [], []
    for c, size in enumerate(sizes):
        center = torch.zeros(d)
        center[c] = 1.0
        feats.append(center + spread * torch.randn(size, d, generator=gen))
        labels.append(torch.full((size,), c, dtype=torch.int64))
    return torch.cat(feats), torch.cat(labels)


def _brute_knn(x: np.ndarray, k: int) -> np.ndarray:
    """float64: argsort of cosine similarity, self excluded, descending."""
    u = _unit(x.astype(np.float64))
    sim = u @ u.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def _brute_graph_metrics(x: np.ndarray, y: np.ndarray, k: int) -> tuple[float, dict[int, float]]:
    """Pure-Python label error and per-class LCC share (BFS) on the symmetric kNN graph."""
    nbrs = _brute_knn(x, k)
    edges = {(min(i, int(j)), max(i, int(j))) for i in range(len(x)) for j in nbrs[i]}
    error = sum(y[a] != y[b] for a, b in edges) / len(edges)
    adj: dict[int, set[int]] = {i: set() for i in range(len(x))}
    for a, b in edges:
        if y[a] == y[b]:
            adj[a].add(b)
            adj[b].add(a)
    share = {}
    for c in sorted(set(y.tolist())):
        members = [i for i in range(len(x)) if y[i] == c]
        seen: set[int] = set()
        best = 0
        for start in members:
            if start in seen:
                continue
            stack, size = [start], 0
            seen.add(start)
            while stack:
                node = stack.pop()
                size += 1
                for nb in adj[node]:
                    if nb not in seen:
                        seen.add(nb)
                        stack.append(nb)
            best = max(best, size)
        share[c] = best / len(members)
    return error, share


# --------------------------------------------------------------------------- separation


def _hand_problem() -> tuple[torch.Tensor, ...]:
    # Integer vectors with norms 1, 2 or 5, so every cosine is a simple fraction.
    train = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [3.0, 4.0], [0.0, -2.0]])
    train_y = torch.tensor([0, 0, 1, 1, 2])
    test = torch.tensor(
        [[4.0, 3.0], [2.0, 0.0], [0.0, -1.0], [-4.0, 3.0], [-1.0, -1.0], [0.0, 3.0]]
    )
    test_y = torch.tensor([0, 1, 2, 1, 2, 0])
    return train, train_y, test, test_y


def test_separation_hand_example_exact() -> None:
    train, train_y, test, test_y = _hand_problem()
    r = target_noise_separation(train, train_y, test, test_y)
    s = 1 / math.sqrt(2)
    # (4,3)/5, class 0: same (1,0)→.8, (0,1)→.6; other (3,4)/5→.96, (-1,0)→-.8, (0,-1)→-.6
    # (1,0),   class 1: same (-1,0)→-1, (3,4)/5→.6; other (1,0)→1
    # (0,-1),  class 2: same (0,-1)→1; other (1,0)→0, (0,1)→-1, (-1,0)→0, (3,4)/5→-.8
    # (-4,3)/5, class 1: same (-1,0)→.8, (3,4)/5→0; other (0,1)→.6, (1,0)→-.8, (0,-1)→-.6
    # (-1,-1)/√2, class 2: same (0,-1)→1/√2; other (-1,0)→1/√2 (exact tie), (3,4)/5→-.99
    # (0,1),   class 0: same (0,1)→1; other (3,4)/5→.8
    target = [0.8, 0.6, 1.0, 0.8, s, 1.0]
    noise = [0.96, 1.0, 0.0, 0.6, s, 0.8]
    torch.testing.assert_close(r.target_sims, torch.tensor(target), atol=1e-6, rtol=0)
    torch.testing.assert_close(r.noise_sims, torch.tensor(noise), atol=1e-6, rtol=0)
    assert r.target_sims.dtype == torch.float32 and r.target_sims.device.type == "cpu"
    # Even count: mean of the two middle values (numpy), not torch.median's lower one.
    assert r.target_median == pytest.approx((0.8 + 0.8) / 2, abs=1e-6)
    assert r.noise_median == pytest.approx((s + 0.8) / 2, abs=1e-6)
    assert r.margin == pytest.approx(0.8 - (s + 0.8) / 2, abs=1e-6)
    assert r.margin == pytest.approx(float(np.median(target) - np.median(noise)), abs=1e-6)
    # noise ≥ target for rows 0, 1 and the exact tie in row 4.
    assert r.overlap == 0.5


def test_separation_chunking_and_scale_invariance() -> None:
    train, train_y, test, test_y = _hand_problem()
    ref = target_noise_separation(train, train_y, test, test_y)
    gen = torch.Generator().manual_seed(3)
    scaled_train = train * (0.01 + 10 * torch.rand(train.shape[0], 1, generator=gen))
    scaled_test = test * (0.01 + 10 * torch.rand(test.shape[0], 1, generator=gen))
    for chunk in (1, 4, 1024):
        r = target_noise_separation(scaled_train, train_y, scaled_test, test_y, chunk_size=chunk)
        torch.testing.assert_close(r.target_sims, ref.target_sims, atol=1e-6, rtol=0)
        torch.testing.assert_close(r.noise_sims, ref.noise_sims, atol=1e-6, rtol=0)
        assert r.margin == pytest.approx(ref.margin, abs=1e-6)
        assert r.overlap == ref.overlap


def test_separation_separated_clusters_and_random_reference() -> None:
    x, y = _clusters([12, 12, 12], seed=1)
    q, qy = _clusters([5, 5, 5], seed=2)
    r = target_noise_separation(x, y, q, qy, chunk_size=4)
    assert r.overlap == 0.0
    assert r.margin > 0.5
    assert bool((r.target_sims > r.noise_sims).all())
    # Random data vs a float64 reference (odd M: the plain middle value).
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(30, 5, generator=gen), torch.randint(0, 3, (30,), generator=gen)
    q, qy = torch.randn(17, 5, generator=gen), torch.randint(0, 3, (17,), generator=gen)
    sim = _unit(q.double().numpy()) @ _unit(x.double().numpy()).T
    same = qy.numpy()[:, None] == y.numpy()[None, :]
    tgt = np.where(same, sim, -np.inf).max(axis=1)
    noi = np.where(same, -np.inf, sim).max(axis=1)
    r = target_noise_separation(x, y, q, qy, chunk_size=5)
    np.testing.assert_allclose(r.target_sims.numpy(), tgt, atol=1e-6)
    np.testing.assert_allclose(r.noise_sims.numpy(), noi, atol=1e-6)
    assert r.margin == pytest.approx(float(np.median(tgt) - np.median(noi)), abs=1e-6)
    assert r.overlap == float(np.mean(noi >= tgt))


def test_separation_errors() -> None:
    train, train_y, test, test_y = _hand_problem()
    with pytest.raises(ValueError, match=r"test class\(es\) \[7\]"):
        target_noise_separation(train, train_y, test, torch.tensor([0, 1, 2, 7, 2, 0]))
    with pytest.raises(ValueError, match="at least 2 classes"):
        target_noise_separation(train, torch.zeros(5, dtype=torch.int64), test, test_y * 0)
    with pytest.raises(ValueError, match="D=3 but train_features has D=2"):
        target_noise_separation(train, train_y, torch.ones(6, 3), test_y)
    with pytest.raises(ValueError, match=r"test_labels has shape \(5,\); expected \[6\]"):
        target_noise_separation(train, train_y, test, test_y[:5])
    with pytest.raises(ValueError, match="unlabelled"):
        target_noise_separation(train, torch.tensor([0, -1, 1, 1, 2]), test, test_y)
    with pytest.raises(ValueError, match="M=0"):
        target_noise_separation(train, train_y, test[:0], test_y[:0])
    bad = test.clone()
    bad[2, 1] = math.nan
    with pytest.raises(ValueError, match="test_features has 1 non-finite"):
        target_noise_separation(train, train_y, bad, test_y)
    with pytest.raises(ValueError, match="chunk_size=0"):
        target_noise_separation(train, train_y, test, test_y, chunk_size=0)
    with pytest.raises(ValueError, match="dtype torch.float32; expected an integer"):
        target_noise_separation(train, train_y.float(), test, test_y)


# --------------------------------------------------------------------------- class matrix


def test_class_similarity_matrix_matches_double_loop() -> None:
    gen = torch.Generator().manual_seed(5)
    c = 6
    # class 3 absent, class 4 has one sample, the rest several; one all-zero row (cos 0).
    y = torch.tensor([0] * 7 + [1] * 5 + [2] * 9 + [4] + [5] * 3)
    x = torch.randn(y.shape[0], 4, generator=gen) * (0.1 + torch.rand(y.shape[0], 1) * 5)
    x[2] = 0.0
    got = class_similarity_matrix(x, y, c)
    assert got.shape == (c, c) and got.dtype == torch.float32 and got.device.type == "cpu"

    u = _unit(x.double().numpy())
    yn = y.numpy()
    ref = np.full((c, c), np.nan)
    for a in range(c):
        for b in range(c):
            vals = [
                float(u[i] @ u[j])
                for i in range(len(yn))
                for j in range(len(yn))
                if yn[i] == a and yn[j] == b and i != j
            ]
            if vals:
                ref[a, b] = np.mean(vals)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6, equal_nan=True)
    assert math.isnan(got[4, 4]) and not math.isnan(got[4, 0])  # one sample: NaN diagonal
    assert bool(got[3].isnan().all()) and bool(got[:, 3].isnan().all())  # absent class
    torch.testing.assert_close(got, got.T, equal_nan=True)


def test_class_similarity_matrix_errors() -> None:
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match=r"label\(s\) ≥ num_classes=2 \(e.g. 2\)"):
        class_similarity_matrix(x, y, 2)
    with pytest.raises(ValueError, match="num_classes=0"):
        class_similarity_matrix(x, y, 0)
    with pytest.raises(ValueError, match="unlabelled"):
        class_similarity_matrix(x, torch.tensor([0, 1, -1, 0, 1, 2]), 3)
    x[0, 0] = math.inf
    with pytest.raises(ValueError, match="non-finite"):
        class_similarity_matrix(x, y, 3)


# --------------------------------------------------------------------------- kNN graph


def test_knn_graph_matches_brute_force_and_chunking() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(50, 16, generator=gen)
    want = _brute_knn(x.numpy(), 7)
    got = knn_graph(x, 7)
    assert got.dtype == torch.int64 and got.shape == (50, 7) and got.device.type == "cpu"
    np.testing.assert_array_equal(got.numpy(), want)
    assert not bool((got == torch.arange(50)[:, None]).any())  # never itself
    for chunk in (1, 7, 49):
        assert torch.equal(knn_graph(x, 7, chunk_size=chunk), got)
    assert torch.equal(knn_graph(x * (torch.rand(50, 1) * 9 + 0.1), 7), got)  # scale-free
    np.testing.assert_array_equal(knn_graph(x, 49).numpy(), _brute_knn(x.numpy(), 49))


def test_knn_graph_errors() -> None:
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"k=5 is not allowed for N=5.*1 ≤ k ≤ 4"):
        knn_graph(x, 5)
    with pytest.raises(ValueError, match="k=0"):
        knn_graph(x, 0)
    with pytest.raises(ValueError, match="not a bool"):
        knn_graph(x, True)
    with pytest.raises(ValueError, match="expected a 2-D"):
        knn_graph(x[0], 1)
    with pytest.raises(ValueError, match="expected a floating-point"):
        knn_graph(torch.ones(5, 3, dtype=torch.int64), 1)


# --------------------------------------------------------------------------- label error


def _circle(degrees: list[float]) -> torch.Tensor:
    rad = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1).float()


def test_label_error_constructed_circle() -> None:
    # Angles with distinct gaps 10, 20, 30, 40, 50 (and 210 around the back): with k = 1,
    # 0→10, 10→0, 30→10, 60→30, 100→60, 150→100, so the symmetric graph is the chain
    # 0–10–30–60–100–150 with 5 edges (the mutual pair 0↔10 is one edge).
    x = _circle([0, 10, 30, 60, 100, 150])
    y = torch.tensor([0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(knn_graph(x, 1).numpy()[:, 0], [1, 0, 1, 2, 3, 4])
    # Crossing edges: 10–30 and 60–100 → 2 / 5 (counting directed picks would give 2 / 6).
    assert label_error(x, y, k=1) == pytest.approx(2 / 5)
    # Intra-class pieces: class 0 = {0, 10} and {100, 150} → 2/4; class 1 = {30, 60} → 1.
    assert class_connectivity(x, y, k=1) == {0: 0.5, 1: 1.0}
    assert intra_class_connectivity(x, y, k=1) == pytest.approx(0.75)


def test_separated_clusters_zero_error_full_connectivity() -> None:
    # Cluster size 10, k = 5: all 5 neighbours lie in the own tight cluster (label error 0),
    # and every node has ≥ 5 neighbours inside it, so any component has ≥ 6 of the 10
    # nodes: two components would need 12 > 10, hence each class is connected.
    x, y = _clusters([10, 10, 10, 10])
    assert label_error(x, y, k=5) == 0.0
    assert intra_class_connectivity(x, y, k=5) == 1.0
    assert graph_metrics(x, y, k=5) == {"label_error": 0.0, "intra_class_connectivity": 1.0}


def test_connectivity_split_class_is_half() -> None:
    # Class 0 = two tight halves of 4 at +e0 and −e0 (cosine ≈ −1 between them), classes 1,
    # 2 = tight clusters of 4 at e1, e2, class 3 = one sample at e3. With k = 3 every
    # non-singleton point links exactly to the 3 others of its own group, so class 0's
    # subgraph is two complete K4's: largest share 4/8. The singleton links across classes
    # (no intra edge) and counts as 1.
    gen = torch.Generator().manual_seed(7)
    eye = torch.eye(4)
    centers = [eye[0], -eye[0], eye[1], eye[2]]
    x = torch.cat([c + 0.01 * torch.randn(4, 4, generator=gen) for c in centers] + [eye[3:]])
    y = torch.tensor([0] * 8 + [1] * 4 + [2] * 4 + [3])
    per_class = class_connectivity(x, y, k=3)
    assert per_class == {0: 0.5, 1: 1.0, 2: 1.0, 3: 1.0}
    assert intra_class_connectivity(x, y, k=3) == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    # Relabelling the −e0 half as its own class makes every class connected.
    y2 = y.clone()
    y2[4:8] = 9
    assert intra_class_connectivity(x, y2, k=3) == 1.0
    assert label_error(x, y2, k=3) > 0  # only the singleton's 3 edges cross
    assert label_error(x, y2, k=3) == pytest.approx(3 / (4 * 6 + 3))


def test_graph_metrics_match_brute_force_random() -> None:
    gen = torch.Generator().manual_seed(8)
    # Overlapping noisy clusters, so classes are partly connected and edges partly cross.
    x, y = _clusters([15, 12, 9, 1], d=6, spread=0.6, seed=8)
    x = x + 0.1 * torch.randn(x.shape, generator=gen)
    for k in (1, 2, 4):
        err, share = _brute_graph_metrics(x.numpy(), y.numpy(), k)
        assert label_error(x, y, k=k, chunk_size=5) == pytest.approx(err, abs=1e-12)
        assert class_connectivity(x, y, k=k) == pytest.approx(share, abs=1e-12)
        both = graph_metrics(x, y, k=k)
        assert both["label_error"] == pytest.approx(err, abs=1e-12)
        assert both["intra_class_connectivity"] == pytest.approx(np.mean(list(share.values())))


def test_union_find_fallback_matches_scipy_path() -> None:
    gen = torch.Generator().manual_seed(9)
    n = 200
    lo = torch.randint(0, n, (150,), generator=gen).numpy()
    hi = torch.randint(0, n, (150,), generator=gen).numpy()
    a = graph._components_union_find(n, lo, hi)
    b = graph._components(n, lo, hi)
    # Same partition: component ids agree up to renaming.
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    assert len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def test_label_error_shuffled_labels_near_chance() -> None:
    # Labels independent of the features: every edge joins two distinct samples, so over
    # random permutations P(same label) = Σ_c n_c (n_c − 1) / (N (N − 1)) exactly. With
    # balanced classes, indicators of edges sharing a node are uncorrelated
    # (Σ p³ = (Σ p²)² for uniform p), so the SD is ≈ sqrt(p (1 − p) / |E|) ≤ 0.0112 for
    # |E| ≥ N k / 2 = 1500 (measured over 10 seeds: 0.013); the tolerance 0.06 is > 4.5 SD.
    gen = torch.Generator().manual_seed(10)
    n, c, k = 600, 4, 5
    x = torch.randn(n, 16, generator=gen)
    y = torch.arange(n) % c
    y = y[torch.randperm(n, generator=gen)]
    expected = 1 - c * (n // c) * (n // c - 1) / (n * (n - 1))
    assert label_error(x, y, k=k) == pytest.approx(expected, abs=0.06)


def test_graph_metric_errors() -> None:
    x, y = _clusters([3, 3])
    for fn in (label_error, intra_class_connectivity, class_connectivity, graph_metrics):
        with pytest.raises(ValueError, match="k=6 is not allowed for N=6"):
            fn(x, y, k=6)
        with pytest.raises(ValueError, match="unlabelled"):
            fn(x, torch.tensor([0, 0, -1, 1, 1, 1]), k=2)
        with pytest.raises(ValueError, match=r"labels has shape \(5,\); expected \[6\]"):
            fn(x, y[:5], k=2)
        bad = x.clone()
        bad[1, 1] = -math.inf
        with pytest.raises(ValueError, match="features has 1 non-finite"):
            fn(bad, y, k=2)
