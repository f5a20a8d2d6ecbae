"""The online linear probe (``probe:`` in a pretrain config, :class:`OnlineProbe`): a linear
classifier trained beside the encoder on its detached backbone features, as solo-learn's and
lightly's online classifiers are, scored every few epochs on the unaugmented features the
online kNN extracts.

* Training, every step (:meth:`OnlineProbe.step`): ``logits = h Wᵀ + b`` on the features
  ``h [B·V, F]`` of every view of the batch (detached: no gradient reaches the encoder; cast
  to float32, outside autocast and the encoder's gradient scaler), cross-entropy against the
  image's label, one AdamW step (constant LR). All views: the encoder computed them anyway,
  and V views are V times the samples per step. Zero-initialised (no random draw: the
  encoder's RNG stream is untouched and every rank starts equal).
* Several ranks: each rank's gradient of the loss *summed* over its rows, and its row count,
  are summed over the ranks in one all-reduce and divided by the global count — the gradient
  of the mean cross-entropy over the global batch, what one process computes on the
  concatenated batch (also when ranks hold different numbers of labelled rows). Every rank
  then takes the same AdamW step: the probes stay equal without a broadcast. Its cost: one
  all-reduce of ``C·(F + 1) + 2`` floats per step (ResNet-50 on ImageNet-1k: 2.05 M, about
  8 % of the encoder's 25.6 M-parameter gradient) — all-gathering the features instead would
  grow with the global batch.
* Scoring (:meth:`OnlineProbe.correct`): top-1 hits and rows of every rank's query features,
  one all-reduce.

No host read per step: the loss is returned as a 0-d device tensor
(:class:`components.training.step.StepState` sums it on the device).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from components.runtime import distributed


class OnlineProbe:
    """``nn.Linear(feature_dim, num_classes)`` and its own AdamW, on ``device``.

    Labels ``-1`` (unlabelled rows) are left out of the loss; a batch without any labelled
    row over all ranks leaves a zero gradient (AdamW still applies its momentum and decay).
    """

    def __init__(self, feature_dim: int, num_classes: int, *, lr: float,
                 weight_decay: float, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        # Built on the meta device (nn.Linear's own init would draw from the global RNG, the
        # encoder's stream), then zero-initialised: the same on every rank, no draw.
        linear = nn.Linear(feature_dim, num_classes, device="meta", dtype=dtype)
        self.linear = linear.to_empty(device=device)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()
        self.optimizer = torch.optim.AdamW(self.linear.parameters(), lr=lr,
                                           weight_decay=weight_decay)

    @property
    def dtype(self) -> torch.dtype:
        return self.linear.weight.dtype

    def set_hyperparameters(self, lr: float, weight_decay: float) -> None:
        """This run's ``probe.lr`` / ``weight_decay`` over restored optimizer state (a resume
        may change them)."""
        for g in self.optimizer.param_groups:
            g["lr"], g["weight_decay"] = lr, weight_decay

    def step(self, features: Tensor, labels: Tensor, views: int = 1) -> Tensor:
        """One AdamW step on ``features [N·views, F]`` (row ``n·views + v``: view v of image
        n, the encoder's layout) with ``labels [N]``; returns the mean cross-entropy over
        every rank's labelled rows before the step (0-d, on the device, no gradient)."""
        x = features.detach().to(self.dtype)  # [R, F], R = N·views
        y = labels.to(device=x.device, dtype=torch.int64)
        if views > 1:
            y = y.repeat_interleave(views)  # [R]: each view carries its image's label
        params = [self.linear.weight, self.linear.bias]
        with torch.autocast(device_type=x.device.type, enabled=False), torch.enable_grad():
            loss_sum = F.cross_entropy(self.linear(x), y, ignore_index=-1, reduction="sum")
            grads = torch.autograd.grad(loss_sum, params)  # d Σ CE / d (W [C, F], b [C])
        count = (y >= 0).sum().to(x.dtype)
        # [C·F + C + 2]: both gradients, the loss sum and the row count, summed over ranks
        flat = torch.cat([g.reshape(-1) for g in grads]
                         + [loss_sum.detach().reshape(1), count.reshape(1)])
        flat = distributed.all_reduce_sum(flat)
        n = flat[-1].clamp_min(1.0)
        w_grad, b_grad = flat[:-2].div(n).split(
            [self.linear.weight.numel(), self.linear.bias.numel()])
        self.linear.weight.grad = w_grad.view_as(self.linear.weight)
        self.linear.bias.grad = b_grad.view_as(self.linear.bias)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return flat[-2] / n

    @torch.no_grad()
    def correct(self, features: Tensor, labels: Tensor) -> tuple[int, int]:
        """``(right, rows)`` of the top-1 prediction over every rank's ``features [M, F]``
        with ``labels [M]`` (unlabelled ``-1`` rows left out); every rank gets the same."""
        x = features.to(device=self.linear.weight.device, dtype=self.dtype)
        y = labels.to(device=x.device, dtype=torch.int64)
        with torch.autocast(device_type=x.device.type, enabled=False):
            pred = self.linear(x).argmax(dim=1)  # [M]
        kept = y >= 0
        stats = torch.stack([(pred.eq(y) & kept).sum(), kept.sum()]).to(torch.int64)
        right, rows = distributed.all_reduce_sum(stats).tolist()
        return int(right), int(rows)

    def state_dict(self) -> dict[str, Any]:
        """The weights and the optimizer state (what a checkpoint's ``probe`` holds)."""
        return {"linear": self.linear.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.linear.load_state_dict(state["linear"])
        self.optimizer.load_state_dict(state["optimizer"])
