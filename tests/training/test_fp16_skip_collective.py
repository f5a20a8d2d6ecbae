"""fp16's step skipping is decided for every rank at once (issue 40, defect 4).

With a gradient scaler (``train.amp='fp16'``) a step whose batch fields are not finite is
skipped (:class:`~components.training.step.SkippedStep`). The decision must be the same on every
rank: a rank that skips alone goes on to the next step's all-gathers while the others enter
DDP's gradient all-reduce and the memory bank's all-gather — a hang (NCCL) or a mismatched
collective (gloo). Here 2 gloo ranks run the real training step (a memory-bank SupCon and
CoNe, EMA keys, DDP) with only rank 1's batch made non-finite — its images, or only its EMA
keys (``ema_z`` / ``ema_logits``) — and both ranks must skip the step, then train the next one
in step with each other (the same global loss, identical banks). Every collective has a
timeout and the test waits a bounded time: a hang fails it.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded

WAIT_S = 240.0  # the whole 2-rank run (spawn and imports included); a hang fails after it
B, V, SIZE = 4, 2, 16


def _batch(rank: int, step: int) -> Any:
    g = torch.Generator().manual_seed(10 * step + rank)
    return types.SimpleNamespace(
        images=torch.randn(B, V, 3, SIZE, SIZE, generator=g),
        labels=torch.arange(B) % 2 + 2 * rank % 4,
        sample_ids=torch.arange(B) + B * rank + 100 * step,
        captions=None,
    )


def _worker(rank: int, world: int, port: str, out: str, loss: dict[str, Any],
            poison: str) -> None:
    with gloo_group(rank, world, port, timeout_s=30):
        from components.config import PretrainConfig, from_dict
        from components.training.step import SkippedStep, build_model, train_step, uses_projector
        from tests.support.datasets import tiny_run_config

        cfg = from_dict(PretrainConfig, tiny_run_config(Path("/unused"), Path("/unused"),
                                                        loss=loss, train__amp="none"))
        torch.manual_seed(0)
        model, ema = build_model(cfg.model, cfg.loss, 4, None, 0)
        assert ema is not None  # the bank / CoNe read EMA keys
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, find_unused_parameters=not uses_projector(model.objective),
            forward_sync_buffers=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        scaler = torch.amp.GradScaler("cpu")  # fp16's scaler: its presence makes a skip
        results: list[dict[str, Any]] = []
        for step in range(2):
            batch = _batch(rank, step)
            saved = None
            if step == 0 and rank == 1:  # only rank 1's batch is not finite
                if poison == "images":
                    batch.images[0, 0, 0, 0, 0] = float("nan")
                else:  # the EMA keys only (ema_z, and CoNe's ema_logits)
                    saved = {k: v.clone() for k, v in ema.state_dict().items()}
                    with torch.no_grad():
                        for p in ema.parameters():
                            p.fill_(float("inf"))
            try:
                metrics = train_step(
                    ddp, ema, optimizer, scheduler, scaler, batch, train_cfg=cfg.train,
                    device=torch.device("cpu"), step=step, total_steps=2,
                    ema_momentum=0.99, where=f"rank {rank} step {step}")
                results.append({"loss": float(metrics["loss"])})
            except SkippedStep as e:
                results.append({"skipped": str(e)})
            if saved is not None:
                ema.load_state_dict(saved)
        bank = {k: v.tolist() for k, v in model.objective.state_dict().items()
                if v.is_floating_point()}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps({"steps": results,
                                                                 "bank": bank}))


def _spawn_bounded(args: tuple[Any, ...], world: int = 2) -> None:
    spawn_bounded(_worker, (world, rendezvous_file(args[0]), *args), world, WAIT_S)


LOSSES = {
    "supcon_bank": {"name": "supcon", "tau": 0.2, "bank_size": 24},
    "cone": {"name": "cone", "bank_size": 24, "top_n": 4},
}


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["images", "ema"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_a_non_finite_batch_on_one_rank_skips_the_step_on_every_rank(
        tmp_path: Path, loss: str, poison: str) -> None:
    _spawn_bounded((str(tmp_path), LOSSES[loss], poison))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    first = [r["steps"][0] for r in ranks]
    assert all("skipped" in s for s in first), first  # both ranks skipped step 0
    field = "ema_z" if poison == "ema" else "z"
    assert field in first[1]["skipped"]  # rank 1 names its own field
    assert "another rank" in first[0]["skipped"]  # rank 0: why it skips too
    second = [r["steps"][1] for r in ranks]
    assert all("loss" in s for s in second), second  # then both trained the next step
    assert second[0]["loss"] == second[1]["loss"]  # together: the one global loss
    assert ranks[0]["bank"] == ranks[1]["bank"]  # and the same bank on both
