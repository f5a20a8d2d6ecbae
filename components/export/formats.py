"""A trained encoder as files that load without simgraph (``simgraph export``).

What a run's checkpoint holds (``state["model"]``: the ``PretrainModel``'s state dict —
encoder, projector, classifier head, objective with its memory bank) becomes plain-torch
weights for the **backbone** (and, on request, the **projector**), in one of three formats:

* ``safetensors`` (default): ``model.safetensors`` with the backbone's state dict under the
  names plain modules use — torchvision's own keys for the ResNets (``conv1.weight``,
  ``layer1.0.bn1.running_mean``, …; no ``fc``: it is an ``nn.Identity``), ``features.<i>.*``
  for the ConvNet — and ``projector.safetensors`` (``--projector``) with the keys of an
  ``nn.Sequential`` (``0.weight``, ``1.running_mean``, …). Beside them ``model.py``: one
  self-contained file (torch; torchvision for the ResNets, timm for a timm backbone) whose
  ``build()`` / ``build_projector()`` make modules those state dicts load into with
  ``strict=True``.
  A timm backbone (``timm/<name>``): ``model.safetensors`` holds exactly the state dict of
  timm's own ``timm.create_model(<name>, num_classes=0[, img_size=R])`` (the encoder holds the
  timm module itself, so its keys need no prefix stripped; ``img_size`` for a ViT-like model,
  whose position embeddings were built for the run's resolution R), so timm loads it with
  ``timm.create_model(<name>, pretrained=True, num_classes=0[, img_size=R],
  pretrained_cfg_overlay=dict(file=..., num_classes=0))`` (:func:`timm_load_kwargs`:
  ``num_classes=0`` in the overlay too keeps timm's loader strict — it drops strictness when
  the model's classes differ from its registry's; at the built size a ViT's filter leaves the
  position embeddings as they are). ``config.json`` then carries timm's ``save_for_hf``
  layout at its top level (``architecture`` = the timm name, ``num_classes``,
  ``num_features``, ``model_args``, ``pretrained_cfg`` with the run's input size, mean, std,
  crop and interpolation), so ``timm.create_model("local-dir:<dir>", pretrained=True)``
  loads the dir too; simgraph's own description moves to ``simgraph_architecture``
  (:func:`components.export.export_dir.timm_section`). ``model.py``'s ``build()`` calls timm.
  TorchScript and ONNX files of a timm backbone are written from the run's own timm modules.
* ``torchscript``: ``model.ts`` (``torch.jit.script``), loads with ``torch.jit.load``.
* ``onnx``: ``model.onnx`` (opset :data:`ONNX_OPSET`), input ``images`` ``[N, 3, R, R]`` with
  a dynamic batch axis.

The backbone's output is named ``features`` ``[N, F]``; with the projector the TorchScript
and ONNX models return ``(features, projection [N, D])``. The modules behind every format are
the ones ``model.py`` defines (:data:`components.export.model_file.MODEL_MODULE`), imported
from that text, so the file a user reads is the code the TorchScript and ONNX files were made
from. Every export is checked before it is described: the written file, loaded the way the
card says, must reproduce the simgraph encoder's output on a fixed input
(:func:`check_export`; a timm backbone's safetensors through ``timm.create_model`` as above).

``config.json`` (:data:`CONFIG`, format :data:`FORMAT`) and ``model_card.md`` (:data:`CARD`)
describe the files: architecture, input (resolution, RGB, NCHW float32, normalisation mean /
std as the evaluation reader applies them), outputs, and what the pipeline adds (loss, dataset,
classes, metrics, provenance). Every file is written atomically (:mod:`components.io.files`).

This module owns the format constants and file names, the errors, the writer of each format
and the check of what was written. The rest of the package: ``architecture.py`` (what builds
the modules; a checkpoint as plain state dicts), ``model_file.py`` (``model.py``'s text and
its modules), ``card.py`` (``model_card.md``), ``export_dir.py`` (the whole export into one
dir: ``config.json``, and which files of a dir an export may replace), ``run_export.py`` (a run
dir's export: what ``simgraph export`` adds), ``embed.py`` (embeddings of images),
``run_embed.py`` (a run's embeddings: ``simgraph embed``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from components.config.backbones import is_timm, timm_name
from components.errors import SimgraphError
from components.io.files import replacing
from components.models.encoders import Encoder

FORMAT = "simgraph-export/1"
FORMATS = ("safetensors", "torchscript", "onnx")
CONFIG, CARD, MODEL_PY = "config.json", "model_card.md", "model.py"
BACKBONE_FILE, PROJECTOR_FILE = "model.safetensors", "projector.safetensors"
TORCHSCRIPT_FILE, ONNX_FILE = "model.ts", "model.onnx"
# Every file an export may write: a new export into the same dir removes those of them the
# earlier export wrote (its config.json records them with their sha256) and this one does not,
# so the dir always describes one export; a file of these names it did not write is refused
# (:func:`components.export.export_dir.claim_export_dir`), never replaced or deleted.
EXPORT_FILES = (BACKBONE_FILE, PROJECTOR_FILE, MODEL_PY, TORCHSCRIPT_FILE, ONNX_FILE,
                CONFIG, CARD)
ONNX_OPSET = 17
INPUT, FEATURES, PROJECTION = "images", "features", "projection"
# How far a written file's outputs may be from the simgraph encoder's (max |difference|,
# relative to the largest |output|, floored at 1): float32 re-runs of the same ops; ONNX
# Runtime's own kernels (other summation orders) get more room.
CHECK_TOLERANCE = {"safetensors": 1e-5, "torchscript": 1e-5, "onnx": 1e-4}


class ExportError(SimgraphError, RuntimeError):
    """A run cannot be exported; the message says why and what to do."""


class UnknownFormat(SimgraphError, ValueError):
    """``--format`` names no export format (exit 2, as a bad argument)."""

    exit_code = 2


def timm_load_kwargs(img_size: int | None, file: str) -> dict[str, Any]:
    """``timm.create_model(<name>, **kwargs)``'s arguments that load a timm backbone's
    ``model.safetensors`` (``file``), as the card prints them and the check runs them: the
    run's build (``num_classes=0``: no classifier, global pooling; ``img_size`` for a ViT-like
    one) with the weights from ``file``. ``num_classes=0`` in the overlay matches the
    ``pretrained_cfg``'s classes to the model's, so timm's loader stays strict (it drops
    strictness and the classifier keys when they differ) — a key that does not fit fails."""
    return {"pretrained": True, "num_classes": 0,
            **({} if img_size is None else {"img_size": img_size}),
            "pretrained_cfg_overlay": {"file": file, "num_classes": 0}}


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`FORMATS`.

    Raises:
        UnknownFormat: it is not.
    """
    if fmt not in FORMATS:
        raise UnknownFormat(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


# ---------------------------------------------------------------------------------------------
# Writing each format.


def write_safetensors(out: Path, backbone_sd: dict[str, Tensor],
                      projector_sd: dict[str, Tensor] | None,
                      metadata: dict[str, str]) -> list[str]:
    """``model.safetensors`` (+ ``projector.safetensors``); returns the file names."""
    from safetensors.torch import save_file

    files = [(BACKBONE_FILE, backbone_sd, "backbone")]
    if projector_sd is not None:
        files.append((PROJECTOR_FILE, projector_sd, "projector"))
    for name, sd, part in files:
        with replacing(out / name) as tmp:
            save_file(sd, str(tmp), metadata={"format": "pt", "simgraph_export": FORMAT,
                                              "part": part, **metadata})
    return [name for name, _, _ in files]


def write_torchscript(out: Path, module: nn.Module) -> list[str]:
    """``model.ts``: ``torch.jit.script`` of the plain module (eval mode)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notices
        scripted = torch.jit.script(module.eval())
        with replacing(out / TORCHSCRIPT_FILE) as tmp:
            torch.jit.save(scripted, str(tmp))
    return [TORCHSCRIPT_FILE]


def write_onnx(out: Path, module: nn.Module, resolution: int, with_projector: bool) -> list[str]:
    """``model.onnx``: input ``images`` ``[batch, 3, R, R]`` (batch dynamic), outputs
    ``features`` (+ ``projection``); the TorchScript-based exporter (no onnxscript needed)."""
    outputs = [FEATURES, PROJECTION] if with_projector else [FEATURES]
    example = torch.zeros(2, 3, resolution, resolution)
    with warnings.catch_warnings(), replacing(out / ONNX_FILE) as tmp:
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notices
        torch.onnx.export(
            module.eval(), (example,), str(tmp), input_names=[INPUT], output_names=outputs,
            opset_version=ONNX_OPSET, dynamo=False, do_constant_folding=True,
            dynamic_axes={n: {0: "batch"} for n in [INPUT, *outputs]})
    return [ONNX_FILE]


# ---------------------------------------------------------------------------------------------
# Checking what was written: loaded as the card says, it must reproduce the encoder.


def _run_timm(backbone: str, img_size: int | None, file: Path, x: Tensor) -> Tensor:
    """A timm backbone's ``model.safetensors`` loaded by ``timm.create_model`` as the card
    says (:func:`timm_load_kwargs`), in eval mode, on ``x`` ``[N, 3, R, R]``: ``[N, F]``.

    Raises:
        ExportError: timm cannot load the file or run the model it loaded (an architecture
            whose checkpoint filter reads these keys as another layout's, say): one line with
            timm's reason and the formats that carry the run's own modules instead.
    """
    import timm

    name = timm_name(backbone)
    try:
        model = timm.create_model(name, **timm_load_kwargs(img_size, str(file)))
        with torch.no_grad():
            out: Tensor = model.eval()(x)
    except Exception as e:  # noqa: BLE001 - timm's loaders and filters raise anything
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ExportError(
            f"timm.create_model({name!r}, pretrained=True, pretrained_cfg_overlay=dict(file=...)) "
            f"cannot load or run the exported {BACKBONE_FILE} ({reason}); export this "
            f"backbone with --format torchscript or --format onnx, and please report it"
        ) from None
    return out


def _run_written(fmt: str, out: Path, mod: ModuleType, with_projector: bool,
                 x: Tensor) -> list[Tensor]:
    if fmt == "safetensors":
        from safetensors.torch import load_file

        if is_timm(mod.BACKBONE):  # as a timm user loads it: timm.create_model
            h = _run_timm(mod.BACKBONE, mod.TIMM_IMG_SIZE, out / BACKBONE_FILE, x)
        else:
            backbone = mod.build()
            backbone.load_state_dict(load_file(str(out / BACKBONE_FILE)), strict=True)
            with torch.no_grad():
                h = backbone.eval()(x)
        with torch.no_grad():
            if not with_projector:
                return [h]
            proj = mod.build_projector()
            proj.load_state_dict(load_file(str(out / PROJECTOR_FILE)), strict=True)
            return [h, proj.eval()(h)]
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = torch.jit.load(str(out / TORCHSCRIPT_FILE))
        with torch.no_grad():
            y = loaded(x)
        return list(y) if isinstance(y, tuple) else [y]
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / ONNX_FILE), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(y) for y in session.run(None, {INPUT: x.numpy()})]


def check_export(fmt: str, out: Path, mod: ModuleType, encoder: Encoder, with_projector: bool,
                 resolution: int) -> dict[str, Any]:
    """Load the written files as a user would and compare their outputs on a fixed input
    (3 images, standard normal, seed 0) with the simgraph encoder's; returns what
    ``config.json`` records (``max_abs_diff`` per output, the tolerance).

    Raises:
        ExportError: an output differs by more than :data:`CHECK_TOLERANCE`.
    """
    x = torch.randn(3, 3, resolution, resolution, generator=torch.Generator().manual_seed(0))
    encoder.eval()
    with torch.no_grad():
        h = encoder.backbone(x)
        expected = [h, encoder.projector(h)] if with_projector else [h]
    got = _run_written(fmt, out, mod, with_projector, x)
    tol = CHECK_TOLERANCE[fmt]
    names = [FEATURES, PROJECTION][:len(expected)]
    diffs: dict[str, float] = {}
    for name, e, g in zip(names, expected, got, strict=True):
        if tuple(e.shape) != tuple(g.shape):
            raise ExportError(f"the exported {fmt} model's {name} have shape {tuple(g.shape)}, "
                              f"the encoder's {tuple(e.shape)}")
        d = float((e - g.to(e.dtype)).abs().max())
        scale = max(1.0, float(e.abs().max()))
        if not d <= tol * scale:
            raise ExportError(
                f"the exported {fmt} model's {name} differ from the encoder's by up to {d:.3g} "
                f"(allowed {tol * scale:.3g}); the export is wrong, please report it")
        diffs[name] = d
    return {"input": "torch.randn(3, 3, R, R), seed 0", "max_abs_diff": diffs,
            "tolerance": f"{tol} x max(1, max |output|)"}
