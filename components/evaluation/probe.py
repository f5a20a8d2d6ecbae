"""Linear-probe evaluation of a frozen encoder: a softmax classifier on fixed features.

References:
    The standard protocol of contrastive pretraining papers: SupCon (Khosla et al. 2020,
    supcon.txt Sec. 3: "we train a linear classifier on top of the frozen representations
    using a cross-entropy loss"); SimCLR's transfer evaluation (Chen et al. 2020, following
    Kornblith et al. 2019): an L2-regularised multinomial logistic regression fitted with
    L-BFGS, the regularisation chosen on a validation split of the train set, then refitted
    on the whole train set and reported on the test set; SINCERE (sincere.txt App. J): the
    SGD variant, 100 epochs of SGD with momentum 0.9, hyperparameters chosen on a held-out
    part of the train set, final model trained on the entire train set.

Procedure of :func:`linear_probe` (features ``x`` [N, D], labels ``y`` in ``[0, C)``):

    1. standardise: ``x' = (x - μ) / max(σ, 1e-6)`` per dimension, ``μ, σ`` the mean and
       population standard deviation (ddof = 0) of the *whole* train set, applied to train
       and test alike (:func:`standardize`). Hence the probe is invariant to a positive
       scale and a per-dimension offset of the features.
    2. split the train set (:func:`stratified_split`, deterministic from ``seed``): per class
       with ``n_c ≥ 2`` samples, ``min(n_c - 1, max(1, round(val_fraction · n_c)))`` go to
       validation (classes with one sample stay in the fit part).
    3. for every weight decay λ: fit ``logits = x' Wᵀ + b`` (W [C, D], b [C], both started at
       zero) on the fit part by minimising ``mean CE(logits, y) + λ/2 · ‖W‖²`` (no penalty on
       b), record the validation top-1. Choose the λ with the best validation top-1; ties go
       to the larger λ (the simpler model).
    4. refit on the whole train set with the chosen λ; report top-1 and top-``min(5, C)`` on
       the test set.

Optimisers (:func:`fit_linear_classifier`):
    ``"lbfgs"``: full-batch :class:`torch.optim.LBFGS` (lr 1, ``line_search_fn="strong_wolfe"``,
    ``max_iter=epochs``, default tolerances and history), the standard choice for this
    convex problem. ``lr`` and ``batch_size`` are not used.
    ``"sgd"``: minibatch SGD (momentum 0.9, no Nesterov), ``epochs`` passes over the data in
    an order drawn from ``seed``, the last batch of an epoch possibly smaller; the learning
    rate follows a per-step cosine ``lr · (1 + cos(π t / T)) / 2``, t = 0..T-1, T the total
    number of steps. The L2 penalty enters as SGD ``weight_decay=λ`` on W only (the gradient
    of ``λ/2 · ‖W‖²``).

Everything runs in float32 (autocast disabled, autograd enabled even under ``no_grad`` or
``inference_mode``) on ``device`` (default: that of ``train_features``); random draws use a
CPU :class:`torch.Generator` seeded with ``seed``, so a result is reproducible on one machine.
CUDA float32 matmuls follow the global ``torch.backends.cuda.matmul`` precision setting.

Ties in the predictions are ranked by :func:`torch.topk` (for instance an all-zero classifier
gives every class the same logit; which class it "predicts" is then implementation-defined).

Memory: standardised float32 copies of the train and test features ([N, D], [M, D]), the fit
and validation subsets ([N, D] together), and full-batch [N, C] logits for L-BFGS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from components.evaluation import checks

__all__ = [
    "ProbeResult",
    "fit_linear_classifier",
    "linear_probe",
    "standardize",
    "stratified_split",
]

_STD_FLOOR = 1e-6
_OPTIMIZERS = ("lbfgs", "sgd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """Outcome of :func:`linear_probe`."""

    top1: float  # on the test features, in [0, 1]
    top5: float  # top-min(5, num_classes) on the test features, in [0, 1]
    weight_decay: float  # the chosen one
    val_top1: dict[float, float]  # weight decay -> validation top-1 used to choose it
    epochs: int  # L-BFGS iterations or SGD epochs per fit
    # [M] bool per test row (CPU): top-1 / top-5 correct — what intervals resample
    hits1: Tensor | None = dataclasses.field(default=None, compare=False, repr=False)
    hits5: Tensor | None = dataclasses.field(default=None, compare=False, repr=False)


# --------------------------------------------------------------------------- validation


def _check_features(name: str, x: Tensor, *, allow_empty: bool = False) -> None:
    """Finite float [rows, D] with D ≥ 1, and rows ≥ 1 unless ``allow_empty``."""
    empty_reason = None if allow_empty else "the linear probe needs at least one sample"
    checks.check_features(name, x, require_columns=True, empty_reason=empty_reason)


def _check_labels(name: str, labels: Tensor, rows: int, num_classes: int) -> None:
    """[rows] integer class ids in ``[0, num_classes)`` (no unlabelled -1)."""
    hint = "the linear probe needs labels: drop unlabelled (-1) rows first"
    checks.check_labels(name, labels, rows, num_classes, hint=hint)


def _check_val_fraction(val_fraction: object) -> float:
    f = checks.as_float("val_fraction", val_fraction)
    if not 0.0 <= f < 1.0:
        raise ValueError(f"val_fraction={f} is not allowed; it must lie in [0, 1)")
    return f


def _check_weight_decays(weight_decays: object) -> list[float]:
    """Distinct decays in the given order (first occurrence kept)."""
    if isinstance(weight_decays, (int, float)) and not isinstance(weight_decays, bool):
        weight_decays = [weight_decays]
    if not isinstance(weight_decays, Sequence) or isinstance(weight_decays, str):
        raise ValueError(f"weight_decays={weight_decays!r} must be a sequence of numbers ≥ 0")
    if len(weight_decays) == 0:
        raise ValueError("weight_decays is empty; pass at least one weight decay ≥ 0")
    out: list[float] = []
    for value in weight_decays:
        wd = checks.as_float("weight_decay", value)
        if wd < 0:
            raise ValueError(f"weight_decay={wd} is not allowed; every weight decay must be ≥ 0")
        if wd not in out:
            out.append(wd)
    return out


def _check_training(epochs: object, lr: object, batch_size: object, optimizer: object) -> int:
    n_epochs = checks.at_least_one("epochs", epochs)
    rate = checks.as_float("lr", lr)
    if rate <= 0:
        raise ValueError(f"lr={rate} is not allowed; it must be > 0")
    checks.at_least_one("batch_size", batch_size)
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not allowed; choose one of {_OPTIMIZERS}")
    return n_epochs


# --------------------------------------------------------------------------- building blocks


def standardize(train: Tensor, *others: Tensor) -> tuple[Tensor, ...]:
    """z-score with the train features' mean/std per dimension (std clamped at 1e-6).

    ``out = (x - μ) / max(σ, 1e-6)`` with ``μ = mean(train, dim=0)`` and ``σ`` the population
    standard deviation of ``train`` (ddof = 0, as numpy's ``std`` and sklearn's
    ``StandardScaler``), applied to ``train`` and to every tensor in ``others``.

    Args:
        train: [N, D] float, N ≥ 1.
        *others: [M_i, D] float tensors (M_i may be 0), moved to ``train``'s device.

    Returns:
        ``(train', *others')`` in the same order; float64 if ``train`` is float64, else float32.
        A constant train dimension maps to 0 on train (σ is clamped, not replaced by 1).

    Raises:
        ValueError: non-2-D or non-float input, N == 0, D == 0, mismatched D, non-finite values.
    """
    _check_features("train", train)
    for i, other in enumerate(others):
        _check_features(f"others[{i}]", other, allow_empty=True)
        checks.check_same_width(f"others[{i}]", other, "train", train)
    dtype = torch.float64 if train.dtype == torch.float64 else torch.float32
    x = train.to(dtype)  # [N, D]
    mean = x.mean(dim=0)  # [D]
    std = x.std(dim=0, correction=0).clamp_min(_STD_FLOOR)  # [D]
    out = [(x - mean) / std]
    out += [(o.to(device=x.device, dtype=dtype) - mean) / std for o in others]  # [M_i, D]
    return tuple(out)


def stratified_split(labels: Tensor, val_fraction: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Deterministic stratified hold-out: ``(fit_indices, val_indices)``.

    For each class ``c`` present (ascending), its ``n_c`` row indices are permuted with a CPU
    generator seeded once with ``seed``; the first ``v_c`` go to validation, where
    ``v_c = min(n_c - 1, max(1, floor(val_fraction · n_c + 0.5)))`` if ``n_c ≥ 2`` and
    ``val_fraction > 0``, else 0. So every class with ≥ 2 samples has at least one sample on
    each side, and a singleton class stays in the fit part.

    Args:
        labels: [N] integer labels ≥ 0 (any device).
        val_fraction: in [0, 1); 0 gives an empty validation part.
        seed: integer seed of the permutation.

    Returns:
        Two disjoint int64 CPU tensors of row indices, each sorted ascending, covering 0..N-1.

    Raises:
        ValueError: labels not a 1-D integer tensor, negative labels, val_fraction ∉ [0, 1).
    """
    f = _check_val_fraction(val_fraction)
    seed = checks.as_int("seed", seed)
    labels = checks.check_label_tensor("labels", labels)
    y = labels.detach().to(device="cpu", dtype=torch.int64)  # [N]
    if y.numel() and int(y.min()) < 0:
        raise ValueError(
            f"labels has a negative label ({int(y.min())}); the split needs labels ≥ 0 "
            "(drop unlabelled (-1) rows first)"
        )
    gen = torch.Generator().manual_seed(seed)
    val_parts: list[Tensor] = []
    for c in torch.unique(y).tolist():  # ascending
        idx = torch.nonzero(y == c).flatten()  # [n_c] ascending
        n_c = idx.numel()
        if n_c < 2 or f == 0.0:
            continue
        v_c = min(n_c - 1, max(1, math.floor(f * n_c + 0.5)))
        val_parts.append(idx[torch.randperm(n_c, generator=gen)[:v_c]])
    is_val = torch.zeros(y.numel(), dtype=torch.bool)  # [N]
    if val_parts:
        is_val[torch.cat(val_parts)] = True
    return torch.nonzero(~is_val).flatten(), torch.nonzero(is_val).flatten()


