"""Importing FFCV without its import-time numba compile.

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
``tests/test_data_units.py`` checks the resulting dict and that images still decode.
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


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PlainDictLoader(spec.loader)
        return spec


def install() -> bool:
    """Register the hook (idempotent) unless FFCV is already imported or is not the checked
    version; returns whether the next import of FFCV will use it."""
    if MODULE in sys.modules:
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
