"""Optimisers and learning-rate schedules for contrastive pretraining.

* :func:`param_groups` splits a model's parameters into a decayed group and a group of biases
  and normalisation parameters that gets neither weight decay nor LARS adaptation (SimCLR,
  Chen et al. 2020, App. B.1; the usual LARS practice).
* :class:`LARS`: SGD with momentum and the layer-wise trust ratio of You et al. 2017
  ("Large Batch Training of Convolutional Networks"), in the form SimCLR trains with.
* :func:`scaled_lr`: the linear (Goyal et al. 2017) and square-root (SimCLR App. B.1) rules.
* :func:`warmup_cosine` / :func:`build_scheduler`: linear warm-up then cosine decay
  (Loshchilov & Hutter 2017, SGDR; SimCLR uses 10 warm-up epochs then cosine, no restarts),
  or linear warm-up then a constant LR (:func:`warmup_constant`), or linear warm-up then step
  decay at milestones (:func:`warmup_step`, the ``MultiStepLR`` rule of He et al. 2016).
* :func:`schedule_position` / :func:`continue_schedule`: a restored schedule continued on
  another cluster shape (or ``optim.lr``) at the LR a fresh run of that shape has after the
  same number of samples (elastic resume).

The scheduler is stepped once per optimiser step (not per epoch); ``step`` counts optimiser steps
from 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from components import checks

if TYPE_CHECKING:
    from components.config import OptimConfig

OptimizerName = Literal["sgd", "lars", "adam", "adamw"]
ScheduleName = Literal["cosine", "constant", "step"]
ScalingRule = Literal["linear", "sqrt", "none"]

OPTIMIZERS: tuple[str, ...] = ("sgd", "lars", "adam", "adamw")
SCHEDULES: tuple[str, ...] = ("cosine", "constant", "step")
SCALING_RULES: tuple[str, ...] = ("linear", "sqrt", "none")


def _is_int(x: object) -> bool:
    # bool is an int subclass, but `warmup_steps=True` is a mistake, not 1.
    return isinstance(x, int) and not isinstance(x, bool)


def _check_nonneg(name: str, value: float) -> None:
    checks.non_negative(name, value)


def _check_momentum(name: str, value: float) -> None:
    checks.in_range(name, value, 0.0, 1.0, high_open=True)


# --------------------------------------------------------------------------- parameter groups


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """The parameter names (as ``model.named_parameters()`` gives them) that a submodule lists
    in its own ``no_weight_decay()`` — timm's convention: a ViT's ``pos_embed``,
    ``cls_token``, …; a Swin's relative position bias tables — prefixed with that submodule's
    name. Names a module lists but does not have (timm lists ``dist_token`` on every ViT) are
    left out."""
    params = {name for name, _ in model.named_parameters()}
    out: set[str] = set()
    for prefix, module in model.named_modules():
        listed = getattr(module, "no_weight_decay", None)
        if not callable(listed):
            continue
        for name in listed():
            full = f"{prefix}.{name}" if prefix else str(name)
            if full in params:
                out.add(full)
    return out


def param_groups(model: nn.Module, weight_decay: float,
                 skip: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Two optimiser parameter groups: ``[decayed, excluded]``.

    A parameter with ``ndim <= 1`` (Linear/Conv biases; BatchNorm/LayerNorm/GroupNorm weights
    and biases), or named in ``skip`` (default: :func:`no_weight_decay_names` of ``model``,
    the position embeddings and class tokens of a timm ViT), goes to the second group, with
    ``weight_decay=0.0`` and ``lars_exclude=True``: SimCLR (Chen et al. 2020, App. B.1) and
    the LARS recipes it follows apply neither weight decay nor trust-ratio adaptation to
    biases and normalisation parameters, and the ViT recipes (DeiT, timm, DINO) none to
    position embeddings and class tokens. Every other
    parameter (conv kernels ``[C_out, C_in, k, k]``, linear weights ``[out, in]``) goes to the
    first group with ``weight_decay`` and ``lars_exclude=False``.

    Frozen parameters (``requires_grad=False``) are left out; a parameter shared between modules
    appears once (``model.parameters()`` de-duplicates by identity). Either group may be empty.

    Raises:
        ValueError: ``weight_decay`` negative or not finite, or no trainable parameter.
    """
    _check_nonneg("weight_decay", weight_decay)
    skipped = no_weight_decay_names(model) if skip is None else set(skip)
    decay: list[Tensor] = []
    no_decay: list[Tensor] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skipped else decay).append(p)
    if not decay and not no_decay:
        raise ValueError(
            f"model {type(model).__name__} has no trainable parameters "
            "(all have requires_grad=False or there are none)"
        )
    return [
        {"params": decay, "weight_decay": float(weight_decay), "lars_exclude": False},
        {"params": no_decay, "weight_decay": 0.0, "lars_exclude": True},
    ]


