"""``train.accumulate: k`` (issue 43 item 5): the gradient of one batch of B samples per rank
computed in k encoder chunks of B/k (the "gradient cache": the chunks embedded without a
graph, the loss and d loss / d embeddings on the whole batch, then each chunk re-run with a
graph and its slice backpropagated), so activation memory is a chunk's while every loss sees
the whole batch.

* every loss, a model without batch-dependent layers (BatchNorm in eval mode), float64: the
  parameter gradients (objective's own parameters included: CLIP's head), the loss and the
  memory bank after two steps equal the unchunked step's;
* BatchNorm in train mode: the gradient is that of k chunks run separately with a graph, their
  outputs concatenated and the loss taken on the whole (what k DDP ranks of B/k compute
  without SyncBN), and the running statistics are k sequential updates (once per chunk);
* dropout: pass 2 draws the masks pass 1 drew (the same reference), and the global RNG ends
  where pass 1 left it;
* fp16's gradient scaler: scaled cached gradients give the unscaled gradient; a non-finite
  batch still skips the step;
* the config: ``accumulate`` an int >= 1 that divides ``data.batch_size``; an older stored
  config (no key) loads as 1 and a resume may change it (it moves no LR);
* a short in-process run with ``accumulate: 2`` trains (finite loss);
* DDP (2 gloo ranks, ``slow``): each rank's accumulated step gives the single-process
  gradient of the concatenated batch.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import json
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import (
    LOSS_CONFIGS,
    ConfigError,
    ModelConfig,
    PretrainConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from components.data.reader import Batch
from components.runs.resume import config_diff, resume_changes
from components.training.optim import build_optimizer, build_scheduler
from components.training.step import (
    NonFiniteLossError,
    PretrainModel,
    SkippedStep,
    build_model,
    train_step,
)
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded

C, E, B, V = 3, 6, 8, 2
MODEL = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16, projector_dim=8)
LOSSES: dict[str, dict[str, Any]] = {
    "simclr": {},
    "simclr_bank": {"name": "simclr", "bank_size": 20},
    "supcon": {"bank_size": 20},
    "supcon_in": {"name": "supcon", "variant": "in"},
    "xclr": {"graph": "class"},
    "xclr_caption": {"name": "xclr", "graph": "caption", "bank_size": 20},
    "sincere": {},
    "eps_supinfonce": {"epsilon": 0.2, "bank_size": 20},
    "cone": {"bank_size": 24, "top_n": 4},
    "ce": {},
    "clip": {"caption_dim": E},
}
CPU = torch.device("cpu")


def _batch(seed: int = 0, dtype: torch.dtype = torch.float64, b: int = B) -> Batch:
    g = torch.Generator().manual_seed(seed)
    caps = torch.nn.functional.normalize(torch.randn(b, E, generator=g, dtype=dtype), dim=1)
    return Batch(images=torch.randn(b, V, 3, 12, 12, generator=g, dtype=dtype),
                 labels=torch.arange(b) % C, sample_ids=torch.arange(b) + 10 * seed,
                 captions=caps)


def _setup(name: str, dtype: torch.dtype = torch.float64) -> tuple[Any, ...]:
    spec = dict(LOSSES[name])
    loss_cfg = from_dict(LOSS_CONFIGS[spec.pop("name", name)], spec)
    torch.manual_seed(0)
    model, ema = build_model(MODEL, loss_cfg, C, torch.eye(C) * 0.5 + 0.5, E)
    model.to(dtype)
    if ema is not None:
        ema.to(dtype)
    return model, ema


def _optim(model: torch.nn.Module) -> tuple[Any, Any]:
    opt = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    return opt, build_scheduler(opt, total_steps=10, warmup_steps=2)


def _step(model: Any, ema: Any, opt: Any, sched: Any, batch: Batch, k: int, step: int = 0,
          scaler: Any = None, amp: str = "none", grad_clip: float | None = None
          ) -> dict[str, Any]:
    return train_step(model, ema, opt, sched, scaler, batch,
                      train_cfg=TrainConfig(accumulate=k, amp=amp, grad_clip=grad_clip),
                      device=CPU, step=step,
                      total_steps=10, ema_momentum=0.99, where=f"step {step}")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gradients the last step left on the parameters (zeroed at the next step's start)."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], **tol: float) -> None:
    assert sorted(got) == sorted(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=lambda m, n=n: f"{n}: {m}", **tol)


# ----------------------------------------------------------------------------- exact, every loss


@pytest.mark.parametrize(("name", "k"), [(name, 2) for name in sorted(LOSSES)]
                         + [(name, 4) for name in ("clip", "cone", "simclr_bank")])
def test_accumulated_step_equals_the_unchunked_step_for_every_loss(name: str, k: int) -> None:
    """BatchNorm in eval mode (no batch-dependent layer): k chunks give the unchunked step's
    gradients, loss, gradient norm and bank to float64 rounding, over two steps (the second
    with a bank holding the first batch's keys: CoNe's neighbour and distribution terms).
    The gradients are read after clipping (``grad_clip``): clipped once, after pass 2."""
    model, ema = _setup(name)
    model.encoder.eval()
    twin, twin_ema = copy.deepcopy(model), copy.deepcopy(ema)
    runs = []
    for m, e, kk in ((model, ema, 1), (twin, twin_ema, k)):
        opt, sched = _optim(m)
        torch.manual_seed(0)
        steps = []
        for step in range(2):
            metrics = _step(m, e, opt, sched, _batch(seed=step), kk, step, grad_clip=0.05)
            steps.append((metrics, _grads(m)))
        runs.append(steps)
    for (want_m, want_g), (got_m, got_g) in zip(*runs, strict=True):
        assert got_g, "no gradient"
        _close(got_g, want_g, rtol=1e-10, atol=1e-12)
        assert got_m.keys() == want_m.keys()
        for key in want_m:  # grad_norm: a 0-d tensor
            assert float(got_m[key]) == pytest.approx(float(want_m[key]), rel=1e-12,
                                                      abs=1e-12), key
        assert float(want_m["grad_norm"]) > 0.05  # the clip did act
    if name == "clip":  # the objective's own parameters are trained too
        assert any(n.startswith("objective.head") for n in runs[1][0][1])
    bank = getattr(model.objective, "bank", None)
    if bank is not None:
        other = twin.objective.bank
        assert len(other) == len(bank) > 0
        for key, value in bank.state_dict().items():
            torch.testing.assert_close(other.state_dict()[key], value, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------- BatchNorm, dropout, scaler


def _per_chunk_reference(model: PretrainModel, ema: Any, batch: Batch,
                         k: int) -> dict[str, torch.Tensor]:
    """What k DDP ranks of B/k without SyncBN compute: each chunk through the model on its
    own with a graph (its own BatchNorm statistics, one running-statistics update each), the
    outputs concatenated, the loss on the whole batch, one backward."""
    parts = [model.encode(x) for x in batch.images.split(batch.images.shape[0] // k)]
    z = torch.cat([p[0] for p in parts])
    logits = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
    ez = el = None
    if ema is not None:
        ez, el = model.encode(batch.images, ema)
    loss, _ = model.objective(model.contrastive_batch(
        z, logits, ez, el, batch.labels, batch.sample_ids, batch.captions))
    model.zero_grad(set_to_none=True)
    loss.backward()
    return _grads(model)


@pytest.mark.parametrize("name", ["supcon", "cone", "clip"])
def test_batchnorm_in_train_mode_normalises_each_chunk_and_updates_once_per_chunk(
        name: str) -> None:
    k = 2
    model, ema = _setup(name)
    ref = copy.deepcopy(model)
    torch.manual_seed(0)
    want = _per_chunk_reference(ref, copy.deepcopy(ema), _batch(), k)
    opt, sched = _optim(model)
    torch.manual_seed(0)
    _step(model, ema, opt, sched, _batch(), k)
    _close(_grads(model), want, rtol=1e-10, atol=1e-12)
    stats = {n: b for n, b in model.encoder.named_buffers()}
    assert stats and all(int(b) == k for n, b in stats.items() if "num_batches_tracked" in n)
    for n, b in ref.encoder.named_buffers():  # k sequential updates, not 2k
        torch.testing.assert_close(stats[n], b, rtol=1e-12, atol=1e-14)


def test_dropout_masks_of_pass_two_are_those_of_pass_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropout in the projector: the accumulated gradient is the per-chunk reference's drawn
    from the same seed (pass 2 replays each chunk's RNG state), and the global RNG ends where
    the reference's does (pass 2 draws nothing from it). Without the replay it would not be."""
    k = 4
    model, ema = _setup("simclr")
    model.encoder.projector = torch.nn.Sequential(torch.nn.Dropout(0.5),
                                                  model.encoder.projector)
    model.encoder.eval()
    model.encoder.projector[0].train()
    ref, unreplayed = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(3)
    want = _per_chunk_reference(ref, ema, _batch(), k)
    after_ref = torch.rand(1)
    torch.manual_seed(3)
    _step(model, ema, *_optim(model), _batch(), k)
    _close(_grads(model), want, rtol=1e-10, atol=1e-12)
    assert torch.equal(torch.rand(1), after_ref)

    from components.training import accumulate

    monkeypatch.setattr(accumulate, "_replayed_rng", lambda *a: contextlib.nullcontext())
    torch.manual_seed(3)  # pass 2 draws fresh masks: the test would see it
    _step(unreplayed, ema, *_optim(unreplayed), _batch(), k)
    name = "encoder.projector.1.0.weight"
    assert not torch.allclose(_grads(unreplayed)[name], want[name])


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")  # the skip
def test_gradient_scaler_gives_the_unscaled_gradient_and_still_skips_non_finite() -> None:
    model, ema = _setup("supcon", torch.float32)
    model.encoder.eval()
    twin, twin_ema = copy.deepcopy(model), copy.deepcopy(ema)
    _step(model, ema, *_optim(model), _batch(dtype=torch.float32), 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    _step(twin, twin_ema, *_optim(twin), _batch(dtype=torch.float32), 2, scaler=scaler)
    _close(_grads(twin), _grads(model), rtol=1e-4, atol=1e-6)

    bad = _batch(dtype=torch.float32)
    bad.images[1, 0, 0, 0, 0] = float("inf")
    before = [p.detach().clone() for p in twin.parameters()]
    with pytest.raises(SkippedStep, match="non-finite"):
        _step(twin, twin_ema, *_optim(twin), bad, 2, scaler=scaler)
    with pytest.raises(NonFiniteLossError, match="step 0: z has .* non-finite"):
        _step(twin, twin_ema, *_optim(twin), bad, 2)  # no scaler: the run stops
    assert all(torch.equal(p, q) for p, q in zip(twin.parameters(), before, strict=True))


def test_bf16_autocast_accumulated_step_is_close_to_the_unchunked_one() -> None:
    model, ema = _setup("simclr", torch.float32)
    model.encoder.eval()
    twin = copy.deepcopy(model)
    a = _step(model, ema, *_optim(model), _batch(dtype=torch.float32), 1, amp="bf16")
    b = _step(twin, ema, *_optim(twin), _batch(dtype=torch.float32), 2, amp="bf16")
    assert math.isfinite(b["loss"]) and b["loss"] == pytest.approx(a["loss"], rel=2e-2)


@pytest.mark.parametrize("name", ["cone", "clip"])  # bank, EMA, logits; the objective's head
def test_an_accumulated_step_reads_back_no_more_than_an_unchunked_one(name: str) -> None:
    """The chunks, the RNG replay, the buffers' restore: device work only; the step keeps
    the objective's one read (tests/training/test_sync_audit.py's budget)."""
    from tests.training.test_sync_audit import BUDGET, ReadbackCounter

    model, ema = _setup(name, torch.float32)
    opt, sched = _optim(model)
    for step in range(2):  # step 0 fills the banks; step 1 reads them
        with ReadbackCounter() as counter:
            _step(model, ema, opt, sched, _batch(seed=step, dtype=torch.float32), 4, step)
        assert counter.count <= BUDGET[name], f"{name} step {step}: {dict(counter.where)}"


# ------------------------------------------------------------------------------------ config


def _run_cfg(**over: Any) -> dict[str, Any]:
    return tiny_run_config(Path("/unused"), Path("/unused"), **over)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_accumulate_must_be_an_integer_of_at_least_one(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"train\.accumulate=\S+ (is not allowed: it )?must "
                                          r"be an integer"):
        from_dict(PretrainConfig, _run_cfg(train__accumulate=bad))


def test_accumulate_must_divide_the_batch() -> None:
    with pytest.raises(ConfigError, match=r"train\.accumulate=3 does not divide "
                                          r"data\.batch_size=16.*\b1, 2, 4, 8 or 16\b"):
        from_dict(PretrainConfig, _run_cfg(train__accumulate=3))
    assert from_dict(PretrainConfig, _run_cfg(train__accumulate=4)).train.accumulate == 4


def test_a_stored_config_without_accumulate_loads_as_one_and_a_resume_may_change_it() -> None:
    cfg = from_dict(PretrainConfig, _run_cfg())
    old = to_dict(cfg)
    del old["train"]["accumulate"]  # a run stored before the key existed
    assert from_dict(PretrainConfig, old) == cfg and cfg.train.accumulate == 1
    new = from_dict(PretrainConfig, _run_cfg(train__accumulate=4))
    assert config_diff(old, to_dict(new)) == []  # a memory setting: the same run
    assert resume_changes(old, new) == []  # moves no learning rate


def test_the_run_summary_says_the_encoder_runs_in_chunks() -> None:
    from components.runs.dataset_checks import RunFacts
    from components.runs.summary import run_summary

    facts = RunFacts(num_classes=4, caption_dim=0, dataset={}, knn=False, knn_note="",
                     needs_captions=False, splits={"train": 128})
    text = run_summary(from_dict(PretrainConfig, _run_cfg(train__accumulate=4)), facts, "/r")
    assert "2 worker(s) x 16 = 32 global" in text  # the batch and the steps are unchanged
    assert "4 steps/epoch x 4 epochs = 16 steps; encoder in 4 chunks of 4 (train.accumulate)" \
        in text
    assert "chunks" not in run_summary(from_dict(PretrainConfig, _run_cfg()), facts, "/r")


# ------------------------------------------------------------------------ an in-process run


def test_a_short_in_process_run_with_accumulate_trains(tmp_path: Path) -> None:
    from components.runs.recipe import run_pretraining

    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)  # 2 steps
    cfg = tiny_run_config(data, tmp_path / "runs", knn__every_epochs=0, train__epochs=1,
                          train__accumulate=2,
                          scaling={"num_workers": 1, "cpus_per_worker": 1.0,
                                   "host": "in_process"})
    run_pretraining(from_dict(PretrainConfig, cfg), echo=False)
    with open(tmp_path / "runs" / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and math.isfinite(float(rows[0]["loss"]))


# --------------------------------------------------------------------------- DDP, 2 gloo ranks

WAIT_S = 240.0


def _whole_batch(multicrop: bool) -> Batch:
    """The DDP tests' global batch: ``V`` views of 12 px, or (``multicrop``) those and two
    more of 8 px — a MultiCrop: the encoder called once per size inside one DDP forward."""
    full = _batch(seed=7)
    if not multicrop:
        return full
    from components.data.multicrop import MultiCrop

    g = torch.Generator().manual_seed(8)
    small = torch.randn(B, 2, 3, 8, 8, generator=g, dtype=full.images.dtype)
    return dataclasses.replace(full, images=MultiCrop((full.images, small)))


def _ddp_batch(rank: int, multicrop: bool) -> Any:
    full = _whole_batch(multicrop)
    rows = slice(rank * B // 2, (rank + 1) * B // 2)
    images = (full.images.split(B // 2)[rank] if multicrop else full.images[rows])
    return types.SimpleNamespace(images=images, labels=full.labels[rows],
                                 sample_ids=full.sample_ids[rows], captions=full.captions[rows])


def _ddp_worker(rank: int, world: int, port: str, out: str, name: str, multicrop: bool) -> None:
    with gloo_group(rank, world, port, timeout_s=60):
        model, ema = _setup(name)
        model.encoder.eval()
        ddp = torch.nn.parallel.DistributedDataParallel(model, forward_sync_buffers=False)
        opt, sched = _optim(model)
        metrics = _step(ddp, ema, opt, sched, _ddp_batch(rank, multicrop), 2)
        grads = {n: g.tolist() for n, g in _grads(model).items()}
        bank = getattr(model.objective, "bank", None)
        state = {} if bank is None else {k: v.tolist() for k, v in bank.state_dict().items()}
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(
            {"loss": metrics["loss"], "grads": grads, "bank": state}))


@pytest.mark.slow  # two spawned ranks (~20 s on 2 cores)
@pytest.mark.parametrize(("name", "multicrop"), [("supcon", True), ("clip", False)])
def test_ddp_accumulated_step_equals_one_process_on_the_whole_batch(
        tmp_path: Path, name: str, multicrop: bool) -> None:
    """2 gloo ranks, ``accumulate=2``, each half the batch = one process on the whole batch
    unchunked (supcon with its bank, on a multi-crop batch of two sizes; CLIP's head)."""
    spawn_bounded(_ddp_worker, (2, rendezvous_file(tmp_path), str(tmp_path), name, multicrop),
                  2, WAIT_S)
    model, ema = _setup(name)
    model.encoder.eval()
    want = _step(model, ema, *_optim(model), _whole_batch(multicrop), 1)
    want_g = _grads(model)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-12)
        _close({n: torch.tensor(g, dtype=torch.float64) for n, g in got["grads"].items()},
               want_g, rtol=1e-10, atol=1e-12)
        bank = getattr(model.objective, "bank", None)
        if bank is not None:
            for key, value in bank.state_dict().items():
                torch.testing.assert_close(torch.tensor(got["bank"][key], dtype=value.dtype),
                                           value, rtol=1e-12, atol=1e-14)


@pytest.mark.slow  # Inductor compiles the no-grad forward, the forward and the backward
def test_a_compiled_encoder_accumulates_like_the_eager_one() -> None:
    """``train.compile`` with ``accumulate``: pass 1 (no grad) and pass 2 (a graph) are two
    compiled graphs of one encoder; the steps equal the eager ones."""
    from components.training.step import compile_encoder

    losses, weights = [], []
    for compiled in (False, True):
        model, ema = _setup("supcon", torch.float32)
        if compiled:
            compile_encoder(model)
        opt, sched = _optim(model)
        torch.manual_seed(0)
        for step in range(2):
            losses.append(_step(model, ema, opt, sched, _batch(step, torch.float32), 2,
                                step)["loss"])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert losses[2:] == pytest.approx(losses[:2], rel=1e-4)
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-4, atol=1e-5)
