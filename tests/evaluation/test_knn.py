"""Weighted kNN classifier (Wu et al. 2018) and its accuracy helpers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from components.evaluation.knn import (
    knn_accuracy,
    knn_correct,
    knn_top1,
    sharded_knn_top1,
    weighted_knn_predict,
)
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded


def _reference_scores(
    train: np.ndarray,
    labels: np.ndarray,
    query: np.ndarray,
    k: int,
    num_classes: int,
    temperature: float,
    exclude_self: bool = False,
) -> np.ndarray:
    """float64 loops: score[i, c] = Σ over the k most cosine-similar train rows of label c."""
    out = np.zeros((query.shape[0], num_classes), dtype=np.float64)
    for i in range(query.shape[0]):
        q = query[i] / math.sqrt(float(np.dot(query[i], query[i])))
        sims = []
        for j in range(train.shape[0]):
            if exclude_self and i == j:
                continue
            x = train[j] / math.sqrt(float(np.dot(train[j], train[j])))
            sims.append((float(np.dot(q, x)), j))
        sims.sort(key=lambda pair: -pair[0])
        for s, j in sims[:k]:
            out[i, int(labels[j])] += math.exp(s / temperature)
    return out


def _random_problem(n: int = 40, q: int = 25, d: int = 6, c: int = 4):
    gen = torch.Generator().manual_seed(1)
    train = torch.randn(n, d, generator=gen, dtype=torch.float64) * 3.0
    query = torch.randn(q, d, generator=gen, dtype=torch.float64) * 0.5
    labels = torch.randint(0, c, (n,), generator=gen)
    return train, labels, query


@pytest.mark.parametrize("temperature", [0.05, 0.1, 0.5, 2.0])
def test_matches_float64_reference(temperature: float) -> None:
    train, labels, query = _random_problem()
    ks = [1, 3, 10]
    # chunk_size 7 < Q = 25: three full chunks and a partial one.
    got = weighted_knn_predict(train, labels, query, ks, 4, temperature, chunk_size=7)
    assert sorted(got) == ks
    for k in ks:
        expected = _reference_scores(
            train.numpy(), labels.numpy(), query.numpy(), k, 4, temperature
        )
        assert got[k].dtype == torch.float32 and got[k].shape == (25, 4)
        np.testing.assert_allclose(got[k].numpy(), expected, rtol=2e-5, atol=0)
        # Exactly k votes were cast per query, each in (exp(-1/τ), exp(1/τ)].
        assert bool(((got[k] > 0).sum(1) <= k).all())


def test_chunk_size_and_single_k_do_not_change_scores() -> None:
    train, labels, query = _random_problem()
    many = weighted_knn_predict(train, labels, query, [10, 3, 1, 3], 4, chunk_size=1024)
    for k in (1, 3, 10):
        for chunk in (1, 7, 25, 100):
            alone = weighted_knn_predict(train, labels, query, k, 4, chunk_size=chunk)
            assert list(alone) == [k]
            # Only float32 rounding differs (matmul blocking and summation order vary with the
            # chunk shape; exp amplifies a cosine error by 1/τ ≈ 14).
            torch.testing.assert_close(alone[k], many[k], rtol=1e-5, atol=0)


def test_exclude_self_matches_reference() -> None:
    train, labels, _ = _random_problem(n=30)
    got = weighted_knn_predict(
        train, labels, train, [1, 5], 4, 0.1, chunk_size=4, exclude_self=True
    )
    for k in (1, 5):
        expected = _reference_scores(
            train.numpy(), labels.numpy(), train.numpy(), k, 4, 0.1, exclude_self=True
        )
        np.testing.assert_allclose(got[k].numpy(), expected, rtol=2e-5, atol=0)


def test_exclude_self_nearest_other_point() -> None:
    """Unit vectors at known angles: each point's nearest *other* point is known."""
    degrees = torch.tensor([0.0, 10.0, 50.0, 100.0, 105.0], dtype=torch.float64)
    rad = torch.deg2rad(degrees)
    x = torch.stack([torch.cos(rad), torch.sin(rad)], dim=1)
    labels = torch.tensor([0, 0, 1, 2, 1])
    tau = 0.5
    scores = weighted_knn_predict(x, labels, x, 1, 3, tau, chunk_size=2, exclude_self=True)[1]
    # nearest other: 0→1 (10°), 1→0 (10°), 2→1 (40° < 50°), 3→4 (5°), 4→3 (5°)
    neighbour = [1, 0, 1, 4, 3]
    expected = torch.zeros(5, 3, dtype=torch.float64)
    for i, j in enumerate(neighbour):
        gap = math.radians(float(degrees[i] - degrees[j]))
        expected[i, labels[j]] = math.exp(math.cos(gap) / tau)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-6, atol=0)
    assert scores.argmax(1).tolist() == [0, 0, 0, 1, 2]
    # Without exclusion every point is its own nearest neighbour (cos = 1).
    own = weighted_knn_predict(x, labels, x, 1, 3, tau)[1]
    assert own.argmax(1).tolist() == labels.tolist()
    torch.testing.assert_close(own.max(1).values, torch.full((5,), math.exp(1 / tau)))


