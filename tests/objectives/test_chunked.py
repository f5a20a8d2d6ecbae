"""Row-chunked objectives (``reducers.chunked_rows``): with a logit budget small enough to force
several chunks (uneven last chunk included), every A×M objective gives the unchunked loss,
metrics and gradients in float64 — with labels, captions, a class graph, SINCERE's noise mask,
ε's margin, a memory bank and CLIP's two directions."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch

from components.objectives import ContrastiveBatch, Objective
from components.objectives.clip import CLIP
from components.objectives.infonce import InfoNCE
from components.objectives.reducers import chunk_rows
from components.objectives.sincere import SINCERE
from components.objectives.supcon import SupCon
from components.objectives.xclr import XCLR

N, V, D, E, C = 13, 2, 8, 6, 4  # A = 26 anchors


def _sim() -> torch.Tensor:
    rng = np.random.default_rng(3)
    s = rng.uniform(0, 1, (C, C))
    s = (s + s.T) / 2
    np.fill_diagonal(s, 1.0)
    return torch.tensor(s)


OBJECTIVES: dict[str, Callable[[], Objective]] = {
    "simclr": lambda: InfoNCE(0.2),
    "supcon_out": lambda: SupCon(0.1, variant="out"),
    "supcon_in": lambda: SupCon(0.1, variant="in"),
    "sincere": lambda: SINCERE(0.1),
    "eps_supinfonce": lambda: SINCERE(0.1, epsilon=0.3),
    "xclr_class": lambda: XCLR(0.1, tau_s=0.2, graph="class", class_similarity=_sim()),
    "xclr_caption": lambda: XCLR(0.1, tau_s=0.2, graph="caption"),
    "supcon_bank": lambda: SupCon(0.1, bank_size=20, dim=D),
    "clip": lambda: CLIP(D, caption_dim=E, tau=0.07),
}


def _batch(seed: int) -> tuple[ContrastiveBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N, V, D, generator=g, dtype=torch.float64).requires_grad_(True)
    batch = ContrastiveBatch(
        z=z, labels=torch.randint(0, C, (N,), generator=g),
        sample_ids=torch.arange(seed * N, (seed + 1) * N),
        captions=torch.randn(N, E, generator=g, dtype=torch.float64),
        ema_z=torch.randn(N, V, D, generator=g, dtype=torch.float64),
    )
    return batch, z


def _run(objective: Objective, steps: int = 2) -> list[tuple[torch.Tensor, dict, torch.Tensor,
                                                            list[torch.Tensor]]]:
    """Loss, metrics, dL/dz and parameter gradients of ``steps`` steps (the second step sees a
    filled memory bank where there is one)."""
    out = []
    for step in range(steps):
        batch, z = _batch(step)
        objective.zero_grad()
        loss, metrics = objective(batch)
        loss.backward()
        grads = [p.grad.clone() for p in objective.parameters() if p.grad is not None]
        out.append((loss.detach(), metrics, z.grad.clone(), grads))
    return out


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_chunked_equals_unchunked(name: str) -> None:
    whole = OBJECTIVES[name]().double()
    chunked = copy.deepcopy(whole)
    # 7 candidates' rows of float32 logits per chunk (an uneven last chunk)
    chunked.logit_budget_bytes = 4 * 7 * (N * V + 20)  # type: ignore[misc]
    m = N * V + (20 if name == "supcon_bank" else 0)
    if name == "clip":
        assert chunk_rows(N, 2 * N, chunked.logit_budget_bytes) < N  # type: ignore[arg-type]
    else:
        assert 1 < chunk_rows(N * V, m, chunked.logit_budget_bytes) < N * V  # type: ignore[arg-type]
    for (la, ma, ga, pa), (lb, mb, gb, pb) in zip(_run(whole), _run(chunked), strict=True):
        torch.testing.assert_close(lb, la, rtol=1e-12, atol=1e-12)
        assert mb.keys() == ma.keys()
        for k in ma:
            assert mb[k] == pytest.approx(ma[k], rel=1e-12, abs=1e-12), k
        torch.testing.assert_close(gb, ga, rtol=1e-12, atol=1e-12)
        for x, y in zip(pb, pa, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_chunk_rows_fits_the_budget() -> None:
    assert chunk_rows(100, 50, budget_bytes=4 * 50 * 100) == 100  # fits: one chunk
    assert chunk_rows(100, 50, budget_bytes=4 * 50 * 10) == 10
    assert chunk_rows(32768, 32768) == 1024  # the default: 128 MiB of float32 logits
    assert chunk_rows(10, 10**9, budget_bytes=1) == 1  # never zero rows
