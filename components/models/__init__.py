"""Encoders: the small-image ConvNet and torchvision backbones (`encoders.py`)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``components.models.X`` for what the module ``components.models`` had before it became
    a package (the encoders, now ``components.models.encoders``):
    old pickles and imports load."""
    import importlib

    if not name.startswith("__"):  # not a dunder the import system probes
        try:
            return getattr(importlib.import_module("components.models.encoders"), name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'components.models' has no attribute {name!r}")
