"""The objectives' per-call shortcuts (issue 33, item 2) keep their answers: cached row numbers
are per (size, views, device) and never shared wrongly, and the positive pairs built without a
mask are exactly the mask's ``nonzero``."""

from __future__ import annotations

import torch

from components.objectives import ContrastiveBatch, InfoNCE, SupCon
from components.objectives.core import _row_numbers
from components.objectives.targets import _equal_key_pairs


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
    loss = SupCon(0.2, "in")
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
