"""FIFO memory bank and EMA ("momentum") model, as MoCo / SupCon's bank variant / CoNe use them.

The bank is filled by the EMA encoder's keys (cone.txt Alg. 1: "Update Q_z and Q_p by z^k and
p^class-k"). :meth:`MemoryBank.enqueue` gathers the keys of every rank itself, so the bank is
identical on all ranks by construction; its size is free (no "K divisible by the global
batch": a write that crosses the end wraps around, one larger than K keeps the newest K).
Because it is identical everywhere and every write's row count is known on the host, the
bank's write pointer and fill count are kept as Python ints (mirrored into buffers for
checkpoints): using them never reads a value back from the device.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from components import checks
from components.runtime import distributed


class MemoryBank(nn.Module):
    """Ring buffer of the last ``size`` keys with their labels, ids, captions and class probs.

    Args:
        size: capacity K ≥ 1.
        dim: key dimension D.
        caption_dim: caption-embedding dimension E, or 0 to store none.
        num_classes: C for class probabilities (CoNe's Q_p), or 0 to store none.

    All state lives in buffers, so ``state_dict``/``load_state_dict`` (and a checkpoint of the
    module that owns the bank) carry it. Rows ``[0, len(bank))`` are valid; unlabelled rows
    have label -1 and rows without a sample id have id -1. The ``ptr`` / ``filled`` buffers
    have host-side mirrors that :meth:`enqueue` and ``len()`` use (no device read per step);
    loading a state dict restores the mirrors from the buffers. Write to the bank only through
    :meth:`enqueue` or ``load_state_dict``.

    Raises:
        ValueError: size < 1, dim < 1, or negative caption_dim / num_classes.
    """

    features: Tensor
    labels: Tensor
    ids: Tensor
    captions: Tensor
    probs: Tensor
    ptr: Tensor
    filled: Tensor

    def __init__(
        self, size: int, dim: int, *, caption_dim: int = 0, num_classes: int = 0
    ) -> None:
        super().__init__()
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"memory bank size={size!r} is not allowed: it must be an int >= 1")
        if dim < 1:
            raise ValueError(f"memory bank dim={dim!r} must be >= 1")
        if caption_dim < 0 or num_classes < 0:
            raise ValueError(
                f"caption_dim={caption_dim} and num_classes={num_classes} must be >= 0 "
                "(0 = do not store)"
            )
        self.size = size
        self.register_buffer("features", torch.zeros(size, dim))
        self.register_buffer("labels", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ids", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("captions", torch.zeros(size, caption_dim))
        self.register_buffer("probs", torch.zeros(size, num_classes))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self._ptr = 0  # host mirrors of the two buffers above
        self._filled = 0

    def __len__(self) -> int:
        return self._filled

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        # The buffers now hold the loaded values: one device read per load, not per step.
        self._ptr, self._filled = torch.stack([self.ptr, self.filled]).tolist()

    @torch.no_grad()
    def enqueue(
        self,
        features: Tensor,
        labels: Tensor | None = None,
        ids: Tensor | None = None,
        captions: Tensor | None = None,
        probs: Tensor | None = None,
        sizes: Sequence[int] | None = None,
    ) -> None:
        """Append this rank's rows (gathered from every rank, in rank order), oldest out first.

        Args:
            features: [n, D] keys (stored as given; normalise before if you need to).
            labels, ids: [n] int64, or None to store -1.
            captions: [n, E] when the bank stores captions.
            probs: [n, C] when the bank stores class probabilities.
            sizes: every rank's n in rank order, if the caller knows them; else they are
                exchanged once (one host synchronisation when distributed) for all fields.
        """
        n = features.shape[0]
        if features.ndim != 2 or features.shape[1] != self.features.shape[1]:
            raise ValueError(
                f"bank features must be [n, {self.features.shape[1]}], got {tuple(features.shape)}"
            )
        fields = {
            "features": features,
            "labels": labels if labels is not None else self._fill(n, features.device),
            "ids": ids if ids is not None else self._fill(n, features.device),
        }
        for name, value in (("captions", captions), ("probs", probs)):
            width = getattr(self, name).shape[1]
            if width == 0:
                continue
            if value is None or value.shape != (n, width):
                got = None if value is None else tuple(value.shape)
                raise ValueError(f"this bank stores {name} of shape [{n}, {width}], got {got}")
            fields[name] = value
        if sizes is None:
            sizes = distributed.gathered_sizes(n, features.device)
        total = 0
        for name, value in fields.items():
            rows = distributed.gather(value, grad=False, sizes=sizes)  # [Σ n_r, ...]
            self._write(getattr(self, name), rows)
            total = rows.shape[0]
        self._ptr = (self._ptr + total) % self.size
        self._filled = min(self.size, self._filled + total)
        # Python scalars: fills, no host-to-device copy and no read.
        self.ptr.fill_(self._ptr)
        self.filled.fill_(self._filled)

    @staticmethod
    def _fill(n: int, device: torch.device) -> Tensor:
        return torch.full((n,), -1, dtype=torch.long, device=device)

    def _write(self, buf: Tensor, rows: Tensor) -> None:
        """Write rows as if one by one from ``ptr`` on; of more than K only the newest K stay.

        At most K rows remain, so they fill slots ``start, start+1, …`` wrapping once: two
        slice copies at most (no index tensor).
        """
        skipped = max(0, rows.shape[0] - self.size)
        rows = rows[skipped:].to(buf.dtype)  # [n ≤ K, ...]
        start = (self._ptr + skipped) % self.size
        head = min(rows.shape[0], self.size - start)  # rows before the wrap
        buf[start : start + head] = rows[:head]
        if head < rows.shape[0]:
            buf[: rows.shape[0] - head] = rows[head:]

    def valid(self) -> dict[str, Tensor]:
        """The filled rows of every field (views; do not modify)."""
        k = len(self)
        return {
            "features": self.features[:k],
            "labels": self.labels[:k],
            "ids": self.ids[:k],
            "captions": self.captions[:k],
            "probs": self.probs[:k],
        }


def cosine_momentum(step: int, total_steps: int, base: float = 0.996, final: float = 1.0) -> float:
    """EMA momentum rising from ``base`` to ``final`` on a half cosine (BYOL; cone.txt Sec. 4).

    ``m(k) = final − (final − base)·(cos(π k / K) + 1) / 2``, clamped at ``final`` for k ≥ K.

    Raises:
        ValueError: total_steps < 1, step < 0, or momenta outside [0, 1].
    """
    if total_steps < 1 or step < 0:
        raise ValueError(f"need total_steps >= 1 and step >= 0, got {total_steps=}, {step=}")
    if not (0.0 <= base <= final <= 1.0):
        raise ValueError(f"need 0 <= base <= final <= 1, got {base=}, {final=}")
    progress = min(step, total_steps) / total_steps
    return final - (final - base) * (math.cos(math.pi * progress) + 1) / 2


class EMA(nn.Module):
    """An exponential-moving-average copy of a model (cone.txt Eq. 8: F_k ← m F_k + (1−m) F_q).

    Parameters are averaged; buffers (BatchNorm statistics) are copied, as in MoCo/BYOL.
    The copy never requires grad and is saved with ``state_dict``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = copy.deepcopy(model)
        self.module.requires_grad_(False)
        self.module.eval()

    def train(self, mode: bool = True) -> EMA:  # the EMA copy always runs in eval mode
        return super().train(False)

    @torch.no_grad()
    def update(self, model: nn.Module, momentum: float) -> None:
        """``ema ← lerp(ema, model, 1 − momentum)`` for every parameter, buffers copied: one
        multi-tensor kernel each (``torch._foreach_*``) instead of one per tensor; the values
        are those of a per-tensor ``lerp_`` / ``copy_`` loop."""
        checks.in_range("EMA momentum", momentum, 0.0, 1.0)
        ema_params = dict(self.module.named_parameters())
        named = list(model.named_parameters())
        if named:
            torch._foreach_lerp_([ema_params[name] for name, _ in named],
                                 [p.detach() for _, p in named], 1.0 - momentum)
        ema_buffers = dict(self.module.named_buffers())
        buffers = list(model.named_buffers())
        if buffers:
            torch._foreach_copy_([ema_buffers[name] for name, _ in buffers],
                                 [b for _, b in buffers])

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return self.module(*args, **kwargs)
