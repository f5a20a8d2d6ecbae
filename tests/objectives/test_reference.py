"""Every objective against the plain float64 loop references in ``tests/support/reference.py``.

Forward values are compared on random inputs over batch sizes, view counts and label
patterns (all unique, all one class, singleton classes, random); gradients against central
finite differences of the reference on a representative subset.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from components.objectives import (
    CLIP,
    SINCERE,
    XCLR,
    CoNe,
    ContrastiveBatch,
    InfoNCE,
    Objective,
    SupCon,
)
from tests.support import reference as ref
from tests.support.helpers import batch_from, label_patterns, numeric_grad

SHAPES = [(5, 1), (5, 2), (8, 2), (6, 3)]  # (N, V)
PATTERNS = ["unique", "one_class", "singletons", "random"]
D = 4


def _z(n: int, v: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, v, D))


def _ours(objective: Objective, z: np.ndarray, **fields: np.ndarray) -> tuple[float, np.ndarray]:
    batch = batch_from(z, **fields)
    loss, metrics = objective.double()(batch)
    loss.backward()
    assert loss.item() == pytest.approx(metrics["loss"], rel=1e-12, abs=1e-12)
    return loss.item(), batch.z.grad.numpy()


def _check(objective: Objective, reference, z: np.ndarray, grad: bool, **fields) -> None:  # type: ignore[no-untyped-def]
    value, g = _ours(objective, z, **fields)
    assert value == pytest.approx(reference(z), rel=1e-10, abs=1e-10)
    if grad:
        np.testing.assert_allclose(g, numeric_grad(reference, z), rtol=1e-5, atol=1e-7)


@pytest.fixture(params=["masks", "pairs"])
def graph_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """SimCLR's and SupCon's hard graphs both ways: as A×M masks (the default for batches this
    small) and as positive pairs (large batches), so each path meets the references."""
    entries = 1 << 40 if request.param == "masks" else 0
    for cls in (InfoNCE, SupCon):
        monkeypatch.setattr(cls, "dense_graph_entries", entries)
    return str(request.param)


def _grad_case(n: int, v: int, pattern: str) -> bool:
    return (n, v) in {(5, 2), (6, 3)} and pattern in {"singletons", "random"}


@pytest.mark.usefixtures("graph_path")
@pytest.mark.parametrize(("n", "v"), SHAPES)
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_infonce(n: int, v: int, tau: float) -> None:
    _check(InfoNCE(tau), lambda z: ref.infonce(z, tau), _z(n, v), grad=(n, v) == (5, 2))


@pytest.mark.usefixtures("graph_path")
@pytest.mark.parametrize(("n", "v"), SHAPES)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("variant", ["out", "in"])
def test_supcon(n: int, v: int, pattern: str, variant: str) -> None:
    labels = label_patterns(n)[pattern] if n >= 5 else np.arange(n)
    f = ref.supcon_out if variant == "out" else ref.supcon_in
    _check(
        SupCon(0.1, variant=variant),
        lambda z: f(z, labels, 0.1),
        _z(n, v),
        grad=_grad_case(n, v, pattern),
        labels=labels,
    )


@pytest.mark.parametrize(("n", "v"), SHAPES)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("epsilon", [0.0, 0.25])
def test_sincere_and_eps_supinfonce(n: int, v: int, pattern: str, epsilon: float) -> None:
    labels = label_patterns(n)[pattern]
    _check(
        SINCERE(0.2, epsilon=epsilon),
        lambda z: ref.sincere(z, labels, 0.2, epsilon),
        _z(n, v),
        grad=_grad_case(n, v, pattern),
        labels=labels,
    )


@pytest.mark.parametrize(("n", "v"), SHAPES)
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tau_s", [0.05, 1.0])
def test_xclr_class_graph(n: int, v: int, pattern: str, tau_s: float) -> None:
    labels = label_patterns(n)[pattern]
    classes = int(labels.max()) + 1
    sim = np.random.default_rng(7).uniform(-1, 1, size=(classes, classes))
    graph = ref.xclr_class_graph(labels, sim, v)
    _check(
        XCLR(0.1, tau_s=tau_s, graph="class", class_similarity=torch.tensor(sim)),
        lambda z: ref.xclr(z, graph, 0.1, tau_s),
        _z(n, v),
        grad=_grad_case(n, v, pattern),
        labels=labels,
    )


@pytest.mark.parametrize(("n", "v"), SHAPES)
@pytest.mark.parametrize("tau_s", [0.002, 0.05, 0.5])  # 0.002: G/τ_s below exp's floor
def test_xclr_caption_graph(n: int, v: int, tau_s: float) -> None:
    captions = np.random.default_rng(8).normal(size=(n, 6))
    captions[1] = captions[0]  # two samples with the same caption text
    graph = ref.xclr_caption_graph(captions, v)
    _check(
        XCLR(0.1, tau_s=tau_s, graph="caption"),
        lambda z: ref.xclr(z, graph, 0.1, tau_s),
        _z(n, v),
        grad=(n, v) == (5, 2),
        captions=captions,
    )


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.usefixtures("graph_path")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_banked_supcon_and_simclr(pattern: str) -> None:
    """Candidates = gathered batch + bank rows (anchors ≠ candidates, non-square logits)."""
    n, v, k = 6, 2, 7
    rng = np.random.default_rng(3)
    labels = label_patterns(n)[pattern]
    bank = _unit(rng.normal(size=(k, D)))
    bank_labels = rng.integers(0, 3, size=k)
    ids = np.arange(n) + 100
    bank_ids = np.array([100, 101, 7, 8, 105, 9, 10])  # some bank rows are our own images
    ema = rng.normal(size=(n, v, D))

    def filled(objective):  # type: ignore[no-untyped-def]
        objective.double()  # a float64 bank, so the comparison is exact to 1e-10
        objective.bank.enqueue(
            torch.tensor(bank), labels=torch.tensor(bank_labels), ids=torch.tensor(bank_ids)
        )
        return objective

    z = _z(n, v)
    fields = {"labels": labels, "sample_ids": ids, "ema_z": ema}
    for variant, f in (("out", ref.supcon_out), ("in", ref.supcon_in)):
        _check(
            filled(SupCon(0.1, variant=variant, bank_size=k, dim=D)),
            lambda z, f=f: f(z, labels, 0.1, bank=bank, bank_labels=bank_labels),
            z,
            grad=pattern == "random",
            **fields,
        )
    _check(
        filled(InfoNCE(0.1, bank_size=k, dim=D)),
        lambda z: ref.infonce(z, 0.1, sample_ids=ids, bank=bank, bank_ids=bank_ids),
        z,
        grad=pattern == "random",
        **fields,
    )


@pytest.mark.parametrize(("mode", "want"), [
    ("query", math.log1p(math.exp(-1 / 0.1))),  # J = {b0, b1}: positive b0 at cos 1
    ("key", math.log1p(math.exp(0.6 / 0.1))),  # J = {b1, b2}: positive b2 at cos -0.6
])
def test_cone_neighbour_modes_by_hand(mode: str, want: float) -> None:
    """Query q = (1, 0) and EMA key k = (0, 1) pick different top-2 neighbours in a bank of
    b0 = (1, 0) [label 0], b1 = (0, 1) [1], b2 = (-0.6, 0.8) [0]; the anchor has label 0.
    L_in = −log Σ_pos w over J, w = softmax(cos(q, b_j) / 0.1) over J (cone.txt Eq. 2)."""
    objective = CoNe(2, 2, lambda_sup=1.0, lambda_dc=0.0, tau_sup=0.1, bank_size=3, top_n=2,
                     neighbours_from=mode).double()
    objective.bank.enqueue(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]]).double(),
                           labels=torch.tensor([0, 1, 0]), probs=torch.full((3, 2), 0.5).double())
    batch = batch_from(np.array([[[1.0, 0.0]]]), labels=np.array([0]),
                       logits=np.zeros((1, 1, 2)), ema_z=np.array([[[0.0, 1.0]]]),
                       ema_logits=np.zeros((1, 1, 2)))
    _, metrics = objective(batch)
    assert metrics["sup_in"] == pytest.approx(want, rel=1e-6)  # the bank stores float32
    assert metrics["anchors_without_positive"] == 0


@pytest.mark.parametrize("pattern", ["unique", "one_class", "singletons", "random"])
@pytest.mark.parametrize(("k", "top_n"), [(9, 4), (9, 50), (30, 8)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["key", "query"])
def test_cone(pattern: str, k: int, top_n: int, smoothing: float, mode: str) -> None:
    n, c = 7, 4
    rng = np.random.default_rng(k + top_n)
    labels = label_patterns(n)[pattern] % c
    q, key = rng.normal(size=(n, 1, D)), rng.normal(size=(n, 1, D))
    logits = rng.normal(size=(n, 1, c))
    bank = _unit(rng.normal(size=(k, D)))
    bank_labels = rng.integers(0, c, size=k)
    bank_probs = rng.dirichlet(np.ones(c), size=k)
    params = {"lambda_sup": 0.7, "lambda_dc": 0.4, "tau_sup": 0.1, "tau_dc": 0.07}

    objective = CoNe(c, D, bank_size=k, top_n=top_n, label_smoothing=smoothing,
                     neighbours_from=mode, **params)
    objective = objective.double()
    objective.bank.enqueue(
        torch.tensor(bank), labels=torch.tensor(bank_labels), probs=torch.tensor(bank_probs)
    )
    batch = batch_from(q, labels=labels, logits=logits, ema_z=key, ema_logits=logits)
    batch.logits.requires_grad_(True)
    loss, metrics = objective(batch)
    loss.backward()

    def reference(q_: np.ndarray, logits_: np.ndarray) -> float:
        return ref.cone(
            q_[:, 0],
            key[:, 0],
            logits_[:, 0],
            labels,
            bank,
            bank_labels,
            bank_probs,
            top_n=top_n,
            label_smoothing=smoothing,
            neighbours_from=mode,
            **params,
        )

    parts = ref.cone_parts(
        q[:, 0],
        key[:, 0],
        logits[:, 0],
        labels,
        bank,
        bank_labels,
        bank_probs,
        top_n=top_n,
        label_smoothing=smoothing,
        neighbours_from=mode,
        **params,
    )
    assert loss.item() == pytest.approx(reference(q, logits), rel=1e-10, abs=1e-12)
    for name, key_ in (("ce", "ce"), ("sup_in", "sup_in"), ("dc", "dc")):
        assert metrics[name] == pytest.approx(parts[key_], rel=1e-10, abs=1e-12), name
    if pattern == "random" and smoothing == 0.1:
        np.testing.assert_allclose(
            batch.z.grad.numpy(),
            numeric_grad(lambda x: reference(x, logits), q),
            atol=1e-7,
            rtol=1e-5,
        )
        np.testing.assert_allclose(
            batch.logits.grad.numpy(),
            numeric_grad(lambda x: reference(q, x), logits),
            atol=1e-7,
            rtol=1e-5,
        )
    # The step put the EMA keys (unit), labels and EMA class probabilities into the bank.
    newest = (int(objective.bank.ptr) - n + np.arange(n)) % k if k >= n else None
    if newest is not None:
        np.testing.assert_allclose(objective.bank.features[newest].numpy(), _unit(key[:, 0]))
        np.testing.assert_array_equal(objective.bank.labels[newest].numpy(), labels)


@pytest.mark.parametrize(("n", "v"), SHAPES)
def test_clip(n: int, v: int) -> None:
    e = 5
    rng = np.random.default_rng(n * v)
    captions = rng.normal(size=(n, e))
    objective = CLIP(D, caption_dim=e, tau=0.1).double()
    w = objective.head.weight.detach().numpy()
    b = objective.head.bias.detach().numpy()
    projected = captions @ w.T + b
    _check(
        objective,
        lambda z: ref.clip(z, projected, 0.1),
        _z(n, v),
        grad=(n, v) == (5, 2),
        captions=captions,
    )


def test_batch_helper_builds_real_batches() -> None:
    batch = batch_from(_z(5, 2), labels=np.arange(5))
    assert isinstance(batch, ContrastiveBatch) and batch.z.dtype == torch.float64
