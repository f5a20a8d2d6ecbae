"""Distributed exactness: 2- and 3-process gloo runs equal the single-process computation.

Each rank holds a slice of one global batch (uneven sizes, a class absent from some ranks), a
DDP-wrapped linear "encoder" maps it to embeddings (and classifier logits), and the objective
is computed over the global batch through :mod:`components.runtime.distributed`. After backward,
DDP's
averaged parameter gradients and the logged global loss must equal the single-process result
on the concatenated batch; memory banks must be identical on every rank. Two steps are run so
that bank-based losses are checked with a non-empty bank too. The equal-batch fast path (the
training step's ``hot_path(equal_batches=True)``: gathers given every rank's size, no size
exchange) must give the same results as the exchanging path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from components.objectives import (
    CLIP,
    SINCERE,
    XCLR,
    CoNe,
    ContrastiveBatch,
    CrossEntropy,
    InfoNCE,
    Objective,
    SupCon,
)
from components.objectives.batch import hot_path
from components.runtime import distributed
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded

WAIT_S = 240.0  # spawn, imports and every case; a hung rank fails the test

N, V, D_IN, D, C, E = 7, 2, 6, 5, 4, 3
LABELS = torch.tensor([0, 0, 1, 2, 2, 1, 3])  # class 3 is a singleton, on the last rank only

CASES: dict[str, Callable[[], Objective]] = {
    "simclr": lambda: InfoNCE(0.2),
    "supcon_out": lambda: SupCon(0.2, variant="out"),
    "supcon_in": lambda: SupCon(0.2, variant="in"),
    "supcon_bank": lambda: SupCon(0.2, variant="out", bank_size=9, dim=D),
    "xclr_class": lambda: XCLR(0.2, tau_s=0.3, graph="class", class_similarity=_class_sim()),
    "xclr_caption_bank": lambda: XCLR(0.2, tau_s=0.3, graph="caption", bank_size=5, dim=D,
                                      caption_dim=E),
    "sincere": lambda: SINCERE(0.2),
    "eps_supinfonce": lambda: SINCERE(0.2, epsilon=0.1),
    "cone": lambda: CoNe(C, D, bank_size=11, top_n=4, tau_sup=0.2, tau_dc=0.1),
    "ce": lambda: CrossEntropy(C, label_smoothing=0.1),
    "clip": lambda: CLIP(D, caption_dim=E, tau=0.2),
}


def _class_sim() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    m = torch.rand(C, C, generator=g)
    return (m + m.T) / 2 + torch.eye(C)


def _data(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {
        "x": torch.randn(N, V, D_IN, generator=g, dtype=torch.float64),
        "labels": LABELS,
        "sample_ids": torch.arange(N) + 1000 * step,
        "captions": torch.randn(N, E, generator=g, dtype=torch.float64),
    }


def _models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    online = nn.Linear(D_IN, D + C).double()
    ema = nn.Linear(D_IN, D + C).double()
    return online, ema


def _step(model: nn.Module, ema: nn.Module, objective: Objective, sl: slice, step: int,
          equal: bool = False):  # type: ignore[no-untyped-def]
    data = _data(step)
    out = model(data["x"][sl])
    with torch.no_grad():
        key = ema(data["x"][sl])
    # equal: as the training step builds batches (checks deferred, every rank's size known)
    with hot_path(equal_batches=True) if equal else contextlib.nullcontext():
        batch = ContrastiveBatch(
            z=out[..., :D],
            logits=out[..., D:],
            ema_z=key[..., :D],
            ema_logits=key[..., D:],
            labels=data["labels"][sl],
            sample_ids=data["sample_ids"][sl],
            captions=data["captions"][sl],
        )
        loss, metrics = objective(batch)
    loss.backward()
    return metrics


def _run(name: str, slices: list[slice], rank: int, equal: bool = False) -> dict:
    """Two optimisation-free steps; returns grads, metrics and objective state per step, and
    how many size exchanges (``gathered_sizes`` calls) the steps made."""
    model, ema = _models()
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    objective = CASES[name]().double()
    results = []
    with _counting_exchanges() as exchanges:
        for step in range(2):
            model.zero_grad()
            metrics = _step(model, ema, objective, slices[rank], step, equal)
            grads = {k.removeprefix("module."): p.grad.clone()
                     for k, p in model.named_parameters()}
            results.append({"metrics": metrics, "grads": grads})
    state = {k: v.clone() for k, v in objective.state_dict().items()}
    return {"steps": results, "state": state, "exchanges": exchanges[0]}


@contextlib.contextmanager
def _counting_exchanges() -> Iterator[list[int]]:
    """``[n]``: how many times ``distributed.gathered_sizes`` (the size exchange) ran inside
    (distributed.py, batch.py and memory.py all look it up on the module)."""
    calls = [0]
    real = distributed.gathered_sizes

    def counted(n_local: int, device: torch.device | None = None) -> list[int]:
        calls[0] += 1
        return real(n_local, device)

    distributed.gathered_sizes = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        distributed.gathered_sizes = real  # type: ignore[assignment]


def _slices(world: int) -> list[slice]:
    sizes = [N // world + (r < N % world) for r in range(world)]  # 7 → [4,3] or [3,2,2]
    bounds = [sum(sizes[:r]) for r in range(world + 1)]
    return [slice(bounds[r], bounds[r + 1]) for r in range(world)]


def _worker(rank: int, world: int, port: str, out: str) -> None:
    with gloo_group(rank, world, port, timeout_s=60):
        results = {name: _run(name, _slices(world), rank) for name in CASES}
        torch.save(results, Path(out) / f"rank{rank}.pt")
        # then the training step's case in the same group: equal batches, no size exchange
        _gather_checks(rank, world)
        equal = {name: _run(name, _even_slices(world), rank, equal=True) for name in CASES}
        torch.save(equal, Path(out) / f"equal{rank}.pt")


def _gather_checks(rank: int, world: int) -> None:
    """gather / row_offset given every rank's size equal the exchanging calls, with the same
    gradient; sizes that contradict this rank's rows are refused."""
    for sizes in ([3] * world, [4 - (r % 2) for r in range(world)]):  # equal, then ragged
        x = torch.arange(sizes[rank] * 2, dtype=torch.float64).view(-1, 2) + 100 * rank
        a = x.clone().requires_grad_(True)
        b = x.clone().requires_grad_(True)
        weight = torch.arange(2 * sum(sizes), dtype=torch.float64).view(-1, 2)
        got, want = distributed.gather(a, sizes=sizes), distributed.gather(b)
        assert torch.equal(got, want)
        (got * weight).sum().backward()
        (want * weight).sum().backward()
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
        assert torch.equal(distributed.gather(x, grad=False, sizes=sizes),
                           distributed.gather(x, grad=False))
        assert distributed.row_offset(sizes[rank], sizes=sizes) == sum(sizes[:rank])
        assert distributed.row_offset(sizes[rank], sizes=sizes) == \
            distributed.row_offset(sizes[rank])
    with pytest.raises(ValueError, match="this rank .rank .* has 2 rows"):
        distributed.gather(torch.zeros(2, 2), sizes=[3] * world)
    with pytest.raises(ValueError, match="must give each of the"):
        distributed.gather(torch.zeros(3, 2), sizes=[3])


