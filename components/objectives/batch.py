"""The batch contract: what every objective receives (:class:`ContrastiveBatch`) and returns
(:data:`Metrics`), the batch's input checks and when they are read (:class:`hot_path`), and an
objective's own checks read with them (:class:`DeferredCheck`).

Host synchronisation: every device-to-host read (``.item()``, ``bool(t)``, ``.tolist()``)
makes the host wait for the device. Every objective's step reads once: the global loss
statistics (:func:`components.objectives.global_means.fused_global_means`), which also carry
the batch's input checks (finite
values, labels ≥ 0) when the batch was built inside :func:`hot_path` (training's step), and
the objective's own input checks (:class:`DeferredCheck`: labels < C, labels inside a class
graph); outside :func:`hot_path` a :class:`ContrastiveBatch` checks itself when built (one
read). Until the read, inputs that would index out of bounds are clamped (a failed check
still raises, after the read, before anything is stored). Inside
:func:`hot_path` every rank's batch may also be declared equally large, so the gathers skip
their size exchange (:attr:`ContrastiveBatch.rank_sizes`); otherwise the sizes are exchanged
once per step, not once per gather.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from components.errors import NonFiniteError
from components.runtime import distributed

Metrics = dict[str, float]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _raise_non_finite(name: str, x: Tensor) -> None:
    """Count ``x``'s non-finite values (a second read, on the failure path only) and raise."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:  # a sum (or min/max in a narrower dtype) can overflow although x is finite
        raise NonFiniteError(f"{name} has {bad} non-finite value(s) (NaN or inf); fix the "
                             "model/input")


# The float fields a batch checks for NaN / inf, in the order the errors are reported.
_FLOAT_FIELDS = ("z", "captions", "logits", "ema_z", "ema_logits")


@dataclasses.dataclass(frozen=True)
class _StepHints:
    defer_checks: bool = False
    equal_batches: bool = False


_HINTS: contextvars.ContextVar[_StepHints | None] = contextvars.ContextVar(
    "simgraph_step_hints", default=None)  # None: outside hot_path
_HOT = {eq: _StepHints(defer_checks=True, equal_batches=eq) for eq in (False, True)}


class hot_path(contextlib.AbstractContextManager[None]):  # noqa: N801 (used as a function)
    """``with hot_path(equal_batches=False):`` the training step's context: inside it a
    :class:`ContrastiveBatch` defers its input checks into the objective's one device-to-host
    read (the loss statistics, read anyway) instead of reading them back itself, and with
    ``equal_batches`` it records every rank's batch as this rank's size
    (:attr:`ContrastiveBatch.rank_sizes`), so gathers exchange no sizes. Declare
    ``equal_batches`` only when every rank's batch has the same number of samples (the
    training loader's ``drop_last``): gathers with wrong sizes fail or hang.

    A batch built here must reach an objective: its checks run there (and raise there).

    (A class, not a ``contextlib.contextmanager`` generator: it is entered every step, where
    the generator's machinery costs as much as a few of a small batch's kernels.)
    """

    __slots__ = ("_hints", "_token")

    def __init__(self, equal_batches: bool = False) -> None:
        self._hints = _HOT[bool(equal_batches)]

    def __enter__(self) -> None:
        self._token = _HINTS.set(self._hints)

    def __exit__(self, *exc: object) -> None:
        _HINTS.reset(self._token)


class _PendingChecks(NamedTuple):
    """A batch's input checks, computed on the device, not yet read: ``values`` holds the sum
    of each field in ``names`` (NaN / ±inf propagate into it), then the smallest label if
    ``labels``."""

    names: tuple[str, ...]
    labels: bool
    values: Tensor  # [len(names) + labels] in the fields' float type, on z's device