# --------------------------------------------------------------------------- LARS


class LARS(torch.optim.Optimizer):
    """SGD with momentum and the LARS layer-wise trust ratio (You et al. 2017; SimCLR 2020).

    For each parameter tensor ``p`` (one "layer") with gradient ``g``, in a group whose
    ``lars_exclude`` is False (the default when the key is absent)::

        g     = g + weight_decay * p
        trust = eta * ||p|| / (||g|| + eps)   if ||p|| > 0 and ||g|| > 0,   else 1
        buf   = momentum * buf + trust * g        (buf starts at 0, so step 1: buf = trust * g)
        d     = trust * g + momentum * buf        if nesterov,   else buf
        p     = p - lr * d

    i.e. the local learning rate is ``lr * trust`` and it scales the gradient before it enters
    the momentum buffer (the ``torchlars`` / SimCLR-pytorch form; the TF SimCLR code scales the
    same way). Norms are Frobenius norms over the whole tensor; ``eta`` is
    ``trust_coefficient``. In a group with ``lars_exclude=True`` the update is plain SGD with
    momentum and that group's weight decay, exactly :class:`torch.optim.SGD` with
    ``dampening=0`` (trust fixed at 1).

    The momentum buffer lives in ``self.state[p]["momentum_buffer"]``, so ``state_dict()`` /
    ``load_state_dict()`` round-trip the optimiser. The trust ratio is computed on the device
    with :func:`torch.where` (no host synchronisation), and each group's parameters (per device
    and dtype) are updated together with multi-tensor ``torch._foreach_*`` kernels rather than
    a Python loop of per-tensor kernels; the values are those of the per-tensor formula.

    Args:
        params: tensors or parameter groups (e.g. :func:`param_groups`).
        lr: learning rate ≥ 0.
        momentum: in [0, 1).
        weight_decay: ≥ 0 (a group's own value overrides it).
        trust_coefficient: eta > 0 (SimCLR: 0.001).
        eps: > 0, keeps the ratio finite for tiny gradients.
        nesterov: Nesterov momentum (needs momentum > 0).

    Raises:
        ValueError: any value outside those ranges, in the defaults or in a parameter group.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        *,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 1e-8,
        nesterov: bool = False,
    ) -> None:
        defaults: dict[str, Any] = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "trust_coefficient": trust_coefficient,
            "eps": eps,
            "nesterov": nesterov,
            "lars_exclude": False,
        }
        self._validate(defaults)
        super().__init__(params, defaults)

    @staticmethod
    def _validate(group: dict[str, Any]) -> None:
        _check_nonneg("lr", group["lr"])
        _check_momentum("momentum", group["momentum"])
        _check_nonneg("weight_decay", group["weight_decay"])
        eta = group["trust_coefficient"]
        if not (isinstance(eta, int | float) and math.isfinite(eta) and eta > 0):
            raise ValueError(f"trust_coefficient={eta!r} is not allowed: must be > 0")
        eps = group["eps"]
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps={eps!r} is not allowed: must be > 0")
        if group["nesterov"] and group["momentum"] <= 0:
            raise ValueError(
                f"nesterov=True with momentum={group['momentum']!r} is not allowed: "
                "Nesterov needs momentum > 0"
            )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (filled from the defaults) and validate its hyper-parameters."""
        super().add_param_group(param_group)
        self._validate(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter that has a gradient (formula in the class docstring)."""
        loss: float | None = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise ValueError("LARS does not support sparse gradients (got one)")
            # Multi-tensor kernels need one device and dtype per list.
            by_kind: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
            for p in params:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
            for same in by_kind.values():
                self._update(same, group)
        return loss

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """The class docstring's update for ``params`` (one device and dtype, all with a
        gradient) in a few multi-tensor (``torch._foreach_*``) kernels: elementwise the same
        operations, in the same order, as one parameter at a time."""
        lr: float = group["lr"]
        momentum: float = group["momentum"]
        wd: float = group["weight_decay"]
        grads = [p.grad for p in params if p.grad is not None]  # all of them (step() checks)
        # g + wd·p as new tensors: p.grad is never modified.
        d_p = list(torch._foreach_add(grads, params, alpha=wd)) if wd != 0 else grads
        if not group.get("lars_exclude", False):
            # ||p||, ||g|| over each whole tensor: [n] each, on the device (no host sync).
            p_norm = torch.stack(torch._foreach_norm(params))
            g_norm = torch.stack(torch._foreach_norm(d_p))
            trust = torch.where((p_norm > 0) & (g_norm > 0),
                                group["trust_coefficient"] * p_norm / (g_norm + group["eps"]),
                                torch.ones_like(p_norm))  # [n]
            # trust_i · g_i as new tensors (a 0-d factor per tensor: torch may run this one
            # per tensor, the other steps are multi-tensor kernels)
            d_p = list(torch._foreach_mul(d_p, list(trust.unbind())))
        started = [i for i, p in enumerate(params) if "momentum_buffer" in self.state[p]]
        for i, p in enumerate(params):  # first step: buf = 0 · momentum + d_p (as torch SGD)
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.clone(d_p[i]).detach()
        if started:
            bufs = [self.state[params[i]]["momentum_buffer"] for i in started]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, [d_p[i] for i in started])
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        update = torch._foreach_add(d_p, bufs, alpha=momentum) if group["nesterov"] else bufs
        torch._foreach_add_(params, update, alpha=-lr)


# --------------------------------------------------------------------------- LR scaling


def scaled_lr(
    base_lr: float,
    global_batch: int,
    rule: ScalingRule,
    reference_batch: int = 256,
) -> float:
    """The learning rate for a global batch of ``global_batch`` samples.

    * ``"linear"``: ``base_lr * global_batch / reference_batch`` (Goyal et al. 2017, "Accurate,
      Large Minibatch SGD"; SimCLR: ``lr = 0.3 × B / 256``).
    * ``"sqrt"``: ``base_lr * sqrt(global_batch / reference_batch)`` (SimCLR App. B.1: better for
      LARS at small batch sizes, e.g. ``0.075 × sqrt(B)`` is ``1.2 × sqrt(B / 256)``).
    * ``"none"``: ``base_lr``.

    Raises:
        ValueError: ``base_lr`` negative or not finite, ``global_batch`` or ``reference_batch``
            not an integer ≥ 1, or an unknown ``rule``.
    """
    _check_nonneg("base_lr", base_lr)
    if not (_is_int(global_batch) and global_batch >= 1):
        raise ValueError(f"global_batch={global_batch!r} is not allowed: must be an integer >= 1")
    if not (_is_int(reference_batch) and reference_batch >= 1):
        raise ValueError(
            f"reference_batch={reference_batch!r} is not allowed: must be an integer >= 1"
        )
    if rule == "linear":
        return base_lr * global_batch / reference_batch
    if rule == "sqrt":
        return base_lr * math.sqrt(global_batch / reference_batch)
    if rule == "none":
        return float(base_lr)
    raise ValueError(f"rule={rule!r} is not one of {', '.join(SCALING_RULES)}")


# --------------------------------------------------------------------------- schedule


def warmup_cosine(
    step: int, total_steps: int, warmup_steps: int, final_fraction: float = 0.0
) -> float:
    """LR multiplier in ``[final_fraction, 1]`` at optimiser step ``step`` (0-based).

    With ``W = warmup_steps``, ``T = total_steps``, ``D = T - W`` cosine steps and
    ``f = final_fraction``::

        step < W:        (step + 1) / W                       (step 0 is 1/W, never 0; W-1 is 1)
        W <= step < T:   f + (1 - f) * (1 + cos(pi * (step - W) / max(D - 1, 1))) / 2
        step >= T:       f                                     (clamped past the end)

    So the cosine phase starts at 1 at ``step == W`` and reaches exactly ``f`` at the last step
    ``T - 1`` when ``D >= 2`` (a single cosine step, ``D == 1``, stays at 1). Warm-up is linear
    (Goyal et al. 2017), decay is half a cosine without restarts (Loshchilov & Hutter 2017;
    SimCLR App. B.1).

    Raises:
        ValueError: ``step < 0``, ``total_steps < 1``, ``warmup_steps`` outside
            ``[0, total_steps]``, or ``final_fraction`` outside ``[0, 1]``.
    """
    if not (_is_int(total_steps) and total_steps >= 1):
        raise ValueError(f"total_steps={total_steps!r} is not allowed: must be an integer >= 1")
    if not (_is_int(warmup_steps) and 0 <= warmup_steps <= total_steps):
        raise ValueError(
            f"warmup_steps={warmup_steps!r} is not allowed: must be an integer in "
            f"[0, total_steps={total_steps}]"
        )
    if not (isinstance(final_fraction, int | float) and 0.0 <= final_fraction <= 1.0):
        raise ValueError(f"final_fraction={final_fraction!r} is not allowed: must be in [0, 1]")
    if not (_is_int(step) and step >= 0):
        raise ValueError(f"step={step!r} is not allowed: must be an integer >= 0")

    if step >= total_steps:
        return float(final_fraction)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = total_steps - warmup_steps  # >= 1 here, since warmup_steps <= step < total
    progress = (step - warmup_steps) / max(decay_steps - 1, 1)  # in [0, 1]
    return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(
    step: int, total_steps: int, warmup_steps: int, final_fraction: float = 0.0
) -> float:
    """LR multiplier: ``(step + 1) / W`` during the ``W = warmup_steps`` warm-up steps, then 1
    (``final_fraction`` is ignored; the arguments are validated as :func:`warmup_cosine`).

    Raises:
        ValueError: as :func:`warmup_cosine`.
    """
    warmup_cosine(step, total_steps, warmup_steps, final_fraction)  # the same checks
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def warmup_step(
    step: int, total_steps: int, warmup_steps: int, milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> float:
    """LR multiplier: ``(step + 1) / W`` during the ``W = warmup_steps`` warm-up steps, then
    ``gamma ** k`` where ``k`` is the number of ``milestones`` (optimiser steps, increasing)
    at or before ``step`` — torch's ``MultiStepLR`` after a linear warm-up.

    Raises:
        ValueError: as :func:`warmup_cosine`; ``gamma`` outside ``(0, 1]``; milestones that are
            not increasing integers in ``[1, total_steps)``.
    """
    warmup_cosine(step, total_steps, warmup_steps)  # the same checks
    checks.in_range("gamma", gamma, 0.0, 1.0, low_open=True)
    if not all(_is_int(m) and 1 <= m < total_steps for m in milestones) or any(
            b <= a for a, b in zip(milestones, milestones[1:], strict=False)):
        raise ValueError(f"milestones={milestones!r} are not allowed: give increasing steps in "
                         f"[1, total_steps={total_steps})")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return float(gamma ** sum(step >= m for m in milestones))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: int,
    final_fraction: float = 0.0,
    schedule: ScheduleName = "cosine",
    milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
) -> LambdaLR:
    """``LambdaLR`` with multiplier :func:`warmup_cosine` (``schedule="cosine"``),
    :func:`warmup_constant` (``"constant"``) or :func:`warmup_step` (``"step"``: ``milestones``
    in optimiser steps, ``gamma``); call ``.step()`` after each ``optimizer.step()``.

    The multiplier is a :func:`functools.partial` (not a lambda), so the scheduler pickles;
    its ``state_dict()`` holds only plain values (the partial's empty ``__dict__``), which
    ``torch.load(weights_only=True)`` reads back. The arguments are validated here, before any
    step.

    Raises:
        ValueError: as :func:`warmup_cosine`, or an unknown ``schedule``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
    warmup_cosine(0, total_steps, warmup_steps, final_fraction)  # validate now, not mid-run
    if schedule == "step":
        warmup_step(0, total_steps, warmup_steps, milestones, gamma)
        fn = functools.partial(warmup_step, total_steps=total_steps, warmup_steps=warmup_steps,
                               milestones=tuple(milestones), gamma=gamma)
    else:
        fn = functools.partial(
            warmup_cosine if schedule == "cosine" else warmup_constant,
            total_steps=total_steps,
            warmup_steps=warmup_steps,
            final_fraction=final_fraction,
        )
    return LambdaLR(optimizer, lr_lambda=fn)


# --------------------------------------------------------------------------- builder


def build_optimizer(
    model: nn.Module,
    name: OptimizerName,
    lr: float,
    momentum: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    trust_coefficient: float = 0.001,
) -> torch.optim.Optimizer:
    """The optimiser ``name`` over :func:`param_groups` of ``model``.

    * ``"sgd"``: :class:`torch.optim.SGD` with ``momentum`` (biases/norms not decayed).
    * ``"lars"``: :class:`LARS` with ``momentum`` and ``trust_coefficient``; biases/norms get
      neither decay nor adaptation (SimCLR App. B.1).
    * ``"adam"``: :class:`torch.optim.Adam` (Kingma & Ba 2015) with ``betas``, weight decay as
      an L2 term in the gradient; ``momentum`` is ignored.
    * ``"adamw"``: :class:`torch.optim.AdamW` (Loshchilov & Hutter 2019) with ``betas``,
      decoupled weight decay; ``momentum`` is ignored.

    The groups' extra ``lars_exclude`` key is carried (and ignored) by SGD and AdamW.

    Raises:
        ValueError: an unknown ``name`` (listing the allowed ones), or ``lr``, ``momentum``,
            ``weight_decay``, ``betas`` or ``trust_coefficient`` out of range.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer name={name!r} is not one of {', '.join(OPTIMIZERS)}")
    _check_nonneg("lr", lr)
    groups = param_groups(model, weight_decay)
    if name in ("adam", "adamw"):
        if not (
            isinstance(betas, tuple | list)
            and len(betas) == 2
            and all(isinstance(b, int | float) and 0.0 <= b < 1.0 for b in betas)
        ):
            raise ValueError(f"betas={betas!r} is not allowed: must be two numbers in [0, 1)")
        adam = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return adam(
            groups, lr=lr, betas=(float(betas[0]), float(betas[1])), weight_decay=weight_decay
        )
    _check_momentum("momentum", momentum)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return LARS(
        groups,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        trust_coefficient=trust_coefficient,
    )


def build_for_run(
    model: nn.Module, cfg: OptimConfig, global_batch: int, steps_per_epoch: int, epochs: int
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """The optimiser and schedule ``cfg`` asks for: the LR scaled from
    ``cfg.reference_batch`` to ``global_batch``, ``cfg.warmup_epochs`` of warm-up (at most
    the whole run), then ``cfg.schedule`` over ``steps_per_epoch × epochs`` steps. The one
    place a run's optimisation is assembled (the pretraining workers and bench/parity.py's
    plain loop both call it).

    Raises:
        ValueError: as :func:`build_optimizer` and :func:`build_scheduler`.
    """
    total = steps_per_epoch * epochs
    lr = scaled_lr(cfg.lr, global_batch, cfg.lr_scaling, cfg.reference_batch)
    optimizer = build_optimizer(model, cfg.name, lr, cfg.momentum, cfg.weight_decay,
                                betas=(cfg.betas[0], cfg.betas[1]),
                                trust_coefficient=cfg.trust_coefficient)
    warmup = min(total, round(cfg.warmup_epochs * steps_per_epoch))
    # step: milestones in epochs -> optimiser steps (one past the run's end drops out)
    milestones = tuple(m for m in (round(e * steps_per_epoch) for e in cfg.step_epochs)
                       if 1 <= m < total)
    return optimizer, build_scheduler(optimizer, total, warmup, cfg.final_lr_fraction,
                                      cfg.schedule, milestones, cfg.step_gamma)



# --------------------------------------------------------------------------- elastic resume


def schedule_position(samples: int, global_batch: int) -> int:
    """The optimiser step a run of ``global_batch`` samples per step is at after ``samples``
    training samples: ``round(samples / global_batch)``. What a resume on another cluster
    shape continues from: the schedule's position is the samples seen, not the steps, so a
    1 → 8 worker resume after 1 000 steps of 256 continues at step 125 of the 2 048-sample
    run (the nearest step when the samples are not a whole number of the new batches).

    Raises:
        ValueError: ``samples`` negative or ``global_batch`` < 1 (or either not an integer).
    """
    if not (_is_int(samples) and samples >= 0):
        raise ValueError(f"samples={samples!r} is not allowed: must be an integer >= 0")
    if not (_is_int(global_batch) and global_batch >= 1):
        raise ValueError(f"global_batch={global_batch!r} is not allowed: must be an integer >= 1")
    return int(round(samples / global_batch))


def continue_schedule(optimizer: torch.optim.Optimizer, scheduler: LambdaLR,
                      base_lrs: Sequence[float], step: int) -> list[float]:
    """Re-place a restored optimiser and schedule (their ``load_state_dict`` done) where a
    fresh run of *this* run's shape is after ``step`` optimiser steps; returns the LRs of the
    next step, one per parameter group.

    A checkpoint's state carries the base LRs of the run that wrote it (``optim.lr`` scaled
    to its global batch by ``optim.lr_scaling``) and a position counted in its steps. The
    schedule's function is this run's already (``LambdaLR`` saves nothing of a
    :func:`functools.partial`'s arguments, see :func:`build_scheduler`); here its base LRs
    become ``base_lrs`` — this run's, as :func:`build_for_run` computed them, read off the
    scheduler before the state was loaded — and its position ``step``
    (:func:`schedule_position` of the samples seen). Every group's ``lr`` is then
    ``base_lr · multiplier(step)``, the expression ``LambdaLR`` evaluates, so the LR of every
    later step equals the fresh run's bit for bit. With an unchanged shape and config this
    rewrites the restored values with themselves. The optimiser's per-parameter state
    (momentum buffers, Adam moments) is kept as restored.

    Raises:
        ValueError: ``base_lrs`` not one per parameter group, or ``step`` negative.
    """
    groups = optimizer.param_groups
    if len(base_lrs) != len(groups) or len(scheduler.lr_lambdas) != len(groups):
        raise ValueError(f"{len(base_lrs)} base LRs and {len(scheduler.lr_lambdas)} schedule "
                         f"functions for {len(groups)} parameter groups: give one per group")
    if not (_is_int(step) and step >= 0):
        raise ValueError(f"step={step!r} is not allowed: must be an integer >= 0")
    bases = [float(b) for b in base_lrs]
    scheduler.base_lrs = list(bases)
    scheduler.last_epoch = step
    lrs = [base * fn(step) for fn, base in zip(scheduler.lr_lambdas, bases, strict=True)]
    for group, base, lr in zip(groups, bases, lrs, strict=True):
        group["initial_lr"] = base
        group["lr"] = lr
    scheduler._last_lr = list(lrs)  # what get_last_lr() reports
    return lrs
