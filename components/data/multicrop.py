"""Training views of several crop sizes (``data.view_groups`` with more than one resolution,
e.g. SwAV's 2 × 224 + 6 × 96): :class:`MultiCrop`, the reader's ``Batch.images`` then.

Views of one size stack into one tensor; views of different sizes cannot. A :class:`MultiCrop`
holds one ``[B, V_i, 3, H_i, W_i]`` tensor per *block*, a run of consecutive views of one
size, in view order: view ``v`` of the batch is found by walking the blocks. Where every view
has one size the reader gives a plain ``[B, V, 3, H, W]`` tensor (:data:`Images` is either),
as it always has. :func:`size_groups` says which blocks share a size: the model runs the
encoder once per size (:meth:`components.training.step.PretrainModel.encode`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class MultiCrop:
    """The views of a batch as ``blocks``: ``[B, V_i, 3, H_i, W_i]`` tensors (one per run of
    consecutive views of one size, in view order; every block has the same ``B``, device and
    dtype). ``V`` = Σ V_i.

    Raises:
        ValueError: no block, a block not 5-d with 3 channels, or blocks of different ``B``.
    """

    blocks: tuple[Tensor, ...]

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError("a MultiCrop needs at least one block of views")
        b = self.blocks[0].shape[0]
        for i, x in enumerate(self.blocks):
            if x.ndim != 5 or x.shape[2] != 3 or x.shape[0] != b:
                raise ValueError(f"MultiCrop block {i} has shape {tuple(x.shape)}: every "
                                 f"block must be [B={b}, V_i, 3, H_i, W_i]")

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, V)``: samples and views (what ``images.shape[:2]`` is for a tensor)."""
        return self.blocks[0].shape[0], sum(x.shape[1] for x in self.blocks)

    @property
    def device(self) -> torch.device:
        return self.blocks[0].device

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].dtype

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """``(H, W)`` of each view, in view order."""
        return [(int(x.shape[3]), int(x.shape[4])) for x in self.blocks
                for _ in range(x.shape[1])]

    def split(self, n: int) -> tuple[MultiCrop, ...]:
        """Chunks of ``n`` samples (the last may be smaller), as ``Tensor.split`` along B."""
        parts = [x.split(n) for x in self.blocks]
        return tuple(MultiCrop(tuple(p)) for p in zip(*parts, strict=True))

    def view(self, v: int) -> Tensor:
        """View ``v`` of every sample: ``[B, 3, H_v, W_v]``."""
        for x in self.blocks:
            if v < x.shape[1]:
                return x[:, v]
            v -= x.shape[1]
        raise IndexError(f"view index out of range: the batch has {self.shape[1]} views")

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> MultiCrop:
        """Every block through ``Tensor.to(device, dtype)``."""
        return MultiCrop(tuple(x.to(device, dtype) for x in self.blocks))


# A batch's training views: one tensor [B, V, 3, H, W] (one size) or a MultiCrop.
Images = Tensor | MultiCrop


def size_groups(images: MultiCrop) -> dict[tuple[int, int], list[int]]:
    """The blocks of each view size, ``{(H, W): [block index, …]}``, sizes in order of first
    appearance (blocks of one size that are not adjacent, 224 / 96 / 224, share an entry)."""
    out: dict[tuple[int, int], list[int]] = {}
    for i, x in enumerate(images.blocks):
        out.setdefault((int(x.shape[3]), int(x.shape[4])), []).append(i)
    return out


def batch_views(images: Images) -> tuple[int, int]:
    """``(B, V)`` of a tensor ``[B, V, 3, H, W]`` or a :class:`MultiCrop`."""
    b, v = images.shape[:2]
    return int(b), int(v)


def view_of(images: Images, v: int) -> Tensor:
    """View ``v`` of every sample, ``[B, 3, H, W]``, of either kind of :data:`Images`."""
    return images.view(v) if isinstance(images, MultiCrop) else images[:, v]