def test_positive_scaling_invariance() -> None:
    train, labels, query = _random_problem()
    base = weighted_knn_predict(train, labels, query, [1, 3, 10], 4, 0.07, chunk_size=7)
    gen = torch.Generator().manual_seed(2)
    # Powers of two scale exactly, so normalisation and therefore scores are bit-identical.
    row_pow2 = 2.0 ** torch.randint(-6, 7, (40, 1), generator=gen).double()
    q_pow2 = 2.0 ** torch.randint(-6, 7, (25, 1), generator=gen).double()
    exact = weighted_knn_predict(
        train * row_pow2, labels, query * q_pow2, [1, 3, 10], 4, 0.07, chunk_size=7
    )
    # Arbitrary positive constants (global and per row): equal up to float32 rounding.
    row = torch.rand(40, 1, generator=gen, dtype=torch.float64) * 10 + 0.01
    approx = weighted_knn_predict(
        train * row * 7.3, labels, query * 0.01, [1, 3, 10], 4, 0.07, chunk_size=7
    )
    for k in (1, 3, 10):
        assert torch.equal(exact[k], base[k])
        torch.testing.assert_close(approx[k], base[k], rtol=1e-5, atol=0)


def test_separated_clusters_are_classified_perfectly() -> None:
    c, d, per_class = 5, 8, 12
    gen = torch.Generator().manual_seed(3)

    def cluster(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(c).repeat_interleave(n)
        x = torch.nn.functional.one_hot(y, d).float() + 0.01 * torch.randn(len(y), d, generator=gen)
        return x, y

    train_x, train_y = cluster(per_class)
    query_x, query_y = cluster(4)
    perm = torch.randperm(len(train_y), generator=gen)
    train_x, train_y = train_x[perm], train_y[perm]
    scores = weighted_knn_predict(train_x, train_y, query_x, [1, 5, 12, 30], c)
    for k, s in scores.items():
        assert knn_accuracy(s, query_y, topk=(1,)) == {1: 1.0}, k
    assert knn_top1(train_x, train_y, query_x, query_y, num_classes=c) == 1.0


def test_labels_independent_of_features_give_chance() -> None:
    """Query labels drawn independently of everything else: each hit is Bernoulli(1/C).

    With C = 5 and Q = 2000 the accuracy has mean 0.2 and s.d. sqrt(0.2·0.8/2000) ≈ 0.009,
    so ±0.05 is > 5 s.d.; the top-2 accuracy has mean 0.4 and s.d. ≈ 0.011.
    """
    c, q, n, d = 5, 2000, 500, 16
    gen = torch.Generator().manual_seed(4)
    train = torch.randn(n, d, generator=gen)
    train_y = torch.randint(0, c, (n,), generator=gen)
    query = torch.randn(q, d, generator=gen)
    query_y = torch.randint(0, c, (q,), generator=gen)
    scores = weighted_knn_predict(train, train_y, query, 20, c, chunk_size=256)[20]
    acc = knn_accuracy(scores, query_y, topk=(1, 2, 5))
    assert abs(acc[1] - 1 / c) < 0.05
    assert abs(acc[2] - 2 / c) < 0.05
    assert acc[5] == 1.0


def test_accuracy_closed_form_and_clamp() -> None:
    # Distinct scores; the label's rank (1-based) per row is 1, 5, 6.
    scores = torch.tensor(
        [
            [9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],  # label 0: rank 1
            [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0],  # label 4 (3.0): rank 5
            [0.5, 0.4, 0.3, 0.2, 0.1, 0.9, 0.8],  # label 3 (0.2): rank 6
        ]
    )
    labels = torch.tensor([0, 4, 3])
    acc = knn_accuracy(scores, labels, topk=(1, 4, 5, 6, 7, 100))
    assert acc == {1: 1 / 3, 4: 1 / 3, 5: 2 / 3, 6: 1.0, 7: 1.0, 100: 1.0}
    assert knn_accuracy(scores, labels) == {1: 1 / 3, 5: 2 / 3}


def test_correct_counts_sum_over_shards_and_top1_clamps_k() -> None:
    train, labels, query = _random_problem(n=30, q=25)
    query_y = torch.randint(0, 4, (25,), generator=torch.Generator().manual_seed(5))
    full = knn_correct(train, labels, query, query_y, 10, 4)
    shards = [
        knn_correct(train, labels, query[s], query_y[s], 10, 4)
        for s in (slice(0, 9), slice(9, 9), slice(9, 25))
    ]
    assert shards[1] == (0, 0)
    assert tuple(map(sum, zip(*shards, strict=True))) == full
    assert full[1] == 25
    scores = weighted_knn_predict(train, labels, query, 10, 4)[10]
    assert full[0] / full[1] == knn_accuracy(scores, query_y, topk=(1,))[1]
    assert knn_top1(train, labels, query, query_y, 10, num_classes=4) == full[0] / 25
    # Default k = 200 > N = 30: clamped to min(k, N) = 30.
    at_n = knn_correct(train, labels, query, query_y, 30, 4)
    assert knn_top1(train, labels, query, query_y, num_classes=4) == at_n[0] / 25


def test_dtypes_and_empty_queries() -> None:
    train, labels, query = _random_problem()
    ref = weighted_knn_predict(train, labels, query, 3, 4)[3]
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = weighted_knn_predict(train.to(dtype), labels.int(), query.to(dtype), 3, 4)[3]
        assert got.dtype == torch.float32
        assert (got.argmax(1) == ref.argmax(1)).float().mean() > 0.8
    # float32 even under autocast, and no autograd graph.
    x32, q32 = train.float().requires_grad_(), query.float()
    plain = weighted_knn_predict(x32, labels, q32, [1, 3], 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = weighted_knn_predict(x32, labels, q32, [1, 3], 4)
    for k in (1, 3):
        assert torch.equal(cast[k], plain[k]) and not cast[k].requires_grad
    empty = weighted_knn_predict(train, labels, query[:0], [1, 2], 4)
    assert empty[1].shape == (0, 4) and empty[2].shape == (0, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    train, labels, query = _random_problem()
    cpu = weighted_knn_predict(train, labels, query, [1, 3, 10], 4, chunk_size=7)
    gpu = weighted_knn_predict(
        train.cuda(), labels.cuda(), query.cuda(), [1, 3, 10], 4, chunk_size=7
    )
    for k in (1, 3, 10):
        assert gpu[k].device.type == "cuda"
        torch.testing.assert_close(gpu[k].cpu(), cpu[k], rtol=1e-4, atol=0)


def test_errors() -> None:
    train, labels, query = _random_problem(n=10, q=4)
    with pytest.raises(ValueError, match=r"k=11 .*1 ≤ k ≤ N = 10"):
        weighted_knn_predict(train, labels, query, [1, 11], 4)
    with pytest.raises(ValueError, match=r"k=10 .*N - 1 \(exclude_self\) = 9"):
        weighted_knn_predict(train, labels, train, 10, 4, exclude_self=True)
    with pytest.raises(ValueError, match=r"k=0 .*≥ 1"):
        weighted_knn_predict(train, labels, query, [0, 3], 4)
    with pytest.raises(ValueError, match=r"k=-1 is not allowed: it must be an integer >= 1"):
        knn_top1(train, labels, query, labels[:4], -1, num_classes=4)
    with pytest.raises(ValueError, match=r"k=\[\] is empty"):
        weighted_knn_predict(train, labels, query, [], 4)
    bad = labels.clone()
    bad[[2, 5]] = -1
    with pytest.raises(ValueError, match=r"train_labels has 2 label\(s\) outside \[0, num_cl"):
        weighted_knn_predict(train, bad, query, 3, 4)
    with pytest.raises(ValueError, match=r"train_labels has 1 label\(s\) .*\(e\.g\. 4\)"):
        weighted_knn_predict(train, torch.cat([labels[:-1], torch.tensor([4])]), query, 3, 4)
    with pytest.raises(ValueError, match=r"train_labels has dtype torch.float32"):
        weighted_knn_predict(train, labels.float(), query, 3, 4)
    with pytest.raises(ValueError, match=r"query_labels has 1 label"):
        knn_correct(train, labels, query, torch.tensor([0, 1, -1, 2]), 3, 4)
    with pytest.raises(ValueError, match=r"exclude_self=True .*Q=4 != N=10"):
        weighted_knn_predict(train, labels, query, 3, 4, exclude_self=True)
    with pytest.raises(ValueError, match=r"query_features has D=5 but train_features has D=6"):
        weighted_knn_predict(train, labels, query[:, :5], 3, 4)
    for tau in (0.0, -0.1):
        with pytest.raises(ValueError, match=rf"temperature={tau} .*must be > 0"):
            weighted_knn_predict(train, labels, query, 3, 4, temperature=tau)
    with pytest.raises(ValueError, match=r"temperature=nan must be a finite number"):
        weighted_knn_predict(train, labels, query, 3, 4, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"temperature=0.01 overflows float32 .*> 0.011"):
        weighted_knn_predict(train, labels, query, 3, 4, temperature=0.01)
    with pytest.raises(ValueError, match=r"chunk_size=0"):
        weighted_knn_predict(train, labels, query, 3, 4, chunk_size=0)
    with pytest.raises(ValueError, match=r"num_classes=0"):
        weighted_knn_predict(train, labels, query, 3, 0)
    nan_query = query.clone()
    nan_query[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"query_features has 1 non-finite"):
        weighted_knn_predict(train, labels, nan_query, 3, 4)
    with pytest.raises(ValueError, match=r"Q=0 rows"):
        knn_top1(train, labels, query[:0], labels[:0], num_classes=4)
    with pytest.raises(ValueError, match=r"topk=0"):
        knn_accuracy(torch.rand(3, 4), torch.tensor([0, 1, 2]), topk=(0, 1))
    with pytest.raises(ValueError, match=r"labels has 1 label\(s\) outside \[0, num_classes=4"):
        knn_accuracy(torch.rand(3, 4), torch.tensor([0, 1, 7]))


# -- the online monitor's kNN over ranks, without gathering the bank -----------------------------

# Uneven shards per world size, one rank without bank rows and one without queries.
_BANK, _QUERIES = 23, 11
_SHARDS = {2: ([0, 9, 23], [0, 11, 11]), 3: ([0, 0, 14, 23], [0, 4, 4, 11])}


def _knn_data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return (torch.randn(_BANK, 6, generator=g), torch.randint(0, 4, (_BANK,), generator=g),
            torch.randn(_QUERIES, 6, generator=g), torch.randint(0, 4, (_QUERIES,), generator=g))


def _knn_worker(rank: int, world: int, port: str, out: str) -> None:
    with gloo_group(rank, world, port, timeout_s=60):
        bf, by, qf, qy = _knn_data()
        b, q = _SHARDS[world]
        mine = slice(b[rank], b[rank + 1]), slice(q[rank], q[rank + 1])
        got = [sharded_knn_top1((bf[mine[0]], by[mine[0]]), (qf[mine[1]], qy[mine[1]]), k=k,
                                num_classes=4, temperature=0.1) for k in (1, 5, 23, 40)]
        torch.save(got, Path(out) / f"r{rank}.pt")


def test_sharded_knn_without_process_group_is_knn_top1() -> None:
    bf, by, qf, qy = _knn_data()
    for k in (1, 5, 23, 40):
        want = knn_top1(bf, by, qf, qy, k, num_classes=4, temperature=0.1)
        assert sharded_knn_top1((bf, by), (qf, qy), k=k, num_classes=4, temperature=0.1) == want


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_sharded_knn_over_ranks_equals_one_process(world: int, tmp_path: Path) -> None:
    spawn_bounded(_knn_worker, (world, rendezvous_file(tmp_path), str(tmp_path)), world, 240.0)
    bf, by, qf, qy = _knn_data()
    want = [knn_top1(bf, by, qf, qy, k, num_classes=4, temperature=0.1) for k in (1, 5, 23, 40)]
    assert len(set(want)) > 1  # the k values give different answers: a real comparison
    for r in range(world):
        assert torch.load(tmp_path / f"r{r}.pt") == want, f"rank {r}"
