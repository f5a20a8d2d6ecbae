"""simgraph's library (docs/architecture.md has the package map).

Modules that moved into packages stay importable by their old names (:data:`MOVED`): Ray
Tune pickles callbacks and searchers by module path into a sweep dir (``tuner.pkl``,
``searcher-state-*.pkl``), and checkpoints or pickles made before a move must still load. An
old name resolves to the module itself (``components.recipe is components.runs.recipe``),
through a finder consulted only after the real modules were not found."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

MOVED = {
    "components.files": "components.io.files",
    "components.paths": "components.io.paths",
    "components.storage": "components.io.storage",
    "components.session": "components.runtime.session",
    "components.console": "components.runtime.console",
    "components.distributed": "components.runtime.distributed",
    "components.models": "components.models.encoders",
    "components.memory": "components.objectives.memory",
    "components.training": "components.training.step",
    "components.optim": "components.training.optim",
    "components.tracking": "components.training.tracking",
    "components.tune_trackers": "components.training.tune_trackers",
    "components.run_dir": "components.runs.run_dir",
    "components.checkpoint": "components.runs.checkpoint",
    "components.recipe": "components.runs.recipe",
    "components.run_host": "components.runs.hosts",
    "components.export": "components.export.formats",
    "components.embed": "components.export.embed",
    "components.sweep_state": "components.sweep.state",
    "components.confirmation": "components.sweep.confirmation",
    "components.tune_loggers": "components.sweep.tune_loggers",
}
"""Old module name -> where it lives now (the 2026-11-26 package move, issue 41). Three old
names are packages now (``components.models``, ``components.training``,
``components.export``): those import as the packages, whose ``__getattr__``
(:func:`old_module_getattr`) gives what their old module had (``components.models.ConvNet``)."""


def old_module_getattr(package: str, *modules: str) -> Callable[[str], Any]:
    """A package's ``__getattr__`` for what the module ``package`` had before it became a
    package (now in ``package.<module>``, the first of ``modules`` that has the name: a module
    later split in several): old pickles and imports load. Dunders are not forwarded (the
    import system probes them)."""

    def getattr_(name: str) -> Any:
        if not name.startswith("__"):
            for module in modules:
                try:
                    return getattr(importlib.import_module(f"{package}.{module}"), name)
                except AttributeError:
                    pass
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old name of :data:`MOVED` to the module that now lives elsewhere."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        # importlib returns sys.modules[name] after exec_module: the moved module itself
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
