"""SINCERE and ε-SupInfoNCE: supervised InfoNCE without same-class terms in the denominator.

SINCERE (sincere.txt Sec. 3.3, Eq. 12): for anchor i, each positive p ∈ P(i) (same label, ≠ i)
takes a turn as the target; the noise set N(i) holds the candidates of other labels:

    loss_i = (1/|P(i)|) Σ_{p∈P(i)} −log( e^{s_ip} / (e^{s_ip − ε/τ} + Σ_{n∈N(i)} e^{s_in}) )

ε = 0 is SINCERE; ε > 0 is ε-SupInfoNCE of Barbano et al. 2023 (sincere.txt Sec. 3.5, Eq. 15),
the positive's own denominator term being ``e^{(cos_ip − ε)/τ}`` — ε is in cosine units, so a
τ sweep does not rescale the margin. With unique labels and two views (only the other view
positive) SINCERE equals InfoNCE. A singleton class with one view has no positive: it is
excluded (SINCERE's reference code returns NaN there).

Shapes: ``batch.z`` [B, V, D], ``batch.labels`` [B] (required).

Raises:
    ValueError: τ ≤ 0, ε < 0, missing labels, bad shapes, non-finite inputs.
"""

from __future__ import annotations

from torch import Tensor

from components.objectives.core import BatchContrastive, check_non_negative
from components.objectives.pairing import Pairs
from components.objectives.reducers import masked_logits, noise_contrastive
from components.objectives.targets import label_graph


class SINCERE(BatchContrastive):
    requires = frozenset({"labels"})

    def __init__(
        self, tau: float = 0.1, *, epsilon: float = 0.0, bank_size: int = 0, dim: int = 0
    ) -> None:
        super().__init__(tau, bank_size=bank_size, dim=dim)
        self.epsilon = check_non_negative("epsilon", epsilon)

    def per_anchor(self, pairs: Pairs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        logits = masked_logits(pairs, self.tau)
        loss, valid = noise_contrastive(
            logits, label_graph(pairs), pairs.self_mask(), margin=self.epsilon / self.tau
        )
        return loss, valid, {}
