"""Optimisers and schedules: parameter groups, LARS against a float64 reference, LR scaling,
warm-up + cosine closed forms, the scheduler and the optimiser builder."""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from components.training.optim import (
    LARS,
    build_optimizer,
    build_scheduler,
    param_groups,
    scaled_lr,
    warmup_constant,
    warmup_cosine,
    warmup_step,
)


def _small_net() -> nn.Sequential:
    # Conv [4, 3, 3, 3] + bias [4]; BatchNorm weight/bias [4]; Linear [2, 4] + bias [2].
    return nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), nn.BatchNorm2d(4), nn.Linear(4, 2))


# --------------------------------------------------------------------------- param_groups


def test_param_groups_split_conv_bn_linear() -> None:
    net = _small_net()
    conv, bn, lin = net[0], net[1], net[2]
    groups = param_groups(net, weight_decay=5e-4)
    assert len(groups) == 2
    decay, excluded = groups
    assert decay["weight_decay"] == 5e-4 and decay["lars_exclude"] is False
    assert excluded["weight_decay"] == 0.0 and excluded["lars_exclude"] is True
    assert [id(p) for p in decay["params"]] == [id(conv.weight), id(lin.weight)]
    assert {id(p) for p in excluded["params"]} == {
        id(conv.bias), id(bn.weight), id(bn.bias), id(lin.bias)
    }
    # Every parameter exactly once over both groups.
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in net.parameters())
    assert len(seen) == len(set(seen)) == 6


def test_param_groups_skip_frozen_and_dedupe_shared() -> None:
    lin = nn.Linear(3, 3)
    net = nn.Sequential(lin, nn.LayerNorm(3), lin)  # `lin` shared: its params appear once
    net[1].weight.requires_grad_(False)
    decay, excluded = param_groups(net, weight_decay=0.1)
    assert [id(p) for p in decay["params"]] == [id(lin.weight)]
    assert {id(p) for p in excluded["params"]} == {id(lin.bias), id(net[1].bias)}


def test_param_groups_of_a_vit_skip_its_no_weight_decay_names() -> None:
    """A timm ViT inside the training model: besides biases and norms, the position embedding
    and class token it lists in ``no_weight_decay()`` get neither decay nor LARS adaptation
    (names prefixed with the submodule's); ``skip`` overrides the module's own list."""
    from components.config import ModelConfig
    from components.models.encoders import build_encoder
    from components.training.optim import no_weight_decay_names

    encoder = build_encoder(ModelConfig(backbone="timm/vit_tiny_patch16_224",
                                        projector_hidden=16, projector_dim=8), 32)
    vit = encoder.backbone
    assert no_weight_decay_names(encoder) == {"backbone.pos_embed", "backbone.cls_token"}
    decay, excluded = param_groups(encoder, weight_decay=0.05)
    ids = {id(p) for p in excluded["params"]}
    assert id(vit.pos_embed) in ids and id(vit.cls_token) in ids  # ndim 3: by name
    assert excluded["weight_decay"] == 0.0 and excluded["lars_exclude"] is True
    assert all(p.ndim >= 2 for p in decay["params"])
    assert not {id(vit.pos_embed), id(vit.cls_token)} & {id(p) for p in decay["params"]}
    assert all(p.ndim <= 1 for p in excluded["params"]
               if id(p) not in {id(vit.pos_embed), id(vit.cls_token)})
    seen = [id(p) for g in (decay, excluded) for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in encoder.parameters())
    decay, excluded = param_groups(encoder, weight_decay=0.05, skip=())  # shape rule only
    assert id(vit.pos_embed) in {id(p) for p in decay["params"]}


def test_param_groups_errors() -> None:
    with pytest.raises(ValueError, match="weight_decay=-0.1"):
        param_groups(_small_net(), weight_decay=-0.1)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(frozen, weight_decay=0.0)


# --------------------------------------------------------------------------- LARS


def _lars_reference(
    p0: np.ndarray,
    grads: list[np.ndarray],
    lr: float,
    momentum: float,
    wd: float,
    eta: float,
    eps: float,
    nesterov: bool,
) -> list[np.ndarray]:
    """The documented LARS formula, in float64 numpy; the parameter after each step."""
    p = p0.astype(np.float64).copy()
    buf = np.zeros_like(p)
    out = []
    for g in grads:
        g = g.astype(np.float64) + wd * p
        pn, gn = float(np.sqrt((p**2).sum())), float(np.sqrt((g**2).sum()))
        trust = eta * pn / (gn + eps) if pn > 0 and gn > 0 else 1.0
        buf = momentum * buf + trust * g
        d = trust * g + momentum * buf if nesterov else buf
        p = p - lr * d
        out.append(p.copy())
    return out


