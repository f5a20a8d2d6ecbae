"""The objectives' per-call shortcuts (issue 33, item 2) keep their answers: cached row numbers
are per (size, views, device) and never shared wrongly, the positive pairs built without a
mask are exactly the mask's ``nonzero``, and small batches' masks give what the pairs give."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from components.errors import NonFiniteError
from components.objectives import ContrastiveBatch, InfoNCE, SupCon
from components.objectives.batch import hot_path
from components.objectives.pairing import Pairs, _row_numbers
from components.objectives.reducers import SINGLE_SHIFT_SPREAD
from components.objectives.targets import _equal_key_mask, _equal_key_pairs, soft_targets


def test_cached_row_numbers_are_per_size_views_and_device() -> None:
    cpu = torch.device("cpu")
    for n, v in [(3, 2), (4, 2), (3, 1), (5, 3)]:
        got = _row_numbers(n, v, cpu)
        assert torch.equal(got, torch.arange(n).repeat_interleave(v)), (n, v)
        assert got.device == cpu and got.dtype == torch.int64
    assert _row_numbers(3, 2, cpu) is _row_numbers(3, 2, cpu)  # cached
    assert _row_numbers(3, 2, cpu) is not _row_numbers(4, 2, cpu)
    meta = _row_numbers(3, 2, torch.device("meta"))  # another device: its own tensor
    assert meta.device.type == "meta" and meta.shape == (6,)


def test_cached_row_numbers_survive_inference_mode() -> None:
    """Made first under inference mode, the cache still serves a step with autograd."""
    with torch.inference_mode():
        _row_numbers(7, 2, torch.device("cpu"))
    assert not _row_numbers(7, 2, torch.device("cpu")).is_inference()
    z = torch.randn(7, 2, 4, requires_grad=True)
    InfoNCE(0.5)(ContrastiveBatch(z=z))[0].backward()
    assert z.grad is not None


def test_batches_of_different_sizes_in_turn_keep_their_values() -> None:
    """Alternating sizes (cache hits and misses) gives each size its own fresh value."""
    g = torch.Generator().manual_seed(0)
    zs = {b: torch.randn(b, 2, 8, generator=g) for b in (3, 5)}
    labels = {b: torch.randint(0, 2, (b,), generator=g) for b in (3, 5)}
    loss = SupCon(0.2, variant="in")
    first = {b: loss(ContrastiveBatch(z=zs[b], labels=labels[b]))[0] for b in (3, 5)}
    for b in (5, 3, 5):
        assert torch.equal(loss(ContrastiveBatch(z=zs[b], labels=labels[b]))[0], first[b])


def test_equal_key_pairs_are_the_masks_nonzero() -> None:
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        a = torch.randint(-1, 4, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g)
        c = torch.cat([a, torch.randint(-1, 4, (int(torch.randint(0, 6, (1,), generator=g)),),
                                        generator=g)])
        own = torch.arange(a.numel())
        if trial % 2 and a.numel():  # own columns anywhere, keys matching or not
            c = c[torch.randperm(c.numel(), generator=g)]
            own = torch.randint(0, c.numel(), (a.numel(),), generator=g)
        mask = (a[:, None] == c[None, :]) & (a[:, None] >= 0)
        mask[torch.arange(a.numel()), own] = False
        rows, cols = _equal_key_pairs(a, c, own)
        want_rows, want_cols = mask.nonzero(as_tuple=True)
        assert torch.equal(rows, want_rows) and torch.equal(cols, want_cols), (a, c, own)


def test_equal_key_masks_are_the_pairs_as_a_mask() -> None:
    """The small-batch masks (bool and 0/1 float) hold exactly the positive pairs."""
    g = torch.Generator().manual_seed(2)
    for _ in range(100):
        a = torch.randint(-1, 4, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g)
        c = torch.cat([a, torch.randint(-1, 4, (5,), generator=g)])  # + bank-like rows
        own = torch.arange(a.numel())
        want_rows, want_cols = _equal_key_pairs(a, c, own)
        mask = _equal_key_mask(a, c, own)
        rows, cols = mask.nonzero(as_tuple=True)
        assert torch.equal(rows, want_rows) and torch.equal(cols, want_cols), (a, c)
        got = _equal_key_mask(a, c, own, torch.float32)
        assert got.dtype == torch.float32 and torch.equal(got, mask.float()), (a, c)


@pytest.mark.parametrize("loss", ["simclr", "supcon_out", "supcon_in"])
def test_masks_and_pairs_give_the_same_loss_and_gradient(loss: str) -> None:
    """Float32, a batch of training's shape (many rows, 10 classes, sample ids; for SupCon one
    view, so that singleton classes have no positive): the mask path (small batches) and the
    pair path agree."""
    g = torch.Generator().manual_seed(3)
    b = 96
    z = torch.randn(b, 2 if loss == "simclr" else 1, 16, generator=g)
    labels = torch.randint(0, 10, (b,), generator=g)
    labels[:3] = torch.tensor([97, 98, 99])  # singleton classes
    fields = {"sample_ids": torch.randperm(10 * b, generator=g)[:b]}
    if loss != "simclr":
        fields["labels"] = labels
    results = []
    for entries in (1 << 40, 0):  # masks, then pairs
        objective = InfoNCE(0.1) if loss == "simclr" else SupCon(0.1, variant=loss.split("_")[1])
        objective.dense_graph_entries = entries  # type: ignore[misc]
        zz = z.clone().requires_grad_()
        value, metrics = objective(ContrastiveBatch(z=zz, **fields))
        value.backward()
        results.append((value.detach(), zz.grad, metrics["anchors_without_positive"]))
    (v_mask, g_mask, n_mask), (v_pairs, g_pairs, n_pairs) = results
    torch.testing.assert_close(v_mask, v_pairs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_mask, g_pairs, rtol=1e-4, atol=1e-7)
    assert n_mask == n_pairs == (0 if loss == "simclr" else 3)


@pytest.mark.parametrize("tau", [0.1, 0.01])
def test_supcon_in_keeps_positives_far_below_the_row_max(tau: float) -> None:
    """L_in with masks sums the positives' exp under the row max's shift; a positive 150
    logits below it would underflow in float32, so past a spread of 2/τ > 80 the loss takes
    the pair path. Anchor 0's positive is at cos −0.5 and a negative at cos 1: the loss of
    its row is logsumexp − s_p (one positive), here checked in float64 by hand."""
    z = torch.tensor([[1.0, 0.0], [-0.5, 0.75 ** 0.5], [1.0, 0.0]])[:, None, :]  # V = 1
    labels = torch.tensor([0, 0, 1])
    objective = SupCon(tau, variant="in")
    objective.dense_graph_entries = 1 << 40  # type: ignore[misc]
    value, _ = objective(ContrastiveBatch(z=z, labels=labels))
    s = torch.tensor([[-0.5, 1.0], [-0.5, -0.5]], dtype=torch.float64) / tau  # rows 0, 1
    want = (torch.logsumexp(s, 1) - s[:, 0]).mean()  # anchor 2 has no positive
    assert torch.isfinite(value)
    torch.testing.assert_close(value.double(), want, rtol=1e-5, atol=1e-5)


def test_single_shift_spread_keeps_exps_normal() -> None:
    """The bound's premise: exp of −SINGLE_SHIFT_SPREAD is a normal float32."""
    assert torch.exp(torch.tensor(-SINGLE_SHIFT_SPREAD)) >= torch.finfo(torch.float32).tiny