EVEN_N = 6  # the first 6 of the N rows: an equal share on 2 or 3 ranks


def _even_slices(world: int) -> list[slice]:
    share = EVEN_N // world
    return [slice(r * share, (r + 1) * share) for r in range(world)]


@pytest.fixture(scope="module")
def single() -> dict:
    return {name: _run(name, [slice(0, N)], 0) for name in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_matches_single_process(world: int, single: dict, tmp_path: Path) -> None:
    """Uneven batches (7 rows over the ranks) equal one process on all 7; then, in the same
    process group, the training step's case (:func:`_equal_batches_match`)."""
    spawn_bounded(_worker, (world, rendezvous_file(tmp_path), str(tmp_path)), world, WAIT_S)
    _equal_batches_match(world, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    _assert_same(ranks, single, world)
    # Uneven batches: every objective exchanges sizes once per step (CE gathers nothing),
    # not once per gather (CLIP had 3 per step, CoNe's bank 1 of its own).
    for name in CASES:
        assert [r[name]["exchanges"] for r in ranks] == [0 if name == "ce" else 2] * world, name
    # The test is not vacuous: the second step of bank losses did use a filled bank.
    assert single["cone"]["steps"][1]["metrics"]["bank_fill"] > 0
    assert single["cone"]["steps"][1]["metrics"]["sup_in"] > 0
    assert single["supcon_bank"]["steps"][1]["metrics"]["bank_fill"] > 0


def _equal_batches_match(world: int, tmp_path: Path) -> None:
    """Inside ``hot_path(equal_batches=True)`` (the training step), the ranks with equal shares
    of 6 rows equal the single process on those 6 rows, and no objective exchanges sizes at
    all (the uneven runs before show that the counter counts); ``gather`` / ``row_offset``
    given the sizes equal the exchanging calls (:func:`_gather_checks`, in the workers)."""
    single = {name: _run(name, [slice(0, EVEN_N)], 0, equal=True) for name in CASES}
    ranks = [torch.load(tmp_path / f"equal{r}.pt", weights_only=True) for r in range(world)]
    _assert_same(ranks, single, world)
    for name in CASES:
        assert [r[name]["exchanges"] for r in ranks] == [0] * world, name


def _assert_same(ranks: list[dict], single: dict, world: int) -> None:
    for name in CASES:
        ref = single[name]
        for r, result in enumerate(ranks):
            for step, (got, want) in enumerate(
                zip(result[name]["steps"], ref["steps"], strict=True)
            ):
                where = f"{name} world={world} rank={r} step={step}"
                for key, value in want["metrics"].items():
                    assert got["metrics"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (
                        f"{where} metric {key}"
                    )
                for key, grad in want["grads"].items():
                    torch.testing.assert_close(
                        got["grads"][key], grad, rtol=1e-9, atol=1e-12, msg=f"{where} {key}"
                    )
            # Banks (and every other piece of objective state) identical to single process.
            for key, value in ref["state"].items():
                torch.testing.assert_close(result[name]["state"][key], value, msg=f"{name} {key}")
