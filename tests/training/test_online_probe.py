"""The online linear probe (issue 43 item 4, :mod:`components.training.online_probe`): a
linear classifier trained at every step on the detached backbone features, with its own AdamW.

* float64: two steps equal a hand-written AdamW update of ``W, b`` with the closed-form
  gradient of the mean cross-entropy (``(softmax - onehot)ᵀ x / n``) over every view's rows;
  unlabelled (-1) rows are left out; the top-1 count is the argmax's;
* the encoder's training does not see it: the weights, gradients, optimizer state and bank
  after three steps are identical with the probe on and off (CPU, float32, BatchNorm in
  train mode); with ``train.accumulate`` the probe gets the batch's features in order;
* DDP (2 gloo ranks, ``slow``): each rank's half of the rows gives the probe one process gets
  on the whole batch (also with unequal labelled rows per rank), equal on both ranks;
* the config: bad values refused naming them, an old stored config (no ``probe``) loads with
  it off, and a resume may change it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from components.config import (
    LOSS_CONFIGS,
    ConfigError,
    ModelConfig,
    PretrainConfig,
    ProbeConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from components.data.reader import Batch
from components.runs.resume import config_diff, resume_changes
from components.training.online_probe import OnlineProbe
from components.training.optim import build_optimizer, build_scheduler
from components.training.step import build_model, train_step
from tests.support.datasets import synthetic_dataset, tiny_run_config
from tests.support.gloo import gloo_group, rendezvous_file, spawn_bounded

F64 = torch.float64
LR, WD, BETAS, EPS = 0.05, 0.1, (0.9, 0.999), 1e-8


# ------------------------------------------------------------------- closed form, float64


def _adamw_reference(w: torch.Tensor, b: torch.Tensor, steps: list[tuple[torch.Tensor,
                                                                             torch.Tensor]]
                     ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """AdamW by hand on ``logits = x Wᵀ + b`` with the mean CE over labelled rows."""
    params = [w.clone(), b.clone()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses = []
    for t, (x, y) in enumerate(steps, start=1):
        keep = y >= 0
        x, y = x[keep], y[keep]
        n = x.shape[0]
        logits = x @ params[0].T + params[1]  # [n, C]
        p = logits.softmax(dim=1)
        losses.append(float(-(p[torch.arange(n), y]).log().mean()))
        d = p - torch.nn.functional.one_hot(y, p.shape[1]).to(F64)  # [n, C]
        grads = [d.T @ x / n, d.sum(0) / n]  # [C, F], [C]
        for i, g in enumerate(grads):
            params[i] = params[i] * (1 - LR * WD)  # decoupled decay, before the Adam move
            m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * g
            v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * g * g
            m_hat, v_hat = m[i] / (1 - BETAS[0] ** t), v[i] / (1 - BETAS[1] ** t)
            params[i] = params[i] - LR * m_hat / (v_hat.sqrt() + EPS)
    return params[0], params[1], losses


def _probe(f: int = 5, c: int = 3) -> OnlineProbe:
    probe = OnlineProbe(f, c, lr=LR, weight_decay=WD, dtype=F64)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a non-zero start, so the decay and the bias both matter
        probe.linear.weight.copy_(torch.randn(c, f, generator=g, dtype=F64))
        probe.linear.bias.copy_(torch.randn(c, generator=g, dtype=F64))
    return probe


def test_two_probe_steps_equal_a_hand_written_adamw_update_of_the_cross_entropy() -> None:
    probe = _probe()
    w0, b0 = probe.linear.weight.detach().clone(), probe.linear.bias.detach().clone()
    g = torch.Generator().manual_seed(0)
    views, batches, rows = 2, [], []
    for labels in (torch.tensor([0, 2, 1, 2]), torch.tensor([1, -1, 0, 0])):  # -1: unlabelled
        x = torch.randn(4 * views, 5, generator=g, dtype=F64)  # [B·V, F], row b·V + v
        batches.append((x, labels))
        rows.append((x, labels.repeat_interleave(views)))
    losses = [float(probe.step(x, y, views)) for x, y in batches]
    w, b, want = _adamw_reference(w0, b0, rows)
    torch.testing.assert_close(probe.linear.weight.detach(), w, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(probe.linear.bias.detach(), b, rtol=1e-12, atol=1e-14)
    assert losses == pytest.approx(want, rel=1e-12)
    assert not probe.linear.weight.requires_grad or probe.linear.weight.grad is None


def test_a_fresh_probe_starts_at_zero_and_counts_argmax_hits_of_labelled_rows() -> None:
    state = torch.get_rng_state()
    probe = OnlineProbe(4, 3, lr=LR, weight_decay=0.0)
    assert torch.equal(torch.get_rng_state(), state)  # no random draw: the encoder's RNG
    assert not probe.linear.weight.any() and not probe.linear.bias.any()
    with torch.no_grad():
        probe.linear.weight.copy_(torch.eye(3, 4))
    x = torch.tensor([[5.0, 0, 0, 0], [0, 5, 0, 0], [0, 0, 5, 0], [5, 0, 0, 0], [0, 5, 0, 0]])
    assert probe.correct(x, torch.tensor([0, 1, 0, 1, -1])) == (2, 4)
    assert probe.correct(x[:0], torch.tensor([], dtype=torch.long)) == (0, 0)


# --------------------------------------------------------- the encoder's training unchanged

MODEL = ModelConfig(backbone="convnet", width=4, blocks=2, projector_hidden=16, projector_dim=8)
C, B, V = 3, 8, 2


def _batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(images=torch.randn(B, V, 3, 12, 12, generator=g),
                 labels=torch.arange(B) % C, sample_ids=torch.arange(B) + 10 * seed,
                 captions=None)


def _train(probe: OnlineProbe | None, steps: int = 3, accumulate: int = 1,
           eval_mode: bool = False) -> tuple[Any, Any, dict[str, Any]]:
    cfg: Any = from_dict(LOSS_CONFIGS["supcon"], {"bank_size": 20})
    torch.manual_seed(0)
    model, ema = build_model(MODEL, cfg, C, None, 0)
    if eval_mode:
        model.encoder.eval()
    opt = build_optimizer(model, "sgd", 0.05, 0.9, 1e-4)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
    out: dict[str, Any] = {}
    for step in range(steps):
        torch.manual_seed(step)
        out = train_step(model, ema, opt, sched, None, _batch(step),
                         train_cfg=TrainConfig(accumulate=accumulate), device=torch.device("cpu"),
                         step=step, total_steps=10, ema_momentum=0.99, where=f"step {step}",
                         probe=probe)
    return model, opt, out


def test_the_encoder_trains_bit_for_bit_the_same_with_the_probe_on_and_off() -> None:
    off, off_opt, off_out = _train(None)
    probe = OnlineProbe(MODEL.width * 2, C, lr=1e-2, weight_decay=0.0)
    on, on_opt, on_out = _train(probe)
    for (name, a), b in zip(off.named_parameters(), on.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert torch.equal(a.grad, b.grad), name  # the last step's gradients too
    for (name, a), b in zip(off.named_buffers(), on.buffers(), strict=True):
        assert torch.equal(a, b), name  # BatchNorm statistics, the memory bank
    assert repr(off_opt.state_dict()) == repr(on_opt.state_dict())
    assert "probe_loss" not in off_out and off_out["loss"] == on_out["loss"]
    loss = on_out["probe_loss"]
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and torch.isfinite(loss)
    assert probe.linear.weight.abs().sum() > 0  # it trained


def test_with_accumulate_the_probe_gets_the_batch_features_in_order() -> None:
    """Chunks embedded without a graph (pass 1) give the probe the rows of the unchunked
    forward (eval-mode BatchNorm: nothing depends on the chunking)."""
    probes = [OnlineProbe(MODEL.width * 2, C, lr=1e-2, weight_decay=0.0) for _ in range(2)]
    for probe, k in zip(probes, (1, 2), strict=True):
        _train(probe, steps=2, accumulate=k, eval_mode=True)
    torch.testing.assert_close(probes[1].linear.weight, probes[0].linear.weight,
                               rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ the config


@pytest.mark.parametrize(("over", "error"), [
    ({"every_epochs": -1}, r"probe\.every_epochs=-1"),
    ({"lr": 0.0}, r"probe\.lr=0"),
    ({"weight_decay": -0.1}, r"probe\.weight_decay=-0\.1"),
    ({"split": ""}, r"probe\.split='' is not allowed: name a split"),
])
def test_bad_probe_settings_are_refused_naming_them(over: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        from_dict(ProbeConfig, over)


def test_an_old_stored_config_loads_with_the_probe_off_and_a_resume_may_change_it(
        tmp_path: Path) -> None:
    old = tiny_run_config(tmp_path / "ds", tmp_path)
    assert "probe" not in old
    cfg = from_dict(PretrainConfig, old)
    assert cfg.probe == ProbeConfig() and cfg.probe.every_epochs == 0
    assert cfg.probe.split_of(cfg.knn) == "val"
    new = from_dict(PretrainConfig, {**old, "probe": {"every_epochs": 2, "lr": 0.01,
                                                      "split": "test"}})
    assert new.probe.split_of(new.knn) == "test"
    assert config_diff(old, to_dict(new)) == []  # the same run
    assert resume_changes(old, new) == []  # moves no learning rate


def test_the_driver_refuses_the_probe_without_labels_or_its_split(tmp_path: Path) -> None:
    from components.runs.dataset_checks import check_dataset
    from components.runs.errors import RunError

    data = synthetic_dataset(tmp_path / "ds", train_per_class=8, val_per_class=2)

    def cfg(**over: Any) -> PretrainConfig:
        return from_dict(PretrainConfig, tiny_run_config(
            data, tmp_path / "runs", loss={"name": "simclr"}, **over))

    assert check_dataset(cfg(probe__every_epochs=1)).knn
    with pytest.raises(RunError, match=r"probe\.every_epochs=1: the online linear probe is "
                       r"scored on split 'test' \(probe\.split\), .*splits with samples: "
                       r"train, val\); set probe\.split"):
        check_dataset(cfg(probe__every_epochs=1, probe__split="test"))
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "classes": []}))
    check_dataset(cfg())  # the probe off (the default): an unlabelled dataset trains
    with pytest.raises(RunError, match=r"^probe\.every_epochs=2: the online linear probe needs "
                       r"labels but .* has none .*; set probe\.every_epochs=0$"):
        check_dataset(cfg(probe__every_epochs=2))


# --------------------------------------------------------------------------- DDP, 2 gloo ranks

WAIT_S = 240.0


def _ddp_rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6 * 2, 5, generator=g, dtype=F64)  # 6 images x 2 views
    y = torch.tensor([0, 1, 2, -1, 2, 1]) if seed else torch.tensor([2, 0, 1, 1, 0, 2])
    return x, y


def _ddp_worker(rank: int, world: int, port: str, out: str) -> None:
    with gloo_group(rank, world, port, timeout_s=60):
        probe = _probe()
        losses = []
        for seed in (0, 1):  # rank r: images 3r..3r+2 (their 2 views: rows 6r..6r+5)
            x, y = _ddp_rows(seed)
            losses.append(float(probe.step(x[6 * rank:6 * rank + 6], y[3 * rank:3 * rank + 3],
                                           2)))
        x, y = _ddp_rows(0)
        hits = probe.correct(x[::2][3 * rank:3 * rank + 3], y[3 * rank:3 * rank + 3])
        (Path(out) / f"rank{rank}.json").write_text(json.dumps({
            "w": probe.linear.weight.tolist(), "b": probe.linear.bias.tolist(),
            "losses": losses, "hits": hits}))


@pytest.mark.slow  # two spawned ranks
def test_ddp_probe_steps_equal_one_process_on_the_whole_batch(tmp_path: Path) -> None:
    spawn_bounded(_ddp_worker, (2, rendezvous_file(tmp_path), str(tmp_path)), 2, WAIT_S)
    probe = _probe()
    losses = [float(probe.step(*_ddp_rows(seed), 2)) for seed in (0, 1)]
    x, y = _ddp_rows(0)
    hits = probe.correct(x[::2], y)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in got:
        torch.testing.assert_close(torch.tensor(r["w"], dtype=F64), probe.linear.weight.detach(),
                                   rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(torch.tensor(r["b"], dtype=F64), probe.linear.bias.detach(),
                                   rtol=1e-12, atol=1e-14)
        assert r["losses"] == pytest.approx(losses, rel=1e-12)
        assert tuple(r["hits"]) == hits
    assert got[0]["w"] == got[1]["w"]  # every rank keeps the same probe, exactly


def test_a_probe_copied_with_its_state_continues_identically() -> None:
    """What a checkpoint carries (weights + AdamW state) continues the same steps."""
    a = _probe()
    x, y = _ddp_rows(0)
    a.step(x, y, 2)
    b = OnlineProbe(5, 3, lr=1.0, weight_decay=0.0, dtype=F64)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    b.set_hyperparameters(LR, WD)  # this run's settings over the restored ones
    x, y = _ddp_rows(1)
    assert float(a.step(x, y, 2)) == float(b.step(x, y, 2))
    assert torch.equal(a.linear.weight, b.linear.weight)