def _run_lars(p0: torch.Tensor, grads: list[torch.Tensor], **kw: float | bool) -> list[np.ndarray]:
    p = nn.Parameter(p0.clone())
    opt = LARS([p], **kw)  # type: ignore[arg-type]
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


def test_lars_hand_computed_two_steps() -> None:
    """p = [3, 4] (norm 5), g = [0.6, 0.8] (norm 1), eta = 0.1, lr = 0.1, momentum = 0.9.

    Step 1: trust = 0.1 * 5 / 1 = 0.5, buf = [0.3, 0.4], p = [2.97, 3.96].
    Step 2: trust = 0.1 * 4.95 / 1 = 0.495, buf = 0.9 * [0.3, 0.4] + 0.495 * [0.6, 0.8]
            = [0.567, 0.756], p = [2.9133, 3.8844].
    """
    p0 = torch.tensor([3.0, 4.0], dtype=torch.float64)
    g = torch.tensor([0.6, 0.8], dtype=torch.float64)
    got = _run_lars(p0, [g, g], lr=0.1, momentum=0.9, trust_coefficient=0.1)
    np.testing.assert_allclose(got[0], [2.97, 3.96], rtol=1e-7)  # eps = 1e-8 in ||g|| + eps
    np.testing.assert_allclose(got[1], [2.9133, 3.8844], rtol=1e-7)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_lars_matches_float64_reference(wd: float, nesterov: bool) -> None:
    p0 = torch.randn(3, 4, dtype=torch.float64)
    grads = [torch.randn(3, 4, dtype=torch.float64) for _ in range(2)]
    kw = {"lr": 0.3, "momentum": 0.9, "weight_decay": wd, "trust_coefficient": 0.02,
          "eps": 1e-8, "nesterov": nesterov}
    got = _run_lars(p0, grads, **kw)
    want = _lars_reference(p0.numpy(), [g.numpy() for g in grads], lr=0.3, momentum=0.9, wd=wd,
                           eta=0.02, eps=1e-8, nesterov=nesterov)
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=f"step {step + 1}")
    # The trust ratio matters: plain SGD would land elsewhere.
    assert not np.allclose(got[0], p0.numpy() - 0.3 * (grads[0].numpy() + wd * p0.numpy()))


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_excluded_group_is_torch_sgd(nesterov: bool) -> None:
    """lars_exclude=True: bit-for-bit torch.optim.SGD(momentum, weight_decay, dampening=0)."""
    p_lars = nn.Parameter(torch.randn(5, 3))
    p_sgd = nn.Parameter(p_lars.detach().clone())
    lars = LARS([{"params": [p_lars], "lars_exclude": True, "weight_decay": 0.01}],
                lr=0.2, momentum=0.9, trust_coefficient=0.001, nesterov=nesterov)
    sgd = torch.optim.SGD([p_sgd], lr=0.2, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    for _ in range(4):
        g = torch.randn(5, 3)
        p_lars.grad, p_sgd.grad = g.clone(), g.clone()
        lars.step()
        sgd.step()
        assert torch.equal(p_lars, p_sgd)
    assert torch.equal(lars.state[p_lars]["momentum_buffer"], sgd.state[p_sgd]["momentum_buffer"])


def test_lars_zero_norm_param_gets_trust_one() -> None:
    # ||p|| = 0: trust = 1, so the step is plain momentum SGD: p = -lr * g, buf = g.
    p0 = torch.zeros(4, dtype=torch.float64)
    g = torch.tensor([1.0, -2.0, 0.5, 0.0], dtype=torch.float64)
    got = _run_lars(p0, [g], lr=0.1, momentum=0.9, trust_coefficient=0.001)
    np.testing.assert_array_equal(got[0], [-0.1, 0.2, -0.05, 0.0])
    # ||g|| = 0 (and no decay): trust = 1, and the parameter does not move.
    p1 = torch.tensor([1.0, 2.0], dtype=torch.float64)
    got = _run_lars(p1, [torch.zeros(2, dtype=torch.float64)], lr=0.1, trust_coefficient=0.001)
    np.testing.assert_array_equal(got[0], [1.0, 2.0])


def _loss(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (net(x) ** 2).mean()


def test_lars_state_dict_round_trip() -> None:
    """A: 3 steps, save (through torch.save / weights_only load), B loads; 2 more steps each."""
    x = torch.randn(6, 3, 5, 5)
    net_a = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                          nn.Linear(4 * 9, 2))
    opt_a = LARS(param_groups(net_a, 1e-4), lr=0.5, momentum=0.9, trust_coefficient=0.01)
    for _ in range(3):
        opt_a.zero_grad()
        _loss(net_a, x).backward()
        opt_a.step()
    blob = io.BytesIO()
    torch.save(opt_a.state_dict(), blob)
    blob.seek(0)
    saved = torch.load(blob, weights_only=True)

    net_b = copy.deepcopy(net_a)
    opt_b = LARS(param_groups(net_b, 1e-4), lr=0.5, momentum=0.9, trust_coefficient=0.01)
    opt_b.load_state_dict(saved)
    assert opt_b.param_groups[1]["lars_exclude"] is True
    for _ in range(2):
        for net, opt in ((net_a, opt_a), (net_b, opt_b)):
            opt.zero_grad()
            _loss(net, x).backward()
            opt.step()
    for pa, pb in zip(net_a.parameters(), net_b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"lr": -1.0}, "lr=-1.0"),
        ({"momentum": 1.0}, r"momentum=1.0.*\[0.0, 1.0\)"),
        ({"momentum": -0.1}, "momentum=-0.1"),
        ({"weight_decay": -1e-4}, "weight_decay=-0.0001"),
        ({"trust_coefficient": 0.0}, "trust_coefficient=0.0"),
        ({"eps": 0.0}, "eps=0.0"),
        ({"nesterov": True, "momentum": 0.0}, "nesterov"),
    ],
)
def test_lars_rejects_bad_hyperparameters(kw: dict[str, float], match: str) -> None:
    args: dict[str, float | bool] = {"lr": 0.1}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        LARS([nn.Parameter(torch.ones(2))], **args)  # type: ignore[arg-type]


