"""Supervised Contrastive loss, both forms of Khosla et al. 2020 (supcon.txt Sec. 3.2).

P(i) = candidates with the anchor's label, other than the anchor itself; A(i) = all but i.

* ``variant='out'`` (Eq. 2, the paper's choice):
  ``loss_i = −(1/|P(i)|) Σ_{p∈P(i)} log( e^{s_ip} / Σ_{a∈A(i)} e^{s_ia} )``
* ``variant='in'`` (Eq. 3):
  ``loss_i = −log( (1/|P(i)|) Σ_{p∈P(i)} e^{s_ip} / Σ_{a∈A(i)} e^{s_ia} )``

L_in ≤ L_out by Jensen. With every label unique, L_out is SimCLR. Anchors whose label occurs
nowhere else (a singleton class seen in one view) have no positive: excluded from the mean and
counted in ``anchors_without_positive``.

Shapes: ``batch.z`` [B, V, D], ``batch.labels`` [B] (required); ``ema_z`` with a bank.

Raises:
    ValueError: τ ≤ 0, an unknown variant, missing labels, bad shapes, non-finite inputs.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from components.objectives.core import BatchContrastive
from components.objectives.pairing import Pairs
from components.objectives.reducers import hard_graph_loss
from components.objectives.targets import label_positives


class SupCon(BatchContrastive):
    requires = frozenset({"labels"})
    # masks up to 2B = 512 (reducers.DENSE_GRAPH_ENTRIES): ~M/classes positives per anchor make
    # the sparse path dearer than SimCLR's
    dense_graph_entries = 1 << 18

    def __init__(
        self,
        tau: float = 0.1,
        *,
        variant: Literal["out", "in"] = "out",
        bank_size: int = 0,
        dim: int = 0,
    ) -> None:
        super().__init__(tau, bank_size=bank_size, dim=dim)
        if variant not in ("out", "in"):
            raise ValueError(f"SupCon variant={variant!r} is not allowed: choose 'out' or 'in'")
        self.variant = variant

    def per_anchor(self, pairs: Pairs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        loss, valid = hard_graph_loss(pairs, self.tau, label_positives(pairs),
                                      log_mass=self.variant == "in")
        return loss, valid, {}
