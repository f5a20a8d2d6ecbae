"""Training a model: the step, optimisers and schedules, experiment trackers."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``components.training.X`` for what the module ``components.training`` had before it became
    a package (the pretraining step, now ``components.training.step``):
    old pickles and imports load."""
    import importlib

    if not name.startswith("__"):  # not a dunder the import system probes
        try:
            return getattr(importlib.import_module("components.training.step"), name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'components.training' has no attribute {name!r}")
