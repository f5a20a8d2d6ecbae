"""A GPU's device rules, enforced on CPU: host tensors are told apart from device tensors.

On a GPU run every tensor lives on the worker's device or on the host, and two rules bite:
NCCL refuses host tensors in a collective ("No backend type associated with device type
cpu"), and an op refuses to mix a device tensor with a host tensor of one or more dimensions
("Expected all tensors to be on the same device"; 0-dim host tensors pass as scalars). On a
CPU run both kinds are CPU tensors, so neither rule can fail and CI cannot see the defect.

:class:`StrictDevice` tracks, per tensor, whether it *would* be on the host on a GPU run:

* host: made by a factory (``torch.tensor``, ``zeros``, ``arange``, ``rand``, … and
  ``torch.from_numpy``) without a ``device=`` or with a host tensor's ``.device`` (the mode
  hands out a device object of its own for those) or the string ``"cpu"``, by ``.cpu()`` or
  ``.to()`` to such a device, or by an op whose tensor inputs are all host tensors;
* device: everything else — tensors that existed before the mode was entered (model
  parameters, buffers, the reader's mean/std), the reader's batches (FFCV's thread, outside the
  thread-local mode: on a GPU they come after ``ToDevice``), factories given a ``device=``,
  ``.to(device)`` / ``.cuda()``, and ops on at least one device tensor.

Inside the mode, an op that mixes a device tensor with a host tensor of >= 1 dimension
raises, and every ``torch.distributed`` collective refuses a host tensor, like NCCL.
Indexing (``x[idx]``, ``x[idx] = v``) and ``copy_`` may cross, as on CUDA. A
``torch.device("cpu")`` built by the code itself cannot be told from the run's device on CPU
and counts as the device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

HOST = "_strict_device_on_host"

_FACTORIES = {
    torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full,
    torch.arange, torch.linspace, torch.logspace, torch.rand, torch.randn, torch.randint,
    torch.randperm, torch.eye, torch.scalar_tensor, torch.empty_strided, torch.tril_indices,
    torch.triu_indices,
}
# Ops that may take a host operand on a device tensor (indexing, copies across devices).
_CROSSING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_,
             torch.Tensor.index_put_, torch.Tensor.index_put}
_DEVICE_ATTR = torch._C.TensorBase.device
_TO_DEVICE = {torch.Tensor.to, torch.Tensor.cuda}
# Every collective components/ calls must be here (tests/runtime/test_collectives_covered.py
# checks);
# one this torch lacks (all_gather_single before 2.12) is skipped.
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "all_gather_object", "broadcast", "broadcast_object_list", "reduce",
                "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                "gather", "scatter", "barrier")


class DeviceRuleError(RuntimeError):
    """What a GPU run would have raised at this point."""


def on_host(t: torch.Tensor) -> bool:
    return bool(getattr(t, HOST, False))


def _mark(out: Any, host: bool) -> Any:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            if host:
                setattr(t, HOST, True)
            elif on_host(t):
                delattr(t, HOST)
    return out


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


class StrictDevice(TorchFunctionMode):
    """Enter around the code to check (see the module docstring). ``collectives``: how many
    collective calls were checked (a test asserts some were)."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives = 0
        self._host_devices: dict[int, torch.device] = {}  # kept alive: their ids stay unique
        self._stack = contextlib.ExitStack()

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(func, "__self__", None) is _DEVICE_ATTR:  # t.device
            if not on_host(args[0]):
                return out
            # A new device object that names the host: a tensor made with device=x.device of
            # a host tensor is a host tensor (on CPU the two devices compare equal).
            host_device = torch.device(out.type)
            self._host_devices[id(host_device)] = host_device
            return host_device
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func in _FACTORIES or func is torch.from_numpy:
            given = tensors[0] if func is torch.as_tensor and tensors else None
            host = on_host(given) if given is not None else self._names_host(
                kwargs.get("device"), absent=True)
            return _mark(out, host)
        if func is torch.Tensor.cpu:
            return _mark(out.view_as(out) if out is args[0] else out, True)
        if func in _TO_DEVICE:
            places = [kwargs["device"]] if "device" in kwargs else [
                a for a in args[1:] if isinstance(a, torch.device | str | torch.Tensor)]
            if func is torch.Tensor.cuda or not places:
                host = func is not torch.Tensor.cuda and on_host(args[0])
            elif isinstance(places[0], torch.Tensor):
                host = on_host(places[0])
            else:
                host = self._names_host(places[0], absent=False)
            if out is args[0] and host != on_host(out):
                out = out.view_as(out)  # a no-op move on CPU: a new object for the new place
            return _mark(out, host)
        if func in _CROSSING:
            return out if func in (torch.Tensor.__setitem__, torch.Tensor.copy_,
                                   torch.Tensor.index_put_) else _mark(out, on_host(args[0]))
        if not tensors:
            return out
        hosts = [t for t in tensors if on_host(t)]
        if hosts and len(hosts) < len(tensors):
            big = [t for t in hosts if t.dim() > 0]
            if big:
                name = getattr(func, "__qualname__", repr(func))
                raise DeviceRuleError(
                    f"{name}: a host tensor {_describe(big[0])} meets a device tensor; on a GPU "
                    "run: 'Expected all tensors to be on the same device'")
            return _mark(out, False)
        return _mark(out, bool(hosts))

    def _names_host(self, device: Any, absent: bool) -> bool:
        """Whether a ``device=`` argument names the host: a host tensor's ``.device``, the
        string ``"cpu"``, or (``absent``) no device at all."""
        if device is None:
            return absent
        return id(device) in self._host_devices or (isinstance(device, str)
                                                    and device.startswith("cpu"))

    def _check(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def checked(*args: Any, **kwargs: Any) -> Any:
            self.collectives += 1
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and on_host(t):
                    raise DeviceRuleError(
                        f"torch.distributed.{name} got a host tensor {_describe(t)}; NCCL "
                        "refuses it: 'No backend type associated with device type cpu'")
            return fn(*args, **kwargs)

        return checked

    def __enter__(self) -> StrictDevice:
        from unittest import mock

        for name in _COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._stack.enter_context(mock.patch.object(dist, name, self._check(name, fn)))
        from_numpy, me = torch.from_numpy, threading.get_ident()

        def tagged_from_numpy(a: Any) -> torch.Tensor:  # not a torch function: no mode call
            # A patch of the module is seen by every thread; the mode is this thread's only.
            return _mark(from_numpy(a), threading.get_ident() == me)  # type: ignore[no-any-return]

        self._stack.enter_context(mock.patch.object(torch, "from_numpy", tagged_from_numpy))
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._stack.close()


@contextlib.contextmanager
def strict_device() -> Iterator[StrictDevice]:
    with StrictDevice() as mode:
        yield mode
