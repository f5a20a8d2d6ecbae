"""Importing FFCV without its import-time numba compile, and without its hold on torch's
thread count.

``ffcv/fields/rgb_image.py`` (FFCV 1.0.2) builds a module-level ``numba.typed.Dict`` of its two
image modes (``{"jpg": 0, "raw": 1}``). Creating and filling a typed dict compiles numba code
in every process that imports FFCV: 2 s on an idle core of this machine, 4–8 s when the cores
are busy (measured 2026-11-24, ``docs/benchmarks.md``). Every Ray Train worker, Tune trial
actor and preprocessing task pays it before doing anything, and it is the largest part of a
sweep's first-trial start-up and of a preprocessing worker's.

The dict is only ever read from Python (``generate_code`` turns the modes into integer
constants before numba compiles the decoders; the writer's ``encode`` looks one up), so a
plain ``dict`` with the same items behaves identically. :func:`install` registers a one-shot
import hook that executes that one module with ``numba.typed.Dict`` bound to ``dict``; nothing
else in FFCV or numba changes. It applies to the FFCV version it was checked against only
(:data:`CHECKED_VERSION`); with any other version FFCV imports untouched.
``tests/data/test_units.py`` checks the resulting dict and that images still decode.

Threads: FFCV's ``Compiler.set_num_threads(n)`` sets numba's threads (thread-local) *and*
``torch.set_num_threads(n)``, which is process-wide. FFCV calls it with 1 when
``ffcv.pipeline.compiler`` is imported, with ``num_workers`` in every ``Loader.__init__`` /
``__iter__`` and again from each epoch's pipeline thread — so a worker's training step, its
online kNN and ``simgraph evaluate`` / ``embed`` ran on ``data.num_workers`` torch threads
(whenever the pipeline thread last started), not on the CPUs they were given. The same hook
(:data:`THREADS_MODULE`) keeps the caller's torch count across the compiler's import and
replaces ``set_num_threads`` with FFCV's own minus the torch call: numba's thread count and
the ``parallel`` compile flag are untouched (``tests/data/test_units.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE = "ffcv.fields.rgb_image"
THREADS_MODULE = "ffcv.pipeline.compiler"
CHECKED_VERSION = "1.0.2"


class _PlainDictLoader(importlib.abc.Loader):
    """Executes the wrapped loader's module with ``numba.typed.Dict`` replaced by ``dict``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        import numba.typed

        typed_dict = numba.typed.Dict
        numba.typed.Dict = dict  # type: ignore[misc]
        try:
            self.inner.exec_module(module)
        finally:
            numba.typed.Dict = typed_dict  # type: ignore[misc]


class _KeepTorchThreadsLoader(_PlainDictLoader):
    """Executes ``ffcv.pipeline.compiler`` keeping torch's thread count, then makes
    ``Compiler.set_num_threads`` leave torch's alone."""

    def exec_module(self, module: ModuleType) -> None:
        import torch

        threads = torch.get_num_threads()
        try:
            self.inner.exec_module(module)
        finally:
            torch.set_num_threads(threads)
        module.Compiler.set_num_threads = classmethod(_numba_threads_only)


def _numba_threads_only(cls: Any, n: int) -> None:
    """FFCV 1.0.2's ``Compiler.set_num_threads`` without ``torch.set_num_threads``."""
    import multiprocessing

    import numba

    if n < 1:
        n = multiprocessing.cpu_count()
    cls.num_threads = n
    numba.set_num_threads(n)


_LOADERS = {MODULE: _PlainDictLoader, THREADS_MODULE: _KeepTorchThreadsLoader}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        wrap = _LOADERS.get(name)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = wrap(spec.loader)
        return spec


def install() -> bool:
    """Register the hook (idempotent) unless FFCV is already imported or is not the checked
    version; returns whether the next import of FFCV will use it."""
    if MODULE in sys.modules or THREADS_MODULE in sys.modules:
        return False
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    try:
        version = importlib.metadata.version("ffcv")
    except importlib.metadata.PackageNotFoundError:
        return False
    if version != CHECKED_VERSION:
        return False
    sys.meta_path.insert(0, _Finder())
    return True