def _fit(
    x: Tensor,
    y: Tensor,
    num_classes: int,
    weight_decay: float,
    epochs: int,
    lr: float,
    batch_size: int,
    optimizer: str,
    seed: int,
) -> tuple[Tensor, Tensor]:
    """Validated float32 ``x`` [N, D] and int64 ``y`` [N] on one device → (W [C, D], b [C])."""
    n, d = x.shape
    device = x.device
    weight = torch.zeros(num_classes, d, dtype=torch.float32, device=device, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float32, device=device, requires_grad=True)

    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(
            [weight, bias], lr=1.0, max_iter=epochs, line_search_fn="strong_wolfe"
        )

        def closure() -> Tensor:
            opt.zero_grad()
            logits = x @ weight.T + bias  # [N, C]
            loss = F.cross_entropy(logits, y) + 0.5 * weight_decay * weight.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
    else:
        sgd = torch.optim.SGD(
            [
                {"params": [weight], "weight_decay": weight_decay},
                {"params": [bias], "weight_decay": 0.0},
            ],
            lr=lr,
            momentum=0.9,
        )
        gen = torch.Generator().manual_seed(seed)
        steps_per_epoch = math.ceil(n / batch_size)
        total = epochs * steps_per_epoch
        step = 0
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen).to(device)  # [N]
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]  # [B]
                rate = 0.5 * lr * (1.0 + math.cos(math.pi * step / total))
                for group in sgd.param_groups:
                    group["lr"] = rate
                sgd.zero_grad()
                logits = x[batch] @ weight.T + bias  # [B, C]
                F.cross_entropy(logits, y[batch]).backward()
                sgd.step()
                step += 1

    weight, bias = weight.detach(), bias.detach()
    if not bool(torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise FloatingPointError(
            f"the linear classifier diverged (non-finite weights) with optimizer={optimizer!r}, "
            f"lr={lr}, weight_decay={weight_decay}; lower lr or use optimizer='lbfgs'"
        )
    return weight, bias


def fit_linear_classifier(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    weight_decay: float = 0.0,
    *,
    epochs: int = 100,
    lr: float = 0.1,
    batch_size: int = 1024,
    optimizer: Literal["lbfgs", "sgd"] = "lbfgs",
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Fit ``logits = features @ W.T + b`` by ``mean CE + weight_decay/2 · ‖W‖²``.

    One fit of step 3/4 of :func:`linear_probe` (module docstring: optimisers), on the features
    as given (no standardisation here), in float32 on ``features``' device, W and b started at
    zero.

    Args:
        features: [N, D] float, N ≥ 1, finite.
        labels: [N] integer labels in ``[0, num_classes)``.
        num_classes: C ≥ 1.
        weight_decay: λ ≥ 0 of the L2 penalty on W (not b).
        epochs: L-BFGS ``max_iter``, or SGD epochs.
        lr: SGD base learning rate (cosine-annealed per step); unused by L-BFGS.
        batch_size: SGD minibatch size; unused by L-BFGS.
        optimizer: ``"lbfgs"`` (full batch) or ``"sgd"`` (momentum 0.9).
        seed: seed of the SGD sample order.

    Returns:
        ``(W [C, D], b [C])``, detached float32 tensors on ``features``' device.

    Raises:
        ValueError: bad shapes/dtypes/values as :func:`linear_probe`.
        FloatingPointError: SGD diverged to non-finite weights (lr too large).
    """
    _check_features("features", features)
    num_classes = checks.at_least_one("num_classes", num_classes)
    _check_labels("labels", labels, features.shape[0], num_classes)
    decay = _check_weight_decays([weight_decay])[0]
    epochs = _check_training(epochs, lr, batch_size, optimizer)
    seed = checks.as_int("seed", seed)
    device = features.device
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        torch.autocast(device_type=device.type, enabled=False),
    ):
        x = features.to(torch.float32).clone()  # [N, D]; clone: never an inference tensor
        y = labels.to(device=device, dtype=torch.int64).clone()  # [N]
        return _fit(x, y, num_classes, decay, epochs, float(lr), int(batch_size), optimizer, seed)


@torch.no_grad()
def _topk_hits(weight: Tensor, bias: Tensor, x: Tensor, y: Tensor, k: int) -> Tensor:
    """[M] bool: is the row's label among the ``min(k, C)`` largest logits (torch.topk)?"""
    logits = x @ weight.T + bias  # [M, C]
    top = logits.topk(min(k, logits.shape[1]), dim=1).indices  # [M, k]
    return (top == y[:, None]).any(dim=1)


def _topk_accuracy(weight: Tensor, bias: Tensor, x: Tensor, y: Tensor, k: int) -> float:
    """Fraction of rows whose label is among the ``min(k, C)`` largest logits (torch.topk)."""
    return int(_topk_hits(weight, bias, x, y, k).sum()) / y.numel()  # exact count / M


# --------------------------------------------------------------------------- the protocol


def linear_probe(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_classes: int,
    *,
    weight_decays: Sequence[float] = (0.0, 1e-5, 1e-4, 1e-3, 1e-2),
    val_fraction: float = 0.1,
    epochs: int = 100,
    lr: float = 0.1,
    batch_size: int = 1024,
    optimizer: Literal["lbfgs", "sgd"] = "lbfgs",
    seed: int = 0,
    device: torch.device | None = None,
) -> ProbeResult:
    """Linear-probe top-1/top-5 of frozen features, the L2 weight decay chosen on validation.

    Procedure (module docstring has the formulas):
      1. standardise train and test with the whole train set's per-dimension mean/std;
      2. hold out a stratified ``val_fraction`` of train (:func:`stratified_split`, from
         ``seed``; ≥ 1 per class that has ≥ 2 samples);
      3. for each weight decay λ (duplicates dropped), fit ``x Wᵀ + b`` on the rest by
         ``mean CE + λ/2 · ‖W‖²`` and measure validation top-1; choose the best λ, ties to the
         larger λ;
      4. refit on the whole train set with the chosen λ; report test top-1 and
         top-``min(5, C)``.

    With ``val_fraction == 0`` (or when no class has 2 samples, so the validation part is
    empty) nothing is held out and exactly one weight decay must be given; ``val_top1`` is
    then ``{}``. With one decay and ``val_fraction > 0`` the validation fit still runs, so
    ``val_top1`` always reports the decays it was given.

    Args:
        train_features: [N, D] float, N ≥ 1, finite (any scale; standardised inside).
        train_labels: [N] integer labels in ``[0, num_classes)`` (no -1 = unlabelled).
        test_features: [M, D] float, M ≥ 1, finite.
        test_labels: [M] integer labels in ``[0, num_classes)``.
        num_classes: C ≥ 1 (classes absent from train are allowed; they are never predicted
            once the fit has converged).
        weight_decays: candidate λ ≥ 0 (non-empty).
        val_fraction: fraction of each class held out to choose λ, in [0, 1).
        epochs: L-BFGS ``max_iter`` (iterations of the full-batch fit) or SGD epochs.
        lr: SGD base learning rate (cosine-annealed); unused by L-BFGS (step 1 + line search).
        batch_size: SGD minibatch size; unused by L-BFGS.
        optimizer: ``"lbfgs"`` (default, full batch) or ``"sgd"`` (momentum 0.9).
        seed: seed of the split and of the SGD sample order.
        device: where to compute; default ``train_features.device``. Inputs are moved there.

    Returns:
        :class:`ProbeResult` (top1, top5, chosen weight_decay, val_top1, epochs).

    Raises:
        ValueError: empty inputs (N, M or D = 0), mismatched N (labels) or D (test vs train),
            non-float features or non-integer labels, labels outside ``[0, num_classes)``,
            non-finite features, val_fraction ∉ [0, 1), empty or negative weight_decays,
            several weight decays without a validation part, epochs < 1, lr ≤ 0,
            batch_size < 1, an unknown optimizer, num_classes < 1.
        FloatingPointError: SGD diverged to non-finite weights (lr too large).
    """
    _check_features("train_features", train_features)
    _check_features("test_features", test_features)
    n, m = train_features.shape[0], test_features.shape[0]
    checks.check_same_width("test_features", test_features, "train_features", train_features)
    num_classes = checks.at_least_one("num_classes", num_classes)
    _check_labels("train_labels", train_labels, n, num_classes)
    _check_labels("test_labels", test_labels, m, num_classes)
    decays = _check_weight_decays(weight_decays)
    f = _check_val_fraction(val_fraction)
    epochs = _check_training(epochs, lr, batch_size, optimizer)
    seed = checks.as_int("seed", seed)
    dev = train_features.device if device is None else torch.device(device)

    fit_idx, val_idx = stratified_split(train_labels, f, seed)  # CPU int64
    if val_idx.numel() == 0 and len(decays) > 1:
        raise ValueError(
            f"cannot choose among weight_decays={decays}: the validation part is empty "
            f"(val_fraction={f}; a class needs ≥ 2 train samples to be split); "
            "pass val_fraction > 0 or a single weight decay"
        )

    def fit(x: Tensor, y: Tensor, decay: float) -> tuple[Tensor, Tensor]:
        return _fit(x, y, num_classes, decay, epochs, float(lr), int(batch_size), optimizer, seed)

    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        torch.autocast(device_type=dev.type, enabled=False),
    ):
        train_x = train_features.to(device=dev, dtype=torch.float32)  # [N, D]
        test_x = test_features.to(device=dev, dtype=torch.float32)  # [M, D]
        train_x, test_x = standardize(train_x, test_x)  # float32 z-scores, new tensors
        train_y = train_labels.to(device=dev, dtype=torch.int64).clone()  # [N]
        test_y = test_labels.to(device=dev, dtype=torch.int64).clone()  # [M]

        val_top1: dict[float, float] = {}
        if val_idx.numel():
            fit_i, val_i = fit_idx.to(dev), val_idx.to(dev)
            fit_x, fit_y = train_x[fit_i], train_y[fit_i]  # [N_fit, D], [N_fit]
            val_x, val_y = train_x[val_i], train_y[val_i]  # [N_val, D], [N_val]
            for decay in decays:
                w, b = fit(fit_x, fit_y, decay)
                val_top1[decay] = _topk_accuracy(w, b, val_x, val_y, 1)
            # Best validation top-1; ties go to the larger decay.
            chosen = max(val_top1, key=lambda wd: (val_top1[wd], wd))
        else:
            chosen = decays[0]

        w, b = fit(train_x, train_y, chosen)
        hits1, hits5 = (_topk_hits(w, b, test_x, test_y, k).cpu() for k in (1, 5))
        top1 = int(hits1.sum()) / test_y.numel()  # exact count / M
        top5 = int(hits5.sum()) / test_y.numel()
    return ProbeResult(top1=top1, top5=top5, weight_decay=chosen, val_top1=val_top1, epochs=epochs,
                       hits1=hits1, hits5=hits5)
