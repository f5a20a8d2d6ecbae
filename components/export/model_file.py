"""``model.py``: the plain modules, written beside safetensors weights and used for every
format (``simgraph export``).

Its text is :data:`MODEL_MODULE` (``standalone_model.py``, a real module of this package that
imports nothing of simgraph) with the run's name and constants baked in
(:func:`model_source`); the TorchScript and ONNX files are made from that same text, imported
(:func:`imported_source`), with the weights loaded into its modules (:func:`plain_module`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import Tensor, nn

from components.config import AugmentConfig
from components.export.architecture import Architecture
from components.export.formats import BACKBONE_FILE, MODEL_PY, PROJECTOR_FILE, ExportError

# ``model.py``: a real module of this package, exported as text with the run's constants.
MODEL_MODULE = Path(__file__).with_name("standalone_model.py")
# The lines of its constants block that an export replaces: NAME = value  [# comment]
_CONSTANT = re.compile(r"^([A-Z_]+) = [^#\n]*?(\s*#[^\n]*)?$", re.M)


def _model_template() -> str:
    return MODEL_MODULE.read_text(encoding="utf-8")


def model_source(arch: Architecture, augment: AugmentConfig, run: str) -> str:
    """``model.py``'s text for ``arch``: :data:`MODEL_MODULE` with the run's name and its
    constants (architecture, resolution, normalisation, file names) baked in.

    Raises:
        ExportError: the module lacks a constant an export sets (a broken edit of it).
    """
    values: dict[str, Any] = {k.upper(): v for k, v in dataclasses.asdict(arch).items()}
    values.update(RESOLUTION=augment.resolution, MEAN=[float(m) for m in augment.mean],
                  STD=[float(v) for v in augment.std], BACKBONE_FILE=BACKBONE_FILE,
                  PROJECTOR_FILE=PROJECTOR_FILE)
    text = _model_template()
    # The docstring (with the run's name), then the code; the note to maintainers between
    # them stays here.
    head = text.partition("# This file is `simgraph export`'s model.py")[0]
    body = text[text.index("\nimport os") + 1:]
    head = head.replace("RUN", run, 1).replace("RESOLUTION, RESOLUTION",
                                                f"{augment.resolution}, {augment.resolution}")
    seen: set[str] = set()

    def constant(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            return m.group(0)
        seen.add(name)
        return f"{name} = {values[name]!r}{m.group(2) or ''}"

    body = _CONSTANT.sub(constant, body)
    if seen != set(values):
        raise ExportError(f"{MODEL_MODULE} lacks the constants {sorted(set(values) - seen)}")
    return head.rstrip("\n") + "\n\n" + body


@contextlib.contextmanager
def imported_source(source: str) -> Iterator[ModuleType]:
    """``source`` imported as a module from a temporary file (TorchScript reads the source
    of what it compiles), removed from ``sys.modules`` afterwards."""
    name = "simgraph_export_" + hashlib.sha256(source.encode()).hexdigest()[:12]
    with tempfile.TemporaryDirectory(prefix="simgraph-export-") as tmp:
        path = Path(tmp) / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
            yield module
        finally:
            sys.modules.pop(name, None)


def plain_module(mod: ModuleType, backbone_sd: dict[str, Tensor],
                 projector_sd: dict[str, Tensor] | None) -> nn.Module:
    """``model.py``'s backbone (or ``WithProjector``) with the weights loaded strictly, in eval
    mode.

    Raises:
        ExportError: the state dicts do not fit ``model.py``'s modules (a bug: they should).
    """
    try:
        backbone = mod.build()
        backbone.load_state_dict(backbone_sd, strict=True)
        if projector_sd is None:
            return backbone.eval()
        proj = mod.build_projector()
        proj.load_state_dict(projector_sd, strict=True)
        return mod.WithProjector(backbone, proj).eval()
    except RuntimeError as e:
        raise ExportError(f"the weights do not load into {MODEL_PY}'s modules: {e}") from None