def test_lars_rejects_bad_group_value() -> None:
    with pytest.raises(ValueError, match="weight_decay=-1"):
        LARS([{"params": [nn.Parameter(torch.ones(2))], "weight_decay": -1}], lr=0.1)


# --------------------------------------------------------------------------- scaled_lr


def test_scaled_lr_closed_forms() -> None:
    assert scaled_lr(0.3, 4096, "linear") == pytest.approx(4.8)  # SimCLR 0.3 × 4096/256
    assert scaled_lr(0.3, 128, "linear") == pytest.approx(0.15)
    assert scaled_lr(1.2, 1024, "sqrt") == pytest.approx(2.4)  # 1.2 × sqrt(4) = 0.075 × 32
    assert scaled_lr(0.075 * 16, 256, "sqrt") == pytest.approx(0.075 * math.sqrt(256))
    assert scaled_lr(0.5, 64, "sqrt", reference_batch=16) == pytest.approx(1.0)
    assert scaled_lr(0.1, 999, "none") == 0.1
    assert scaled_lr(0.2, 512, "linear", reference_batch=128) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.1, 256, "linear"), "base_lr=-0.1"),
        ((0.1, 0, "linear"), "global_batch=0"),
        ((0.1, 2.5, "linear"), "global_batch=2.5"),
        ((0.1, 256, "cubic"), "rule='cubic'.*linear, sqrt, none"),
    ],
)
def test_scaled_lr_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        scaled_lr(*args)
    with pytest.raises(ValueError, match="reference_batch=0"):
        scaled_lr(0.1, 256, "linear", reference_batch=0)


# --------------------------------------------------------------------------- warmup_cosine


def test_warmup_cosine_closed_forms() -> None:
    # T = 11, W = 2, f = 0.1: cosine over steps 2..10, progress = (step - 2) / 8.
    wc = lambda s: warmup_cosine(s, total_steps=11, warmup_steps=2, final_fraction=0.1)  # noqa: E731
    assert wc(0) == 0.5  # first step: 1 / W, not 0
    assert wc(1) == 1.0  # end of warm-up
    assert wc(2) == 1.0  # start of cosine
    assert wc(4) == pytest.approx(0.1 + 0.45 * (1 + math.sqrt(0.5)))  # progress 1/4
    assert wc(6) == pytest.approx(0.55)  # midpoint: f + (1 - f) / 2
    assert wc(10) == pytest.approx(0.1)  # last step reaches f
    assert wc(11) == 0.1 and wc(1000) == 0.1  # clamped past the end
    # No warm-up: step 0 is the peak; final_fraction 0 reaches 0 at T - 1.
    assert warmup_cosine(0, 5, 0) == 1.0
    assert warmup_cosine(2, 5, 0) == pytest.approx(0.5)
    assert warmup_cosine(4, 5, 0) == pytest.approx(0.0, abs=1e-15)
    # All warm-up (W = T): 1/4 .. 1, then clamp to f.
    assert [warmup_cosine(s, 4, 4, 0.2) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 0.2]
    # A single cosine step (D = 1) stays at the peak.
    assert warmup_cosine(2, 3, 2) == 1.0


