"""Linear probe on frozen features: standardisation, split, weight-decay choice, accuracy."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from components.evaluation.probe import (
    ProbeResult,
    fit_linear_classifier,
    linear_probe,
    standardize,
    stratified_split,
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These problems are tiny: one intra-op thread is faster and immune to a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _clusters(
    per_class: int, num_classes: int = 4, d: int = 8, spread: float = 0.3, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters at ±5 on distinct axes (separation ≫ spread): [C·n, D], [C·n]."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.zeros(num_classes, d)
    for c in range(num_classes):
        centers[c, c // 2] = 5.0 if c % 2 == 0 else -5.0
    labels = torch.arange(num_classes).repeat_interleave(per_class)  # [N]
    x = centers[labels] + spread * torch.randn(labels.numel(), d, generator=gen)  # [N, D]
    return x, labels


@pytest.mark.parametrize("optimizer", ["lbfgs", "sgd"])
def test_separable_clusters_are_classified_perfectly(optimizer: str) -> None:
    train_x, train_y = _clusters(50, seed=1)
    test_x, test_y = _clusters(100, seed=2)
    result = linear_probe(train_x, train_y, test_x, test_y, 4, optimizer=optimizer)  # type: ignore[arg-type]
    assert isinstance(result, ProbeResult)
    assert result.top1 == 1.0
    assert result.top5 == 1.0  # clamped to top-4 of 4 classes
    assert result.epochs == 100
    assert set(result.val_top1) == {0.0, 1e-5, 1e-4, 1e-3, 1e-2}
    assert all(v == 1.0 for v in result.val_top1.values())
    assert result.weight_decay == 1e-2  # all tie at 1.0 → the largest decay


def test_random_labels_give_chance_accuracy() -> None:
    # Test labels are drawn independently of everything the probe sees, so the number of
    # correct test predictions is exactly Binomial(M=2000, 1/4): σ ≈ 0.0097, ±0.06 is > 6σ.
    gen = torch.Generator().manual_seed(3)
    train_x = torch.randn(2000, 8, generator=gen)
    train_y = torch.randint(0, 4, (2000,), generator=gen)
    test_x = torch.randn(2000, 8, generator=gen)
    test_y = torch.randint(0, 4, (2000,), generator=gen)
    result = linear_probe(train_x, train_y, test_x, test_y, 4, weight_decays=(1e-3,), epochs=30)
    assert abs(result.top1 - 0.25) < 0.06
    assert result.top5 == 1.0


def test_invariant_to_positive_scale_and_per_dimension_offset() -> None:
    # Overlapping clusters (spread 4 vs separation 5) so that accuracy is not trivially 1.
    train_x, train_y = _clusters(100, spread=4.0, seed=4)
    test_x, test_y = _clusters(250, spread=4.0, seed=5)
    kwargs = dict(weight_decays=(1e-3, 1e-1), epochs=50)
    base = linear_probe(train_x, train_y, test_x, test_y, 4, **kwargs)  # type: ignore[arg-type]
    assert 0.5 < base.top1 < 1.0

    # A power-of-two scale is exact in floating point: bitwise the same standardised input.
    scaled = linear_probe(train_x * 8.0, train_y, test_x * 8.0, test_y, 4, **kwargs)  # type: ignore[arg-type]
    assert scaled == base

    # A general scale and offset changes the z-scores by float32 rounding only; the fit is
    # strongly convex (λ > 0), so the optimum and hence the predictions stay the same.
    offset = torch.linspace(-100.0, 100.0, 8)  # [D]
    moved = linear_probe(
        train_x * 3.7 + offset,
        train_y,
        test_x * 3.7 + offset,
        test_y,
        4,
        **kwargs,  # type: ignore[arg-type]
    )
    assert moved.top1 == base.top1
    assert moved.top5 == base.top5
    assert moved.weight_decay == base.weight_decay
    assert moved.val_top1 == base.val_top1

    # Predictions themselves: the fitted classifiers on the two standardisations agree.
    z_base, zt_base = standardize(train_x, test_x)
    z_moved, zt_moved = standardize(train_x * 3.7 + offset, test_x * 3.7 + offset)
    torch.testing.assert_close(z_moved, z_base, atol=1e-5, rtol=0)
    w0, b0 = fit_linear_classifier(z_base, train_y, 4, 1e-3, epochs=50)
    w1, b1 = fit_linear_classifier(z_moved, train_y, 4, 1e-3, epochs=50)
    pred0 = (zt_base @ w0.T + b0).argmax(dim=1)
    pred1 = (zt_moved @ w1.T + b1).argmax(dim=1)
    assert torch.equal(pred0, pred1)


def test_single_weight_decay_is_chosen() -> None:
    train_x, train_y = _clusters(20, seed=6)
    test_x, test_y = _clusters(20, seed=7)
    result = linear_probe(train_x, train_y, test_x, test_y, 4, weight_decays=[1e-2], epochs=20)
    assert result.weight_decay == 1e-2
    assert list(result.val_top1) == [1e-2]
    assert result.top1 == 1.0


def test_weight_decay_selection_prefers_best_validation_accuracy() -> None:
    # Imbalanced 3:1 classes. A huge decay drives W → 0 (‖W‖ ~ 1/λ) while the unpenalised bias
    # learns the prior log 3, so everything is predicted as class 0 (validation top-1 = 0.75);
    # without decay the separable classes are classified perfectly.
    gen = torch.Generator().manual_seed(8)
    labels = torch.tensor([0] * 300 + [1] * 100)
    x = torch.randn(400, 2, generator=gen) * 0.3
    x[:, 0] += torch.where(labels == 0, -3.0, 3.0)
    result = linear_probe(x, labels, x, labels, 2, weight_decays=(1e4, 0.0), epochs=50)
    assert result.val_top1[0.0] == 1.0
    assert result.val_top1[1e4] == pytest.approx(0.75)
    assert result.weight_decay == 0.0
    assert result.top1 == 1.0
    # General rule: the choice maximises val top-1, ties to the larger decay.
    best = max(result.val_top1.values())
    assert result.weight_decay == max(wd for wd, v in result.val_top1.items() if v == best)


def test_tiny_one_dimensional_case_by_hand() -> None:
    # Two classes at -1 and +1: the decision boundary at 0 classifies every point.
    train_x = torch.tensor([[-1.0], [-1.0], [1.0], [1.0]])
    train_y = torch.tensor([0, 0, 1, 1])
    test_x = torch.tensor([[-1.0], [1.0], [-0.5], [2.0]])
    test_y = torch.tensor([0, 1, 0, 1])
    for optimizer in ("lbfgs", "sgd"):
        result = linear_probe(
            train_x,
            train_y,
            test_x,
            test_y,
            2,
            optimizer=optimizer,  # type: ignore[arg-type]
            weight_decays=(0.0, 1e-2),
            epochs=20,
        )
        assert result.top1 == 1.0
        assert result.top5 == 1.0
        # One of two per class is held out (n_c = 2 → 1 in validation); both decays succeed.
        assert result.val_top1 == {0.0: 1.0, 1e-2: 1.0}
        assert result.weight_decay == 1e-2


def test_lbfgs_fit_matches_closed_form_gradient_condition() -> None:
    # At the optimum of mean CE + λ/2 ‖W‖², the gradient vanishes: λW = -(1/N) Xᵀ(P - Y).
    x, y = _clusters(30, spread=3.0, seed=9)
    z = standardize(x)[0].double()
    w, b = fit_linear_classifier(standardize(x)[0], y, 4, 0.1, epochs=200)
    p = torch.softmax(z @ w.double().T + b.double(), dim=1)  # [N, C]
    residual = p - torch.nn.functional.one_hot(y, 4).double()  # [N, C]
    grad_w = residual.T @ z / len(y) + 0.1 * w.double()  # [C, D]
    grad_b = residual.mean(dim=0)  # [C]
    assert float(grad_w.abs().max()) < 1e-4
    assert float(grad_b.abs().max()) < 1e-4


def test_standardize_matches_numpy() -> None:
    gen = torch.Generator().manual_seed(10)
    train = torch.randn(50, 5, generator=gen, dtype=torch.float64) * 4.0 + 2.0
    train[:, 3] = 7.0  # constant column: σ clamped at 1e-6, z-scores 0 on train
    other = torch.randn(20, 5, generator=gen, dtype=torch.float64)
    a, o = train.numpy(), other.numpy()
    mean, std = a.mean(axis=0), np.maximum(a.std(axis=0), 1e-6)
    out_train, out_other = standardize(train, other)
    assert out_train.dtype == torch.float64
    np.testing.assert_allclose(out_train.numpy(), (a - mean) / std, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out_other.numpy(), (o - mean) / std, rtol=1e-12, atol=1e-9)
    assert float(out_train[:, 3].abs().max()) == 0.0
    # float32 (and half) inputs come back float32; a single tensor gives a 1-tuple.
    (z32,) = standardize(train.float())
    assert z32.dtype == torch.float32
    np.testing.assert_allclose(z32[:, :3].numpy(), ((a - mean) / std)[:, :3], atol=1e-5)
    assert standardize(train.half()[:, :3])[0].dtype == torch.float32
    # Empty "others" are fine.
    assert standardize(train, other[:0])[1].shape == (0, 5)


def test_stratified_split() -> None:
    labels = torch.tensor([0] * 10 + [1] * 3 + [2] * 1 + [3] * 2 + [5] * 40)
    fit_idx, val_idx = stratified_split(labels, 0.1, seed=0)
    assert torch.equal(torch.sort(torch.cat([fit_idx, val_idx])).values, torch.arange(56))
    counts = {c: int((labels[val_idx] == c).sum()) for c in (0, 1, 2, 3, 5)}
    # round(0.1·n) floored at 1 (n ≥ 2) and capped at n - 1; the singleton class stays in fit.
    assert counts == {0: 1, 1: 1, 2: 0, 3: 1, 5: 4}
    # Deterministic from the seed, different for another seed.
    again = stratified_split(labels, 0.1, seed=0)
    assert torch.equal(again[0], fit_idx) and torch.equal(again[1], val_idx)
    assert not torch.equal(stratified_split(labels, 0.1, seed=1)[1], val_idx)
    empty_fit, empty_val = stratified_split(labels, 0.0)
    assert empty_val.numel() == 0 and empty_fit.numel() == 56


def test_val_fraction_zero_needs_a_single_decay_and_runs_under_inference_mode() -> None:
    train_x, train_y = _clusters(10, seed=11)
    with torch.inference_mode():  # callers evaluate under inference mode; fitting still works
        result = linear_probe(
            train_x, train_y, train_x, train_y, 4, weight_decays=(1e-3,), val_fraction=0.0
        )
    assert result.val_top1 == {}
    assert result.weight_decay == 1e-3
    assert result.top1 == 1.0
    with pytest.raises(ValueError, match="validation part is empty"):
        linear_probe(train_x, train_y, train_x, train_y, 4, val_fraction=0.0)


def test_deterministic_given_seed() -> None:
    x, y = _clusters(40, spread=4.0, seed=12)
    kwargs = dict(optimizer="sgd", epochs=5, batch_size=16, weight_decays=(0.0, 1e-2))
    a = linear_probe(x, y, x, y, 4, seed=3, **kwargs)  # type: ignore[arg-type]
    b = linear_probe(x, y, x, y, 4, seed=3, **kwargs)  # type: ignore[arg-type]
    assert a == b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_on_separable_data() -> None:
    train_x, train_y = _clusters(50, seed=1)
    test_x, test_y = _clusters(50, seed=2)
    result = linear_probe(train_x, train_y, test_x, test_y, 4, device=torch.device("cuda"))
    assert result.top1 == 1.0


def _good() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y = _clusters(5, seed=13)
    return x, y, x.clone(), y.clone()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda a: {
                **a,
                "train_features": a["train_features"][:0],
                "train_labels": a["train_labels"][:0],
            },
            "train_features has 0 rows",
        ),
        (
            lambda a: {
                **a,
                "test_features": a["test_features"][:0],
                "test_labels": a["test_labels"][:0],
            },
            "test_features has 0 rows",
        ),
        (
            lambda a: {
                **a,
                "train_features": a["train_features"][:, :0],
                "test_features": a["test_features"][:, :0],
            },
            "D=0",
        ),
        (lambda a: {**a, "train_labels": a["train_labels"][:-1]}, r"expected \[20\]"),
        (lambda a: {**a, "test_features": a["test_features"][:, :3]}, "test_features has D=3"),
        (lambda a: {**a, "train_labels": torch.full((20,), -1)}, "linear probe needs labels"),
        (lambda a: {**a, "test_labels": a["test_labels"] + 4}, r"outside \[0, num_classes=4\)"),
        (lambda a: {**a, "train_labels": a["train_labels"].float()}, "integer"),
        (lambda a: {**a, "train_features": a["train_features"].long()}, "floating-point"),
        (
            lambda a: {
                **a,
                "train_features": torch.where(
                    torch.arange(20)[:, None] == 3, float("nan"), a["train_features"]
                ),
            },
            "non-finite",
        ),
        (lambda a: {**a, "test_features": a["test_features"] * float("inf")}, "non-finite"),
        (lambda a: {**a, "val_fraction": 1.0}, r"val_fraction=1.0 .* \[0, 1\)"),
        (lambda a: {**a, "val_fraction": -0.1}, "val_fraction=-0.1"),
        (lambda a: {**a, "weight_decays": ()}, "weight_decays is empty"),
        (lambda a: {**a, "weight_decays": (1e-3, -1e-4)}, "weight_decay=-0.0001"),
        (lambda a: {**a, "weight_decays": (float("nan"),)}, "finite"),
        (lambda a: {**a, "epochs": 0}, "epochs=0"),
        (lambda a: {**a, "lr": 0.0}, "lr=0.0"),
        (lambda a: {**a, "batch_size": 0}, "batch_size=0"),
        (lambda a: {**a, "optimizer": "adam"}, "optimizer='adam'"),
        (lambda a: {**a, "num_classes": 0}, "num_classes"),
    ],
)
def test_errors(change, match: str) -> None:  # type: ignore[no-untyped-def]
    x, y, tx, ty = _good()
    args = dict(
        train_features=x, train_labels=y, test_features=tx, test_labels=ty, num_classes=4, epochs=3
    )
    with pytest.raises(ValueError, match=match):
        linear_probe(**change(args))


def test_standardize_and_split_errors() -> None:
    with pytest.raises(ValueError, match="train has 0 rows"):
        standardize(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="others"):
        standardize(torch.zeros(4, 3), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="negative label"):
        stratified_split(torch.tensor([0, -1, 1]), 0.1)
    with pytest.raises(ValueError, match="val_fraction"):
        stratified_split(torch.tensor([0, 1]), 1.5)


def test_classes_absent_from_train_are_allowed() -> None:
    train_x, train_y = _clusters(30, seed=14)
    test_x, test_y = _clusters(30, seed=15)
    result = linear_probe(train_x, train_y, test_x, test_y, 10, weight_decays=(1e-3,), epochs=50)
    assert result.top1 == 1.0
    assert result.top5 == 1.0


def test_diverging_sgd_is_reported() -> None:
    x, y = _clusters(20, spread=3.0, seed=16)
    with pytest.raises(FloatingPointError, match="lower lr"):
        fit_linear_classifier(x, y, 4, optimizer="sgd", lr=1e38, batch_size=8, epochs=5)
