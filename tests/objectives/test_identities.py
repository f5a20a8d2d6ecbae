"""The identities of docs/design.md, closed forms, low-precision stability and bad-input errors."""

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
    CrossEntropy,
    InfoNCE,
    SupCon,
)
from tests.support.helpers import batch_from, label_patterns


def _z(n: int, v: int, d: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, v, d))


def _loss(objective, batch: ContrastiveBatch) -> float:  # type: ignore[no-untyped-def]
    return objective(batch)[1]["loss"]


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_infonce_identical_embeddings_is_log_2n_minus_1(n: int) -> None:
    batch = batch_from(np.ones((n, 2, 4)))
    loss, metrics = InfoNCE(0.07)(batch)
    assert loss.item() == pytest.approx(math.log(2 * n - 1), abs=1e-12)
    loss.backward()
    assert torch.isfinite(batch.z.grad).all()


@pytest.mark.parametrize(("n", "v"), [(5, 2), (8, 3), (6, 4)])
def test_supcon_with_unique_labels_is_simclr(n: int, v: int) -> None:
    z, labels = _z(n, v), np.arange(n)
    a, b = batch_from(z, labels=labels), batch_from(z, labels=labels)
    la, _ = InfoNCE(0.2)(a)
    lb, _ = SupCon(0.2, variant="out")(b)
    la.backward(), lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-12)
    torch.testing.assert_close(a.z.grad, b.z.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 5, 12])
def test_sincere_with_only_the_other_view_positive_is_infonce(n: int) -> None:
    z, labels = _z(n, 2), np.arange(n)
    a, b = batch_from(z, labels=labels), batch_from(z, labels=labels)
    la, _ = InfoNCE(0.1)(a)
    lb, _ = SINCERE(0.1)(b)
    la.backward(), lb.backward()
    assert la.item() == pytest.approx(lb.item(), abs=1e-12)
    torch.testing.assert_close(a.z.grad, b.z.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pattern", ["unique", "one_class", "singletons", "random"])
def test_eps_zero_is_sincere_and_a_margin_never_raises_the_value(pattern: str) -> None:
    z, labels = _z(9, 2), label_patterns(9)[pattern]
    sincere = _loss(SINCERE(0.1), batch_from(z, labels=labels))
    assert _loss(SINCERE(0.1, epsilon=0.0), batch_from(z, labels=labels)) == sincere
    # A larger margin shrinks the positive's own denominator term: the loss only goes down
    # by the margin-shifted term, never up (monotone in ε).
    losses = [_loss(SINCERE(0.1, epsilon=e), batch_from(z, labels=labels)) for e in (0, 0.1, 0.3)]
    assert losses == sorted(losses, reverse=True)


@pytest.mark.parametrize("pattern", ["one_class", "singletons", "random"])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_xclr_class_graph_tends_to_supcon_out(pattern: str, v: int) -> None:
    labels = label_patterns(10)[pattern]
    z = _z(10, v)
    rng = np.random.default_rng(1)
    sim = rng.uniform(-0.5, 0.8, size=(10, 10))
    sim = (sim + sim.T) / 2
    np.fill_diagonal(sim, 1.0)
    supcon, _ = SupCon(0.1)(sb := batch_from(z, labels=labels))
    xclr, _ = XCLR(0.1, tau_s=1e-4, graph="class", class_similarity=torch.tensor(sim))(
        xb := batch_from(z, labels=labels))
    if pattern == "singletons" and v == 1:
        # Singletons without another view have no positive in SupCon; X-CLR still has a target.
        return
    assert xclr.item() == pytest.approx(supcon.item(), abs=1e-9)
    supcon.backward(), xclr.backward()
    torch.testing.assert_close(xb.z.grad, sb.z.grad, rtol=0, atol=1e-9)


def test_xclr_per_sample_captions_tend_to_simclr() -> None:
    z = _z(6, 2)
    captions = np.random.default_rng(2).normal(size=(6, 5))
    simclr = _loss(InfoNCE(0.1), batch_from(z))
    xclr = _loss(XCLR(0.1, tau_s=1e-4, graph="caption"), batch_from(z, captions=captions))
    assert xclr == pytest.approx(simclr, abs=1e-9)
    # Larger τ_s moves target mass off the true positive (xclr.txt Fig. 8b).
    weights = [
        XCLR(0.1, tau_s=t, graph="caption")(
            batch_from(z, captions=captions))[1]["true_positive_weight"]
        for t in (1e-4, 0.1, 1.0)
    ]
    assert weights[0] == pytest.approx(1.0) and weights == sorted(weights, reverse=True)


@pytest.mark.parametrize("pattern", ["unique", "one_class", "singletons", "random"])
@pytest.mark.parametrize("v", [1, 2, 4])
def test_supcon_in_is_at_most_out(pattern: str, v: int) -> None:
    for seed in range(3):
        z, labels = _z(9, v, seed=seed), label_patterns(9)[pattern]
        l_in = _loss(SupCon(0.1, variant="in"), batch_from(z, labels=labels))
        l_out = _loss(SupCon(0.1, variant="out"), batch_from(z, labels=labels))
        assert l_in <= l_out + 1e-12


def test_cone_with_zero_weights_is_cross_entropy() -> None:
    rng = np.random.default_rng(3)
    n, c = 8, 4
    fields = {
        "labels": rng.integers(0, c, n),
        "logits": rng.normal(size=(n, 1, c)),
        "ema_z": rng.normal(size=(n, 1, 6)),
        "ema_logits": rng.normal(size=(n, 1, c)),
    }
    cone = CoNe(c, 6, lambda_sup=0.0, lambda_dc=0.0, bank_size=16, top_n=4).double()
    ce = CrossEntropy(c)
    for _ in range(3):  # the bank fills up; the loss stays CE
        a = batch_from(rng.normal(size=(n, 1, 6)), **fields)
        a.logits.requires_grad_(True)
        b = ContrastiveBatch(
            z=a.z, labels=a.labels, logits=a.logits.detach().clone().requires_grad_()
        )
        la, ma = cone(a)
        lb, _ = ce(b)
        la.backward(), lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-12)
        torch.testing.assert_close(a.logits.grad, b.logits.grad, rtol=0, atol=1e-12)
        expected = torch.nn.functional.cross_entropy(b.logits[:, 0], b.labels)
        assert lb.item() == pytest.approx(expected.item(), abs=1e-12)
    assert ma["bank_fill"] == 1.0


