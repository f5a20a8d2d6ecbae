"""``train.accumulate: k``: exact large batches on few devices (:class:`GradCache`, used by
:func:`components.training.step.train_step`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from components.runtime import distributed

if TYPE_CHECKING:
    from components.data.multicrop import Images
    from components.objectives import Metrics
    from components.objectives.memory import EMA
    from components.training.step import PretrainModel


class GradCache:
    """``train.accumulate = k > 1``: one step's gradient computed in k encoder chunks, with
    activation memory of one chunk and the loss of the whole batch (the "gradient cache" of
    Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
    Setup").

    :meth:`forward` (pass 1) runs the encoder on each chunk of ``B / k`` samples (all their
    views: ``images [B/k, V, 3, H, W]``) without a graph, concatenates the outputs the
    objective reads (``z [B, V, D]``; ``logits [B, V, C]`` when it requires them) into leaves
    that require grad, and calls the objective ONCE on the whole batch: negatives, targets,
    the gathers across ranks and the memory bank's one write are the unchunked step's, and
    its ``(loss, metrics)`` are returned as they are. The caller's ``loss.backward()`` (scaled
    or not) then gives the objective's own parameters their gradients (CLIP's head) and the
    leaves ``d loss / d z``. :meth:`backward` (pass 2) re-runs each chunk with a graph and
    backpropagates its slice of the cached gradients: ``Σ_chunks (∂z_c/∂θ)ᵀ g_c`` is the
    chain rule's ``(∂z/∂θ)ᵀ g``, so the parameter gradient is the unchunked step's (exactly,
    up to float rounding, when nothing in the encoder depends on the batch). The EMA keys
    (no graph anyway) are computed per chunk too, in pass 1.

    Kept equal between the passes, so pass 2 recomputes pass 1's outputs:

    * randomness (dropout, drop-path): each chunk's CPU (and its CUDA device's) RNG state is
      recorded before it runs in pass 1 and replayed in pass 2 inside ``fork_rng``, so the
      global RNG ends where pass 1 left it (GradCache's ``RandContext``);
    * module buffers (BatchNorm running statistics; ``GlobalBatchNorm`` also shifts by its
      running mean): the encoder's buffers are recorded before pass 1 and restored before
      pass 2, so pass 2 meets each chunk with the buffers pass 1 met it with. Each chunk
      is normalised with its own statistics (as k DDP ranks of ``B / k`` without SyncBN; with
      ``model.sync_bn`` on GPUs, over every rank's same chunk), and the running statistics
      end with one update per chunk (pass 2's, which repeat pass 1's), not two.

    DDP: :class:`PretrainModel` is one DDP module (encoder + objective), and DDP's forward
    cannot run the encoder alone. Both passes call the wrapped module's parts directly, so
    DDP's reducer is never armed (its autograd hooks return at once) and its hooks add
    nothing; :meth:`backward` then averages every gradient over the ranks itself, with one
    all-reduce per gradient dtype (a flat copy of the gradients: one more gradient's worth of
    memory, for the call), as DDP's buckets would, but after the backward instead of
    overlapping it. A parameter without a gradient keeps none: which parameters the loss
    reads is the same on every rank for every objective here (CoNe's projector waits for the
    bank, which is identical on every rank), as DDP's ``find_unused_parameters`` needs too.
    Under a gradient scaler the cached gradients are scaled, so are pass 2's: the caller
    unscales after :meth:`backward` and the scaler's inf / NaN check works as before.
    Non-finite embeddings are refused in pass 1 by the batch's checks, as without chunks.
    """

    def __init__(self, ddp: nn.Module, model: PretrainModel, k: int) -> None:
        self.ddp = ddp  # as train_step got it: DDP (several ranks) or the PretrainModel
        self.model = model  # the PretrainModel itself
        self.k = k
        self._chunks: tuple[Images, ...] = ()
        self._rng: list[tuple[Tensor, Tensor | None]] = []
        self._buffers: list[Tensor] = []
        self._saved: list[Tensor] = []
        self._leaves: list[Tensor] = []

    def forward(self, batch: Any, ema: EMA | None) -> tuple[Tensor, Metrics]:
        """Pass 1 on a reader ``Batch`` (``images [B, V, 3, H, W]``): the objective's
        ``(loss, metrics)`` on the whole batch, its graph starting at the cached leaves.

        Raises:
            ValueError: B is not a multiple of k (the config refuses that for the training
                loader's batches).
        """
        model, images = self.model, batch.images  # a tensor or a MultiCrop
        b = images.shape[0]
        if b % self.k:
            raise ValueError(f"train.accumulate={self.k} does not divide this batch of {b} "
                             "samples")
        self._chunks = images.split(b // self.k)  # [B/k, V, 3, H, W] each (or MultiCrops)
        self._buffers = list(model.encoder.buffers())
        self._saved = [t.detach().clone() for t in self._buffers]
        self._rng = []
        z: list[Tensor] = []
        logits: list[Tensor] = []
        ez: list[Tensor] = []
        el: list[Tensor] = []
        feats: list[Tensor] = []  # [B/k·V, F] per chunk: the online probe's features
        with torch.no_grad():
            for x in self._chunks:
                self._rng.append(_rng_state(x.device))
                hc, zc, lc = model.encode_full(x)  # h kept for the online probe
                if model.keep_features:
                    feats.append(hc.flatten(0, 1))  # [B/k·V, F]
                z.append(zc)
                if lc is not None:
                    logits.append(lc)
            if ema is not None:
                for x in self._chunks:
                    ezc, elc = model.encode(x, ema)
                    ez.append(ezc)
                    if elc is not None:
                        el.append(elc)
        if feats:  # chunks of whole samples: concatenated, row b·V + v of the batch
            model._features = torch.cat(feats)
        wants_logits = "logits" in model.objective.requires
        self._leaves = [torch.cat(z).requires_grad_()]
        if wants_logits and logits:
            self._leaves.append(torch.cat(logits).requires_grad_())
        return model.objective(model.contrastive_batch(
            self._leaves[0], self._leaves[1] if len(self._leaves) > 1 else None,
            torch.cat(ez) if ez else None, torch.cat(el) if el else None,
            batch.labels, batch.sample_ids, batch.captions))

    def backward(self) -> None:
        """Pass 2, after the caller's backward of :meth:`forward`'s loss: each chunk again
        with a graph, its slice of the cached gradients backpropagated; then, under DDP,
        every gradient averaged over the ranks. Run it under the forward's autocast."""
        model = self.model
        grads = [leaf.grad for leaf in self._leaves]  # [B, V, D] (, [B, V, C]) or None
        if any(g is not None for g in grads):  # CE reads logits only: z has none
            if self._buffers:  # pass 1's buffers, chunk 1 on
                torch._foreach_copy_(self._buffers, self._saved)
            n = self._chunks[0].shape[0]
            for c, x in enumerate(self._chunks):
                with _replayed_rng(self._rng[c], x.device):
                    outs = model.encode(x)
                pairs = [(out, g[c * n:(c + 1) * n]) for out, g in zip(outs, grads, strict=False)
                         if out is not None and g is not None]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self._chunks, self._leaves, self._saved, self._buffers, self._rng = (), [], [], [], []
        if self.ddp is not model and distributed.is_distributed():
            _average_gradients(model)


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The CPU RNG state and ``device``'s (CUDA) one, to replay a chunk's draws."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def _replayed_rng(state: tuple[Tensor, Tensor | None], device: torch.device) -> Iterator[None]:
    """Run the block from a recorded :func:`_rng_state`; the RNG states are put back after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
        yield


@torch.no_grad()
def _average_gradients(module: nn.Module) -> None:
    """Every parameter gradient averaged over the ranks (what DDP does in its backward): one
    all-reduce of the flattened gradients per (dtype, device)."""
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for p in module.parameters():
        if p.grad is not None:
            groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    world = distributed.world_size()
    for grads in groups.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        total = distributed.all_reduce_sum(flat).div_(world)
        parts = total.split([g.numel() for g in grads])
        torch._foreach_copy_(grads, [t.view_as(g) for t, g in zip(parts, grads, strict=True)])