def test_warmup_cosine_monotone_after_warmup() -> None:
    total, warm, f = 50, 7, 0.05
    values = [warmup_cosine(s, total, warm, f) for s in range(total + 5)]
    assert all(f <= v <= 1.0 for v in values)
    warm_part = values[:warm]
    assert all(a < b for a, b in zip(warm_part, warm_part[1:], strict=False))
    tail = values[warm - 1:]
    assert all(b <= a for a, b in zip(tail, tail[1:], strict=False))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0, 0), "total_steps=0"),
        ((0, 10, -1), "warmup_steps=-1"),
        ((0, 10, 11), r"warmup_steps=11.*total_steps=10"),
        ((0, 10, 2, 1.5), "final_fraction=1.5"),
        ((0, 10, 2, -0.1), "final_fraction=-0.1"),
        ((-1, 10, 2), "step=-1"),
    ],
)
def test_warmup_cosine_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        warmup_cosine(*args)


def test_build_scheduler_drives_sgd() -> None:
    base, total, warm, f = 0.4, 12, 3, 0.1
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=base, momentum=0.9)
    sched = build_scheduler(opt, total_steps=total, warmup_steps=warm, final_fraction=f)
    lrs = []
    for _ in range(total + 3):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    want = [base * warmup_cosine(s, total, warm, f) for s in range(total + 3)]
    np.testing.assert_allclose(lrs, want, rtol=1e-15)
    assert lrs[0] == pytest.approx(base / 3) and lrs[total - 1] == pytest.approx(base * f)


def test_build_scheduler_state_dict_and_pickle() -> None:
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
    for _ in range(4):
        opt.step()
        sched.step()
    blob = io.BytesIO()
    torch.save(sched.state_dict(), blob)  # plain values only: weights_only load works
    blob.seek(0)
    opt2 = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=1.0)
    sched2 = build_scheduler(opt2, total_steps=10, warmup_steps=2)
    sched2.load_state_dict(torch.load(blob, weights_only=True))
    sched.step()
    sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr() == [warmup_cosine(5, 10, 2)]
    pickle.loads(pickle.dumps(sched))  # a partial, not a lambda


def test_constant_schedule_warms_up_then_holds() -> None:
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.4)
    sched = build_scheduler(opt, total_steps=8, warmup_steps=3, final_fraction=0.1,
                            schedule="constant")
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(lrs, [0.4 / 3, 0.8 / 3] + [0.4] * 8, rtol=1e-15)
    assert [warmup_constant(s, 5, 0) for s in range(7)] == [1.0] * 7
    with pytest.raises(ValueError, match="warmup_steps=9"):
        warmup_constant(0, 5, 9)
    with pytest.raises(ValueError, match="schedule='linear'.*cosine, constant, step"):
        build_scheduler(opt, total_steps=8, warmup_steps=0, schedule="linear")  # type: ignore[arg-type]


def test_step_schedule_warms_up_then_decays_at_the_milestones() -> None:
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.4)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2, schedule="step",
                            milestones=(4, 7), gamma=0.5)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(lrs, [0.2, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1],
                               rtol=1e-15)
    # torch's MultiStepLR gives the same LRs after the warm-up
    opt2 = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.4)
    ref = torch.optim.lr_scheduler.MultiStepLR(opt2, milestones=[2, 5], gamma=0.5)
    want = []
    for _ in range(9):
        want.append(opt2.param_groups[0]["lr"])
        opt2.step()
        ref.step()
    np.testing.assert_allclose(lrs[2:], want, rtol=1e-15)
    assert warmup_step(3, 10, 0, (3,), 0.1) == pytest.approx(0.1)
    for bad in [(0,), (5, 5), (4, 2), (10,)]:
        with pytest.raises(ValueError, match="milestones"):
            build_scheduler(opt, total_steps=10, warmup_steps=0, schedule="step", milestones=bad)
    with pytest.raises(ValueError, match="gamma=0"):
        warmup_step(0, 10, 0, (3,), 0.0)


