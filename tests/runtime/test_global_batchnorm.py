"""GlobalBatchNorm (components/runtime/distributed.py, issue 40 defect 6): BatchNorm over every
rank's
batch with one all-reduce per layer and no host sync. On 2 gloo ranks with unequal shares (one
of them empty in a second case) its outputs, input gradients, parameter gradients (summed
over ranks, as DDP's all-reduce before its division) and running statistics equal plain
BatchNorm's on the concatenated batch; it reads nothing back from the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from components.runtime.distributed import GlobalBatchNorm, convert_global_batchnorm
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded

N, C = 10, 3
SHARES = {"unequal": [slice(0, 7), slice(7, 10)], "empty_rank": [slice(0, 10), slice(10, 10)]}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, C, 4, 4, generator=g, dtype=torch.float64) * 3 + 5  # a large mean
    w = torch.randn(N, C, 4, 4, generator=g, dtype=torch.float64)  # the loss's weights
    return x, w


def _model(global_bn: bool) -> nn.Module:
    torch.manual_seed(1)
    m = nn.Sequential(nn.BatchNorm2d(C), nn.Conv2d(C, C, 1), nn.BatchNorm2d(C)).double()
    with torch.no_grad():
        m[0].weight.uniform_(0.5, 1.5)
        m[0].bias.uniform_(-1, 1)
    return convert_global_batchnorm(m) if global_bn else m


def _step(model: nn.Module, x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = model(x)
    (out * w).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad,  # type: ignore[dict-item]
            **{f"grad.{k}": p.grad for k, p in model.named_parameters()},
            **{f"buf.{k}": b.clone() for k, b in model.named_buffers()}}


def _worker(rank: int, world: int, port: str, out: str, case: str) -> None:
    with gloo_group(rank, world, port):
        x, w = _data()
        sl = SHARES[case][rank]
        model = _model(True)
        from tests.training.test_sync_audit import ReadbackCounter

        with ReadbackCounter() as counter:
            got = _step(model, x[sl], w[sl])
        got["reads"] = torch.tensor([counter.count + counter.implicit])
        torch.save(got, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SHARES))
def test_two_ranks_equal_batchnorm_on_the_whole_batch(case: str, tmp_path: Path) -> None:
    x, w = _data()
    single = _step(_model(False), x, w)
    spawn_bounded(_worker, (2, rendezvous_file(tmp_path), str(tmp_path), case), 2, 240.0)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(int(r["reads"]) == 0 for r in ranks)  # no host read, no data-shaped op
    for key in ("out", "x_grad"):
        torch.testing.assert_close(torch.cat([r[key] for r in ranks]), single[key])
    for key in single:
        if key.startswith("grad."):
            torch.testing.assert_close(ranks[0][key] + ranks[1][key], single[key])
        elif key.startswith("buf."):
            for r in ranks:
                torch.testing.assert_close(r[key], single[key])


def test_not_distributed_it_is_batchnorm_and_state_dicts_load_both_ways() -> None:
    x, w = _data()
    plain, glob = _model(False), _model(True)
    assert isinstance(glob[0], GlobalBatchNorm) and isinstance(glob[2], GlobalBatchNorm)
    assert set(plain.state_dict()) == set(glob.state_dict())
    a, b = _step(plain, x, w), _step(glob, x, w)
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    plain.load_state_dict(glob.state_dict())
    glob.eval(), plain.eval()
    torch.testing.assert_close(glob(x), plain(x))