def test_batch_checks_by_sums_raise_only_for_real_non_finite_values() -> None:
    """A batch's finite check is a sum per field: finite values whose sum overflows pass (the
    failure path counts), a NaN or inf is named with its count, in and out of the step."""
    big = torch.full((4, 2, 3), 3e38)  # finite; its sum is inf in float32
    for step in (False, True):
        with hot_path() if step else contextlib.nullcontext():
            value, _ = InfoNCE(0.5)(ContrastiveBatch(z=big.clone()))
        assert torch.isfinite(value)
        bad = torch.randn(4, 2, 3)
        bad[1, 0, 2] = float("nan")
        bad[2, 1, 0] = float("inf")
        with pytest.raises(NonFiniteError, match=r"z has 2 non-finite"):
            with hot_path() if step else contextlib.nullcontext():
                InfoNCE(0.5)(ContrastiveBatch(z=bad))


def test_soft_targets_far_below_the_row_max_are_still_the_softmax() -> None:
    """At τ_s = 0.01 most of a caption graph's row lies > 87 below its max once divided by
    τ_s, where float32 exp leaves its normal range (and CPU exp its fast path): the targets
    are floored there yet equal the float64 softmax over the other candidates, with the own
    column exactly 0."""
    g = torch.Generator().manual_seed(4)
    captions = torch.nn.functional.normalize(torch.randn(64, 16, generator=g), dim=1)
    captions[1] = captions[0]  # a shared caption: the row max at cos 1
    views = 2
    rows = captions.repeat_interleave(views, 0)  # [A, E], A = 128
    sim = rows @ rows.T
    own = torch.arange(rows.shape[0])
    pairs = Pairs(anchors=rows, candidates=rows, self_index=own, anchor_ids=own,
                  candidate_ids=own, views=views)
    got = soft_targets(sim, pairs, 0.01)
    want = (sim.double() / 0.01).fill_diagonal_(-math.inf).softmax(1)
    assert (sim.double() / 0.01 - (sim.double() / 0.01).fill_diagonal_(-math.inf).amax(1,
            keepdim=True) < -87).double().mean() > 0.5  # the case this guards
    assert torch.equal(got.diagonal(), torch.zeros(rows.shape[0]))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-12)
