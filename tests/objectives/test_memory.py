"""Memory bank (FIFO, any size, state_dict) and EMA (Eq. 8, cosine momentum schedule)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from components.objectives.memory import EMA, MemoryBank, cosine_momentum


def _rows(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, 3)


def _fifo_reference(chunks: list[int], size: int) -> list[int]:
    """Ids a FIFO of ``size`` holds after appending the chunks, in ring-slot order."""
    slots = [-1] * size
    ptr, next_id = 0, 0
    for n in chunks:
        for _ in range(n):
            slots[ptr] = next_id
            ptr, next_id = (ptr + 1) % size, next_id + 1
    return slots


@pytest.mark.parametrize("size", [1, 5, 7, 8])
@pytest.mark.parametrize("chunks", [[3], [3, 3, 3], [8], [2, 9, 1], [5, 5]])
def test_fifo_any_size(size: int, chunks: list[int]) -> None:
    """No "K divisible by batch": any chunk sizes, wrap-around, chunks larger than K."""
    bank = MemoryBank(size, dim=3, num_classes=2)
    start = 0
    for n in chunks:
        ids = torch.arange(start, start + n)
        probs = torch.rand(n, 2)
        bank.enqueue(_rows(start, n), labels=ids % 4, ids=ids, probs=probs)
        start += n
    expected = _fifo_reference(chunks, size)
    assert len(bank) == min(size, sum(chunks))
    assert bank.ids.tolist() == expected
    filled = [i for i in expected if i >= 0]
    assert bank.features[: len(bank), 0].tolist() == [float(i) for i in filled]
    assert bank.labels[: len(bank)].tolist() == [i % 4 for i in filled]
    # The newest K rows survive; the oldest of them sits at the write pointer.
    assert sorted(filled) == list(range(sum(chunks) - len(filled), sum(chunks)))
    if len(bank) == size:
        assert int(bank.ids[int(bank.ptr)]) == min(filled)


def test_state_dict_round_trip_continues_identically() -> None:
    a = MemoryBank(6, dim=3, caption_dim=2)
    a.enqueue(_rows(0, 4), captions=torch.rand(4, 2))
    b = MemoryBank(6, dim=3, caption_dim=2)
    b.load_state_dict(a.state_dict())
    for bank in (a, b):
        bank.enqueue(_rows(4, 5), captions=torch.ones(5, 2))
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert len(b) == 6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0, "dim": 3}, "size=0 is not allowed: it must be an int >= 1"),
        ({"size": 2.5, "dim": 3}, "size=2.5 is not allowed"),
        ({"size": 4, "dim": 0}, "dim=0 must be >= 1"),
        ({"size": 4, "dim": 3, "num_classes": -1}, "must be >= 0"),
    ],
)
def test_bad_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryBank(**kwargs)


def test_bad_enqueue() -> None:
    bank = MemoryBank(4, dim=3, num_classes=2)
    with pytest.raises(ValueError, match=r"bank features must be \[n, 3\], got \(2, 5\)"):
        bank.enqueue(torch.zeros(2, 5), probs=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"this bank stores probs of shape \[2, 2\], got None"):
        bank.enqueue(torch.zeros(2, 3))


def test_cosine_momentum_schedule() -> None:
    assert cosine_momentum(0, 100) == pytest.approx(0.996)
    assert cosine_momentum(50, 100) == pytest.approx(0.998)
    assert cosine_momentum(100, 100) == 1.0
    assert cosine_momentum(150, 100) == 1.0
    values = [cosine_momentum(k, 10) for k in range(11)]
    assert values == sorted(values)
    k, total = 3, 10
    expected = 1 - (1 - 0.996) * (math.cos(math.pi * k / total) + 1) / 2
    assert cosine_momentum(k, total) == pytest.approx(expected)
    with pytest.raises(ValueError, match="total_steps >= 1"):
        cosine_momentum(0, 0)
    with pytest.raises(ValueError, match="base <= final"):
        cosine_momentum(0, 10, base=1.2)


def test_ema_update_is_eq8_and_copies_buffers() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ema = EMA(model)
    assert not any(p.requires_grad for p in ema.parameters())
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.train()
    model(torch.randn(8, 3))  # moves BN running stats
    ema.update(model, momentum=0.9)
    for name, p in model.named_parameters():
        expected = 0.9 * before[name] + 0.1 * p.detach()
        torch.testing.assert_close(ema.module.state_dict()[name], expected)
    torch.testing.assert_close(ema.module[1].running_mean, model[1].running_mean)
    ema.train()
    assert not ema.module.training  # the EMA copy always evaluates in eval mode
    with pytest.raises(ValueError, match=r"EMA momentum=1.5 is not allowed: it must lie in \["):
        ema.update(model, 1.5)
    # Saved and restored with the model that owns it.
    other = EMA(model)
    other.load_state_dict(ema.state_dict())
    torch.testing.assert_close(other.module[0].weight, ema.module[0].weight)
