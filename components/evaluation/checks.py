"""Input validation shared by the evaluation metrics (:mod:`.knn`, :mod:`.probe`, :mod:`.graph`).

Every check raises :class:`ValueError` with a message that names the offending argument and
says what is allowed; the callers pass the argument names (and, where the reason differs per
metric, the hint appended to the message), so the messages stay those of the calling metric.
"""

from __future__ import annotations

import torch
from torch import Tensor

from components import checks
from components.errors import NonFiniteError

__all__ = [
    "as_float",
    "as_int",
    "at_least_one",
    "check_features",
    "check_label_tensor",
    "check_labels",
    "check_same_device",
    "check_same_width",
]


def _shape(x: object) -> object:
    """``x``'s shape as a tuple if it is a tensor, else its type name (for messages)."""
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


# Scalars: components.checks (re-exported under the names the metrics use).
as_int = checks.as_int
as_float = checks.as_float


def at_least_one(name: str, value: object) -> int:
    """``value`` as a Python int ≥ 1 (:func:`as_int`, then the bound).

    Raises:
        ValueError: as :func:`as_int`, and ``value < 1``.
    """
    return checks.at_least(name, value, 1)


def check_features(
    name: str, x: object, *, require_columns: bool = False, empty_reason: str | None = None
) -> Tensor:
    """Check that ``x`` is a finite, floating-point, 2-D ``[rows, D]`` tensor; return it.

    Args:
        name: the argument's name, for the messages.
        x: the value to check.
        require_columns: also refuse D == 0.
        empty_reason: if given, also refuse 0 rows, with the message
            ``"{name} has 0 rows; {empty_reason}"``; if None, 0 rows are allowed.

    Returns:
        ``x`` itself (unchanged), typed as a tensor.

    Raises:
        ValueError: not a 2-D tensor, not floating point, D == 0 (``require_columns``),
            no rows (``empty_reason``), or any NaN/±inf (the count is named).
    """
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"{name} has shape {_shape(x)}; expected a 2-D [rows, D] tensor")
    if not x.is_floating_point():
        raise ValueError(f"{name} has dtype {x.dtype}; expected a floating-point tensor")
    if require_columns and x.shape[1] == 0:
        raise ValueError(f"{name} has D=0 feature dimensions; expected D ≥ 1")
    if empty_reason is not None and x.shape[0] == 0:
        raise ValueError(f"{name} has 0 rows; {empty_reason}")
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise NonFiniteError(f"{name} has {bad} non-finite value(s) (NaN or inf); all must be "
                             "finite")
    return x


def check_same_width(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Refuse two 2-D feature tensors whose feature dimensions D differ.

    Raises:
        ValueError: ``x.shape[1] != ref.shape[1]`` (both D values are named).
    """
    if x.shape[1] != ref.shape[1]:
        raise ValueError(
            f"{name} has D={x.shape[1]} but {ref_name} has D={ref.shape[1]}; they must match"
        )


def check_same_device(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Refuse two tensors on different devices.

    Raises:
        ValueError: ``x.device != ref.device`` (both devices are named).
    """
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but {ref_name} on {ref.device}; put both on the same device"
        )


def check_label_tensor(name: str, labels: object, rows: int | None = None) -> Tensor:
    """Check that ``labels`` is a 1-D integer tensor (of ``rows`` entries if given); return it.

    Values are not checked (see :func:`check_labels`).

    Raises:
        ValueError: not a 1-D tensor (with ``rows``: not ``[rows]``), or a bool, floating or
            complex dtype.
    """
    if (
        not isinstance(labels, Tensor)
        or labels.dim() != 1
        or (rows is not None and labels.shape[0] != rows)
    ):
        expected = "a 1-D [N] tensor" if rows is None else f"[{rows}] (one label per row)"
        raise ValueError(f"{name} has shape {_shape(labels)}; expected {expected}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{name} has dtype {labels.dtype}; expected an integer (int64) tensor")
    return labels


def check_labels(
    name: str,
    labels: object,
    rows: int,
    num_classes: int | None,
    *,
    hint: str,
    device: torch.device | None = None,
) -> Tensor:
    """Check ``[rows]`` integer class ids: in ``[0, num_classes)``, or ≥ 0 if it is None.

    Args:
        name: the argument's name, for the messages.
        labels: the value to check (:func:`check_label_tensor` with ``rows``).
        rows: the number of labels required (one per feature row).
        num_classes: C, the exclusive upper bound of the labels; None checks only ≥ 0.
        hint: appended to the message of out-of-range labels, after ``"; "`` (it should say
            what to do with unlabelled ``-1`` rows, which every caller refuses).
        device: if given, the labels are converted to int64 on ``device`` (before the value
            check) and that copy is returned; if None, ``labels`` is returned as given.

    Returns:
        The labels, as given or (``device``) as an int64 tensor on ``device``.

    Raises:
        ValueError: as :func:`check_label_tensor`, and labels outside the allowed range
            (their count and the first of them are named).
    """
    out = check_label_tensor(name, labels, rows)
    if device is not None:
        out = out.to(device=device, dtype=torch.int64)
    if num_classes is None:
        bad = out < 0
        what = "negative label(s)"
    else:
        bad = (out < 0) | (out >= num_classes)
        what = f"label(s) outside [0, num_classes={num_classes})"
    n_bad = int(bad.sum())
    if n_bad:
        raise ValueError(f"{name} has {n_bad} {what} (e.g. {int(out[bad][0])}); {hint}")
    return out
