"""The pretraining step without Ray: every loss trains through one code path, non-finite
losses stop with a location, checkpoints round-trip and reject interrupted writes."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import LOSS_CONFIGS, ModelConfig, TrainConfig, from_dict
from components.data.reader import Batch
from components.evaluation.knn import knn_top1, sharded_knn_top1
from components.runs.checkpoint import (
    CheckpointError,
    TrainingState,
    is_complete,
    load_state,
    save_state,
)
from components.training.optim import build_optimizer, build_scheduler
from components.training.step import (
    NonFiniteLossError,
    SkipGuard,
    SkippedStep,
    build_model,
    compile_encoder,
    extract_features,
    resolve_amp,
    seed_everything,
    train_step,
)

C, E = 3, 6
MODEL = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16, projector_dim=8)
LOSSES: dict[str, dict[str, Any]] = {
    "simclr": {},
    "supcon": {"bank_size": 20},
    "xclr": {"graph": "class"},
    "xclr_caption": {"name": "xclr", "graph": "caption", "bank_size": 20},
    "sincere": {},
    "eps_supinfonce": {"epsilon": 0.2},
    "cone": {"bank_size": 24, "top_n": 4},
    "ce": {},
    "clip": {"caption_dim": E},
}


def _batch(b: int = 6, v: int = 2, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    caps = torch.nn.functional.normalize(torch.randn(b, E, generator=g), dim=1)
    return Batch(images=torch.randn(b, v, 3, 12, 12, generator=g),
                 labels=torch.arange(b) % C, sample_ids=torch.arange(b) + 10 * seed,
                 captions=caps)


def _setup(name: str) -> tuple:
    spec = dict(LOSSES[name])
    loss_cfg = from_dict(LOSS_CONFIGS[spec.pop("name", name)], spec)
    sim = torch.eye(C) * 0.5 + 0.5
    model, ema = build_model(MODEL, loss_cfg, C, sim, E)
    opt = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
    return model, ema, opt, sched


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_trains_through_one_step_function(name: str) -> None:
    model, ema, opt, sched = _setup(name)
    needs = model.objective.requires
    assert (ema is not None) == bool({"ema_z", "ema_logits"} & needs)
    assert (model.encoder.classifier is not None) == ("logits" in needs)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # The loss a step reports is the objective of the model *before* that step: a forward of
    # an untouched copy (its BN statistics and bank change, not the original's) gives it.
    twin = copy.deepcopy(model)
    torch.manual_seed(0)
    b0 = _batch(seed=0)
    want0 = float(twin(b0.images, b0.labels, b0.sample_ids, b0.captions,
                       copy.deepcopy(ema))[0].detach())

    def three_steps(model: torch.nn.Module, ema: Any, opt: Any, sched: Any) -> list[float]:
        torch.manual_seed(0)  # CoNe's and others' random choices, the same in both runs
        losses = []
        for step in range(3):
            m = train_step(model, ema, opt, sched, None, _batch(seed=step % 2),
                           train_cfg=TrainConfig(), device=torch.device("cpu"), step=step,
                           total_steps=10, ema_momentum=0.99, where=f"step {step}")
            assert math.isfinite(m["loss"]) and m["lr"] > 0
            losses.append(m["loss"])
        return losses

    losses = three_steps(model, ema, opt, sched)
    assert losses[0] == pytest.approx(want0, rel=1e-5, abs=1e-6)
    assert three_steps(*_setup(name)) == losses  # the same seed, data and steps: bit-identical
    assert losses[1] != losses[0]  # the weights moved (and the next batch differs)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("backbone" in k for k in changed)
    if getattr(model.objective, "bank", None) is not None:
        assert int(model.objective.bank.filled) > 0


def test_non_finite_loss_stops_with_its_location() -> None:
    model, ema, opt, sched = _setup("simclr")
    bad = _batch()
    bad.images[0, 0, 0, 0, 0] = float("nan")
    w = model.encoder.projector[-1].weight.clone()
    with pytest.raises(NonFiniteLossError, match="epoch 3 step 7"):
        train_step(model, ema, opt, sched, None, bad, train_cfg=TrainConfig(),
                   device=torch.device("cpu"), step=0, total_steps=10, ema_momentum=0.99,
                   where="epoch 3 step 7")
    assert torch.equal(model.encoder.projector[-1].weight, w)  # the step never happened


def test_fp16_overflow_skips_the_step_like_the_scaler() -> None:
    """With a gradient scaler (amp='fp16') a non-finite loss skips the step instead of
    stopping the run; the guard stops it when skips persist."""
    model, ema, opt, sched = _setup("simclr")
    bad = _batch()
    bad.images[0, 0, 0, 0, 0] = float("inf")
    w = model.encoder.projector[-1].weight.clone()
    epoch_before = sched.last_epoch
    with pytest.raises(SkippedStep, match=r"epoch 1 step 2: z has \d+ non-finite"):
        train_step(model, ema, opt, sched, torch.amp.GradScaler("cpu"), bad,
                   train_cfg=TrainConfig(), device=torch.device("cpu"), step=0,
                   total_steps=10, ema_momentum=0.99, where="epoch 1 step 2")
    assert torch.equal(model.encoder.projector[-1].weight, w)  # no update
    assert sched.last_epoch == epoch_before + 1  # the schedule moves on, as with the scaler
    assert all(p.grad is None for p in model.parameters())

    guard = SkipGuard(limit=3)
    for _ in range(2):
        guard.skipped(SkippedStep("x"), "here")
    guard.ok()  # a good step resets the run of skips
    for _ in range(2):
        guard.skipped(SkippedStep("x"), "here")
    with pytest.raises(NonFiniteLossError, match=r"here: 3 steps in a row had a non-finite "
                                                 r"loss under amp='fp16' \(last: boom\)"):
        guard.skipped(SkippedStep("boom"), "here")
    assert guard.total == 5


def test_bf16_autocast_step_on_cpu() -> None:
    model, ema, opt, sched = _setup("supcon")
    m = train_step(model, ema, opt, sched, None, _batch(), train_cfg=TrainConfig(amp="bf16"),
                   device=torch.device("cpu"), step=0, total_steps=10, ema_momentum=0.99,
                   where="x")
    assert math.isfinite(m["loss"])


@pytest.mark.parametrize("avx512_bf16, amx, want", [(True, False, "bf16"), (False, True, "bf16"),
                                                     (False, False, "none")])
def test_amp_auto_is_bf16_only_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch,
                                                    avx512_bf16: bool, amx: bool,
                                                    want: str) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    assert resolve_amp("auto", cpu) == want
    for given in ("none", "bf16", "fp16"):  # an explicit choice is kept as given
        assert resolve_amp(given, cpu) == given


@pytest.mark.parametrize("native", [True, False])
def test_a_step_under_amp_auto_is_the_step_under_what_it_resolves_to(
        monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    weights = []
    for amp in ("auto", "bf16" if native else "none"):
        torch.manual_seed(0)
        model, ema, opt, sched = _setup("supcon")
        train_step(model, ema, opt, sched, None, _batch(), train_cfg=TrainConfig(amp=amp),
                   device=torch.device("cpu"), step=0, total_steps=10, ema_momentum=0.99,
                   where="x")
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


@pytest.mark.slow  # Inductor compiles the forward and backward (~30 s on 2 cores)
def test_a_compiled_encoder_trains_like_the_eager_one_and_saves_the_same_keys() -> None:
    losses, weights, keys = [], [], []
    for compiled in (False, True):
        torch.manual_seed(0)
        model, ema, opt, sched = _setup("supcon")
        if compiled:
            compile_encoder(model)
        for step in range(2):
            m = train_step(model, ema, opt, sched, None, _batch(seed=step), train_cfg=TrainConfig(),
                           device=torch.device("cpu"), step=step, total_steps=10,
                           ema_momentum=0.99, where="x")
            losses.append(m["loss"])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        keys.append(list(model.state_dict()))
    assert keys[0] == keys[1]  # checkpoints of compiled runs load into eager models
    assert losses[2:] == pytest.approx(losses[:2], rel=1e-4)
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-4, atol=1e-5)


def test_seed_everything_is_a_function_of_seed_epoch_rank() -> None:
    seed_everything(1, 2, 0)
    a = torch.rand(3)
    seed_everything(1, 2, 0)
    assert torch.equal(a, torch.rand(3))
    seed_everything(1, 2, 1)
    assert not torch.equal(a, torch.rand(3))


def test_knn_monitor_single_process_equals_knn_top1() -> None:
    model, *_ = _setup("simclr")
    bank = extract_features(model.encoder, [_batch(seed=0), _batch(seed=1)], torch.device("cpu"))
    queries = extract_features(model.encoder, [_batch(seed=2)], torch.device("cpu"))
    assert bank[0].shape == (12, model.encoder.feat_dim)
    got = sharded_knn_top1(bank, queries, k=5, num_classes=C, temperature=0.07)
    want = knn_top1(bank[0], bank[1], queries[0], queries[1], k=5, num_classes=C)
    assert got == want


def test_training_state_is_typed_and_checked(tmp_path: Path) -> None:
    model, ema, opt, sched = _setup("cone")
    state = TrainingState(model=model.state_dict(), ema=ema.state_dict(),
                          optimizer=opt.state_dict(), scheduler=sched.state_dict(), epoch=2,
                          step=8, history=[{"epoch": 1}, {"epoch": 2}], config={"name": "r"},
                          seed=3, dataset={"params_digest": "p"})
    back = TrainingState.load(state.save(tmp_path / "c"))
    assert (back.epoch, back.step, back.seed, back.history, back.config, back.dataset,
            back.scaler) == (2, 8, 3, state.history, {"name": "r"}, {"params_digest": "p"},
                             None)
    assert all(torch.equal(back.model[k], v) for k, v in state.model.items())
    assert back.ema is not None and back.ema.keys() == state.ema.keys()  # type: ignore[union-attr]
    # A key a later version adds is ignored; a checkpoint from before `dataset` still loads.
    raw = {**state.to_dict(), "future_key": 1}
    del raw["dataset"]
    assert TrainingState.from_dict(raw).dataset is None
    # Not a training checkpoint: named, not a KeyError deep in the recipe.
    save_state(tmp_path / "d", {"model": {}, "epoch": 1})
    with pytest.raises(CheckpointError, match=r"checkpoint .*/d lacks optimizer, scheduler, "
                                              r"step, history, config: it is not a simgraph "
                                              r"training checkpoint"):
        TrainingState.load(tmp_path / "d")
    with pytest.raises(CheckpointError, match=r"holds model, epoch of the wrong type"):
        TrainingState.from_dict({**state.to_dict(), "model": [1], "epoch": "2"})


def test_checkpoint_round_trip_and_interrupted_writes(tmp_path: Path) -> None:
    model, ema, opt, sched = _setup("cone")
    train_step(model, ema, opt, sched, None, _batch(), train_cfg=TrainConfig(),
               device=torch.device("cpu"), step=0, total_steps=10, ema_momentum=0.99, where="x")
    state = {"model": model.state_dict(), "ema": ema.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "epoch": 1, "step": 1,
             "history": [{"epoch": 1, "loss": 1.5}], "config": {"a": [1, 2]}}
    save_state(tmp_path / "c", state)
    assert is_complete(tmp_path / "c")
    back = load_state(tmp_path / "c")  # weights_only=True
    for k, v in state["model"].items():
        assert torch.equal(back["model"][k], v)
    assert back["history"] == state["history"] and back["step"] == 1
    opt2 = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    opt2.load_state_dict(back["optimizer"])

    (tmp_path / "c" / "state.pt").write_bytes((tmp_path / "c" / "state.pt").read_bytes()[:-5])
    assert not is_complete(tmp_path / "c")
    with pytest.raises(CheckpointError, match="does not match"):
        load_state(tmp_path / "c")
    (tmp_path / "c" / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="interrupted"):
        load_state(tmp_path / "c")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_training_model_starts_from_the_one_encoder_builder(name: str) -> None:
    """What the random-init baseline and every reader of a run rely on: under one seed, the
    training model's backbone and projector are ``build_encoder``'s (the recipe's first draws;
    the objective's weights — CLIP's head — and the classifier come after), and a checkpoint's
    state dict read back by ``encoder_from_state`` is that encoder."""
    from components.models.encoders import build_encoder, encoder_from_state

    torch.manual_seed(3)
    model, _, _, _ = _setup(name)
    torch.manual_seed(3)
    first = build_encoder(MODEL).state_dict()
    trained = model.encoder.state_dict()
    assert {k for k in trained if not k.startswith("classifier.")} == set(first)
    assert all(torch.equal(first[k], trained[k]) for k in first)
    assert (model.encoder.classifier is not None) == ("logits" in model.objective.requires)
    with torch.no_grad():
        for p in model.parameters():  # a trained checkpoint: every weight moved
            p.add_(torch.randn_like(p))
    read = encoder_from_state(MODEL, model.state_dict())
    assert not read.training and read.classifier is None
    x = torch.randn(4, 3, 12, 12)
    model.encoder.eval()
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(read(x)[:2], model.encoder(x)[:2],
                                                      strict=True))