def test_no_positive_anywhere_gives_zero_with_a_graph() -> None:
    batch = batch_from(_z(5, 1), labels=np.arange(5))
    for objective in (SupCon(0.1), SupCon(0.1, variant="in"), SINCERE(0.1), InfoNCE(0.1)):
        loss, metrics = objective(batch)
        assert loss.item() == 0.0 and loss.requires_grad
        assert metrics["anchors_without_positive"] == 5
        loss.backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["one_class", "singletons", "random"])
def test_half_precision_inputs_at_tiny_temperatures_stay_finite(
    dtype: torch.dtype, pattern: str
) -> None:
    n, v, d, c = 9, 2, 16, 5
    labels = torch.as_tensor(label_patterns(n)[pattern])
    rng = torch.Generator().manual_seed(0)
    z = torch.randn(n, v, d, generator=rng).to(dtype).requires_grad_()
    captions = torch.randn(n, 12, generator=rng).to(dtype)
    sim = torch.rand(c + 4, c + 4, generator=rng)
    objectives = [
        InfoNCE(1e-3),
        SupCon(1e-3, variant="out"),
        SupCon(1e-3, variant="in"),
        SINCERE(1e-3),
        SINCERE(1e-3, epsilon=0.2),
        XCLR(1e-3, tau_s=1e-3, graph="class", class_similarity=sim),
        XCLR(1e-3, tau_s=1e-3, graph="caption"),
    ]
    for objective in objectives:
        z.grad = None
        batch = ContrastiveBatch(z=z, labels=labels, captions=captions)
        loss, metrics = objective(batch)
        loss.backward()
        assert math.isfinite(loss.item()) and math.isfinite(metrics["loss"]), objective
        assert torch.isfinite(z.grad).all(), objective
        if pattern != "one_class":  # one class: L_in and SINCERE are constant (zero grad)
            assert z.grad.abs().sum() > 0, objective
    logits = torch.randn(n, v, c, generator=rng).to(dtype).requires_grad_()
    cone = CoNe(c, d, tau_sup=1e-3, tau_dc=1e-3, bank_size=12, top_n=3)
    for _ in range(2):
        batch = ContrastiveBatch(
            z=z, labels=labels % c, logits=logits, ema_z=z.detach(), ema_logits=logits.detach()
        )
        loss, _ = cone(batch)
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(logits.grad).all()


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: InfoNCE(0.0), "tau=0.0 is not allowed: it must be a finite number > 0"),
        (lambda: InfoNCE(-1), "tau=-1 is not allowed"),
        (lambda: InfoNCE(float("nan")), "tau=nan is not allowed"),
        (lambda: SupCon(0.1, variant="sideways"), "variant='sideways' is not allowed"),
        (lambda: XCLR(0.1, tau_s=0.0, graph="caption"), "tau_s=0.0 is not allowed"),
        (lambda: XCLR(0.1, tau_s=-0.2, graph="caption"), "tau_s=-0.2 is not allowed"),
        (lambda: XCLR(0.1, tau_s=0.1, graph="class"), "needs class_similarity"),
        (lambda: XCLR(0.1, tau_s=0.1, graph="class", class_similarity=torch.ones(2, 3)), "square"),
        (lambda: XCLR(0.1, tau_s=0.1, graph="wordnet"), "graph='wordnet' is not allowed"),
        (lambda: SINCERE(0.1, epsilon=-0.1), "epsilon=-0.1 is not allowed"),
        (lambda: CoNe(3, 4, lambda_sup=-1), "lambda_sup=-1 is not allowed"),
        (lambda: CoNe(3, 4, lambda_dc=-0.5), "lambda_dc=-0.5 is not allowed"),
        (lambda: CoNe(3, 4, bank_size=0), "size=0 is not allowed"),
        (lambda: CoNe(3, 4, top_n=0), "top_n=0 is not allowed"),
        (lambda: CoNe(3, 4, tau_dc=0), "tau_dc=0 is not allowed"),
        (lambda: SupCon(0.1, bank_size=-1), "bank_size=-1 is not allowed"),
        (lambda: SupCon(0.1, bank_size=8), "needs the embedding dim"),
        (lambda: CLIP(0, 3), "must be >= 1"),
    ],
)
def test_bad_construction(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make()


def test_bad_batches() -> None:
    z = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match=r"z must be a float tensor \[batch, views, dim\]"):
        ContrastiveBatch(z=torch.randn(4, 3))
    with pytest.raises(ValueError, match="z must be a float tensor"):
        ContrastiveBatch(z=torch.ones(4, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must be an integer tensor of shape \[4\]"):
        ContrastiveBatch(z=z, labels=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must be an integer tensor"):
        ContrastiveBatch(z=z, labels=torch.zeros(4))
    with pytest.raises(ValueError, match="labels must be >= 0"):
        ContrastiveBatch(z=z, labels=torch.tensor([0, 1, -1, 2]))
    with pytest.raises(ValueError, match=r"captions must be a float tensor \[4, E\]"):
        ContrastiveBatch(z=z, captions=torch.randn(3, 5))
    with pytest.raises(ValueError, match="ema_z must match z's shape"):
        ContrastiveBatch(z=z, ema_z=torch.randn(4, 1, 3))
    with pytest.raises(ValueError, match=r"logits must be a float tensor \[4, 2, classes\]"):
        ContrastiveBatch(z=z, logits=torch.randn(4, 5))
    bad = z.clone()
    bad[1, 0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"z has 1 non-finite value\(s\)"):
        ContrastiveBatch(z=bad)
    with pytest.raises(ValueError, match="captions has 1 non-finite"):
        ContrastiveBatch(z=z, captions=torch.tensor([[1.0], [float("inf")], [0.0], [0.0]]))


def test_missing_fields_name_what_is_needed() -> None:
    z = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="SupCon needs batch field.s. labels"):
        SupCon(0.1)(ContrastiveBatch(z=z))
    with pytest.raises(ValueError, match="SINCERE needs batch field.s. labels"):
        SINCERE(0.1)(ContrastiveBatch(z=z))
    with pytest.raises(ValueError, match="XCLR needs batch field.s. captions"):
        XCLR(0.1, tau_s=0.1, graph="caption")(ContrastiveBatch(z=z))
    with pytest.raises(ValueError, match="XCLR needs batch field.s. labels"):
        XCLR(0.1, tau_s=0.1, graph="class", class_similarity=torch.eye(3))(ContrastiveBatch(z=z))
    with pytest.raises(
        ValueError, match="CoNe needs batch field.s. ema_logits, ema_z, labels, logits"
    ):
        CoNe(3, 3)(ContrastiveBatch(z=z))
    with pytest.raises(ValueError, match="InfoNCE needs batch field.s. ema_z"):
        InfoNCE(0.1, bank_size=4, dim=3)(ContrastiveBatch(z=z))
    with pytest.raises(
        ValueError, match=r"labels span \[0, 5\] but the class similarity matrix is 3×3"
    ):
        XCLR(0.1, tau_s=0.1, graph="class", class_similarity=torch.eye(3))(
            ContrastiveBatch(z=z, labels=torch.tensor([0, 1, 2, 5]))
        )
    logits = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="label 7 is out of range for 3 classes"):
        CrossEntropy(3)(ContrastiveBatch(z=z, labels=torch.tensor([0, 1, 2, 7]), logits=logits))
    with pytest.raises(ValueError, match="logits have 3 classes, the objective was built for 5"):
        CrossEntropy(5)(ContrastiveBatch(z=z, labels=torch.tensor([0, 1, 2, 1]), logits=logits))
    with pytest.raises(ValueError, match="captions have 2 dims, the CLIP head expects 4"):
        CLIP(3, 4)(ContrastiveBatch(z=z, captions=torch.randn(4, 2)))


def test_autocast_does_not_lower_the_loss_precision() -> None:
    """Inside a bf16 autocast region the objective still computes in float32."""
    rng = torch.Generator().manual_seed(0)
    z = torch.randn(16, 2, 32, generator=rng)
    labels = torch.randint(0, 4, (16,), generator=rng)
    captions = torch.randn(16, 8, generator=rng)
    for objective in (SupCon(0.05), XCLR(0.05, tau_s=0.1, graph="caption"), SINCERE(0.05),
                      CLIP(32, 8)):
        batch = ContrastiveBatch(z=z, labels=labels, captions=captions)
        plain = objective(batch)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = objective(batch)[0]
        assert auto.dtype == torch.float32
        assert auto.item() == pytest.approx(plain.item(), rel=1e-6), objective