@dataclasses.dataclass(kw_only=True)
class ContrastiveBatch:
    """What every objective receives: this rank's part of the batch.

    Attributes:
        z: [B, V, D] projector outputs for V ≥ 1 views of B samples (any float dtype; they are
            L2-normalised in float32 inside the objective).
        labels: [B] int64 class ids ≥ 0, for supervised losses.
        sample_ids: [B] int64 dataset-wide sample ids. Needed to recognise the same image in a
            memory bank; without them the batch position is used and bank rows never match.
        captions: [B, E] caption embeddings (X-CLR per-sample graph, CLIP).
        logits: [B, V, C] classifier logits of the online model (CoNe, CE).
        ema_z: [B, V, D] EMA-encoder projector outputs ("keys"): fill the memory bank.
        ema_logits: [B, V, C] EMA classifier logits (CoNe's Q_p).
        rank_sizes: (not an argument) every rank's B in rank order when known, so the
            gathers skip their size exchange: ``(B,) × W`` for a batch built inside
            ``hot_path(equal_batches=True)``, else None.

    Values are checked (labels ≥ 0, finite floats) with one device read when the batch is
    built, or, inside :func:`hot_path`, in the objective's one read of its loss statistics
    (:meth:`check` reads them now).

    Raises:
        ValueError: wrong ranks/shapes/dtypes, mismatched B or V, negative labels;
            NonFiniteError (a ValueError): non-finite values.
    """

    z: Tensor
    labels: Tensor | None = None
    sample_ids: Tensor | None = None
    captions: Tensor | None = None
    logits: Tensor | None = None
    ema_z: Tensor | None = None
    ema_logits: Tensor | None = None
    rank_sizes: tuple[int, ...] | None = dataclasses.field(default=None, init=False)
    _pending: _PendingChecks | None = dataclasses.field(default=None, init=False, repr=False,
                                                        compare=False)

    def __post_init__(self) -> None:
        z = self.z
        _check(isinstance(z, Tensor), f"z must be a torch.Tensor, got {type(z).__name__}")
        _check(
            z.ndim == 3 and z.is_floating_point(),
            f"z must be a float tensor [batch, views, dim], got {z.dtype} {tuple(z.shape)}",
        )
        b, v, _ = z.shape
        for name in ("labels", "sample_ids"):
            t = getattr(self, name)
            if t is not None:
                _check(
                    t.shape == (b,) and not t.is_floating_point() and t.dtype != torch.bool,
                    f"{name} must be an integer tensor of shape [{b}], "
                    f"got {t.dtype} {tuple(t.shape)}",
                )
        if self.captions is not None:
            c = self.captions
            _check(
                c.ndim == 2 and c.shape[0] == b and c.is_floating_point(),
                f"captions must be a float tensor [{b}, E], got {c.dtype} {tuple(c.shape)}",
            )
        if self.ema_z is not None:
            _check(
                self.ema_z.shape == z.shape,
                f"ema_z must match z's shape {tuple(z.shape)}, got {tuple(self.ema_z.shape)}",
            )
        for name in ("logits", "ema_logits"):
            t = getattr(self, name)
            if t is not None:
                _check(
                    t.ndim == 3 and t.shape[:2] == (b, v) and t.is_floating_point(),
                    f"{name} must be a float tensor [{b}, {v}, classes], got {tuple(t.shape)}",
                )
        if self.logits is not None and self.ema_logits is not None:
            _check(
                self.logits.shape == self.ema_logits.shape,
                f"ema_logits {tuple(self.ema_logits.shape)} must match logits "
                f"{tuple(self.logits.shape)}",
            )
        hints = _HINTS.get() or _StepHints()
        if hints.equal_batches:
            self.rank_sizes = (b,) * distributed.world_size()
        self._pending = self._device_checks()
        if not hints.defer_checks:
            self.check()

    @property
    def views(self) -> int:
        return self.z.shape[1]

    def _device_checks(self) -> _PendingChecks | None:
        """Each float field's sum and the smallest label in one vector on the device (a few
        small kernels; nothing is read back here). A sum is NaN or ±inf if any value is (it
        can also overflow with finite values: the failure path counts, and raises only for
        real NaN / inf)."""
        names = tuple(n for n in _FLOAT_FIELDS if (t := getattr(self, n)) is not None
                      and t.is_floating_point() and t.numel())
        # 0-dim each; float16 summed in float32: a sum of finite halves cannot overflow, so a
        # non-finite sum means a NaN / inf in the field (what fused_global_means tells every
        # rank, which must all decide alike)
        parts = [t.sum(dtype=torch.float32) if (t := getattr(self, n).detach()).dtype
                 == torch.float16 else t.sum() for n in names]
        labels = self.labels is not None and self.labels.numel() > 0
        if labels:
            assert self.labels is not None
            least = self.labels.min()  # its sign survives any float type stack promotes to
            parts.append(least if least.device == self.z.device else least.to(self.z.device))
        # one stack, in the fields' promoted float type (read later as Python floats)
        return _PendingChecks(names, labels, torch.stack(parts)) if parts else None

    def take_checks(self) -> _PendingChecks | None:
        """The input checks not yet read (None if there are none), handed over: the caller
        reads ``values`` with its own device read and passes them to :meth:`raise_failed`."""
        pending, self._pending = self._pending, None
        return pending

    def raise_failed(self, checks: _PendingChecks, values: Sequence[float]) -> None:
        """Raise for the first failed check, given ``checks.values`` read back as floats.

        Raises:
            ValueError: a label < 0. NonFiniteError: a field holds NaN or inf (the message
                counts them, which reads that field once more).
        """
        if checks.labels and not values[-1] >= 0:
            raise ValueError("labels must be >= 0 class ids")
        for name, total in zip(checks.names, values, strict=False):  # labels' last, if any
            if not math.isfinite(total):
                _raise_non_finite(name, getattr(self, name))

    def check(self) -> None:
        """Read and apply the input checks still pending (one device read; none if none).

        Raises:
            as :meth:`raise_failed`.
        """
        pending = self.take_checks()
        if pending is not None:
            self.raise_failed(pending, pending.values.tolist())

    def sizes_per_rank(self) -> list[int]:
        """Every rank's B in rank order: :attr:`rank_sizes`, or exchanged now (one all-gather
        and device read when distributed; ``[B]`` for free otherwise)."""
        if self.rank_sizes is not None:
            return list(self.rank_sizes)
        return distributed.gathered_sizes(self.z.shape[0], self.z.device)



class DeferredCheck(NamedTuple):
    """An objective's own input check, computed on the device and read back with the loss
    statistics (:func:`fused_global_means`) instead of in a read of its own.

    ``values``: a few numbers on the device (read as floats: keep them exact there, e.g.
    0/1 flags). ``raise_failed(values)``: given them read back, raise the check's error if
    it failed (it may read the inputs again to word the message: the failure path only).
    Until then the objective must not let a failing input do harm (e.g. clamp labels it
    indexes with: an out-of-range index is a device-side assert on CUDA).
    """

    values: Tensor
    raise_failed: Callable[[Sequence[float]], None]

    def apply(self) -> None:
        """Read the values now (one device read) and raise if the check failed."""
        self.raise_failed(self.values.reshape(-1).tolist())