def test_build_scheduler_validates_early() -> None:
    opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_steps=20"):
        build_scheduler(opt, total_steps=10, warmup_steps=20)


# --------------------------------------------------------------------------- build_optimizer


@pytest.mark.parametrize("name", ["sgd", "lars", "adam", "adamw"])
def test_build_optimizer_each_name(name: str) -> None:
    net = _small_net()
    opt = build_optimizer(net, name, lr=0.1, momentum=0.8, weight_decay=1e-3,  # type: ignore[arg-type]
                          betas=(0.8, 0.95), trust_coefficient=0.02)
    kind = {"sgd": torch.optim.SGD, "lars": LARS, "adam": torch.optim.Adam,
            "adamw": torch.optim.AdamW}[name]
    assert type(opt) is kind
    decay, excluded = opt.param_groups
    assert decay["weight_decay"] == 1e-3 and excluded["weight_decay"] == 0.0
    assert len(decay["params"]) == 2 and len(excluded["params"]) == 4
    assert all(g["lr"] == 0.1 for g in opt.param_groups)
    if name.startswith("adam"):
        assert all(g["betas"] == (0.8, 0.95) for g in opt.param_groups)
    else:
        assert all(g["momentum"] == 0.8 for g in opt.param_groups)
    if name == "lars":
        assert all(g["trust_coefficient"] == 0.02 for g in opt.param_groups)
        assert [g["lars_exclude"] for g in opt.param_groups] == [False, True]
    # The extra `lars_exclude` key does not get in the way of a real step.
    before = [p.detach().clone() for p in net.parameters()]
    _loss(nn.Sequential(net, nn.Flatten()), torch.randn(2, 3, 3, 6)).backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_build_optimizer_errors() -> None:
    net = _small_net()
    with pytest.raises(ValueError, match="name='rmsprop'.*sgd, lars, adam, adamw"):
        build_optimizer(net, "rmsprop", lr=0.1, momentum=0.9, weight_decay=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lr=-0.1"):
        build_optimizer(net, "sgd", lr=-0.1, momentum=0.9, weight_decay=0.0)
    with pytest.raises(ValueError, match="momentum=1.5"):
        build_optimizer(net, "lars", lr=0.1, momentum=1.5, weight_decay=0.0)
    with pytest.raises(ValueError, match=r"betas=\(0.9, 1.0\)"):
        build_optimizer(net, "adamw", lr=0.1, momentum=0.9, weight_decay=0.0, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="weight_decay=-1"):
        build_optimizer(net, "adamw", lr=0.1, momentum=0.9, weight_decay=-1)


def test_build_for_run_scales_warms_up_and_schedules() -> None:
    from components.config import OptimConfig
    from components.training.optim import build_for_run

    net = _small_net()
    cfg = OptimConfig(name="lars", lr=0.3, lr_scaling="linear", reference_batch=256,
                      warmup_epochs=2.0, final_lr_fraction=0.1)
    opt, sched = build_for_run(net, cfg, global_batch=512, steps_per_epoch=3, epochs=4)
    assert type(opt) is LARS and opt.defaults["lr"] == pytest.approx(0.6)
    want = [0.6 * warmup_cosine(s, 12, 6, 0.1) for s in range(12)]
    got = []
    for _ in range(12):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # warm-up longer than the run is clamped to it; a constant schedule holds the peak
    cfg = OptimConfig(name="adam", lr=1e-3, lr_scaling="none", warmup_epochs=10.0,
                      schedule="constant")
    opt, sched = build_for_run(net, cfg, global_batch=64, steps_per_epoch=2, epochs=2)
    assert type(opt) is torch.optim.Adam
    assert [sched.lr_lambdas[0](s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    # step: milestones in epochs become optimiser steps; one at or past the end drops out
    cfg = OptimConfig(name="sgd", lr=0.1, lr_scaling="none", warmup_epochs=0.0,
                      schedule="step", step_epochs=[1.5, 3, 4], step_gamma=0.1)
    opt, sched = build_for_run(net, cfg, global_batch=64, steps_per_epoch=2, epochs=4)
    np.testing.assert_allclose([sched.lr_lambdas[0](s) for s in range(8)],
                               [1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01], rtol=1e-12)
