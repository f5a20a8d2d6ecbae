"""A trained encoder as files: the export formats, and embeddings of images."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``components.export.X`` for what the module ``components.export`` had before it became
    a package (the export formats, now ``components.export.formats``):
    old pickles and imports load."""
    import importlib

    if not name.startswith("__"):  # not a dunder the import system probes
        try:
            return getattr(importlib.import_module("components.export.formats"), name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'components.export' has no attribute {name!r}")
