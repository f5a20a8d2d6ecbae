"""InfoNCE / SimCLR (NT-Xent) with any number of views.

Chen et al. 2020 (SimCLR); xclr.txt Sec. 2.2 writes it as ``H(1_{i'}, p_i)``. With V views the
target is uniform over the V−1 other views of the anchor's image (the instance graph), i.e.
SupCon L_out with one label per image:

    loss_i = logsumexp_{j≠i} s_ij − (1/|P(i)|) Σ_{p∈P(i)} s_ip,   s_ij = cos(z_i, c_j) / τ

With identical embeddings, one positive and 2N candidates this is log(2N − 1).

Shapes: ``batch.z`` [B, V, D]; ``sample_ids`` [B] optional (needed to match bank rows of the
same image); with ``bank_size > 0`` the EMA keys ``ema_z`` [B, V, D] are required.

Raises:
    ValueError: τ ≤ 0 or a bad bank size (construction); bad shapes, non-finite inputs (call).
"""

from __future__ import annotations

from torch import Tensor

from components.objectives.core import BatchContrastive
from components.objectives.pairing import Pairs
from components.objectives.reducers import hard_graph_loss
from components.objectives.targets import instance_positives


class InfoNCE(BatchContrastive):
    def per_anchor(self, pairs: Pairs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        loss, valid = hard_graph_loss(pairs, self.tau, instance_positives(pairs))
        return loss, valid, {}
