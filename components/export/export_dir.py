"""An export dir as a whole (``simgraph export``): the encoder written in one format with
``config.json`` (architecture, input and outputs, the check, what the caller adds; for a timm
backbone's safetensors, timm's own ``config.json`` layout at its top level:
:func:`timm_section`) and ``model_card.md`` (:func:`export_encoder`), and which files of a dir
an export may replace or delete (:func:`claim_export_dir`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from components.config import AugmentConfig, ModelConfig
from components.export.architecture import Architecture, plain_state_dicts
from components.export.card import model_card
from components.export.formats import (
    CARD,
    CONFIG,
    EXPORT_FILES,
    FEATURES,
    FORMAT,
    INPUT,
    MODEL_PY,
    PROJECTION,
    ExportError,
    check_export,
    check_format,
    write_onnx,
    write_safetensors,
    write_torchscript,
)
from components.export.model_file import imported_source, model_source, plain_module
from components.io import storage
from components.io.files import sha256_file, write_json, write_text
from components.models.encoders import Encoder


def input_spec(augment: AugmentConfig) -> dict[str, Any]:
    """``config.json``'s ``input``: what the encoder expects, as the evaluation reader
    (``components.data.reader``: centre view, ``(x - 255·mean) / (255·std)`` on uint8 RGB)
    makes it."""
    r = augment.resolution
    return {
        "name": INPUT, "shape": ["N", 3, r, r], "resolution": r, "layout": "NCHW",
        "dtype": "float32", "channel_order": "RGB", "value_range": "[0, 1] before normalising",
        "mean": [float(m) for m in augment.mean], "std": [float(s) for s in augment.std],
        "normalise": "(x - mean) / std per channel, x = uint8 / 255",
        "eval_crop": {
            "ratio": augment.eval_crop_ratio,
            "crop": "square, side int(ratio * shorter side), centred (offset (H - side) // 2, "
                    "(W - side) // 2)",
            "resize": f"to {r}x{r}, "
                      + ("bilinear with antialias (torchvision's Resize)"
                         if augment.interpolation == "bilinear"
                         else "OpenCV INTER_AREA (FFCV's)") + ", rounded to uint8",
        },
    }


def outputs_spec(arch: Architecture, with_projector: bool) -> list[dict[str, Any]]:
    out = [{"name": FEATURES, "shape": ["N", arch.feature_dim], "dtype": "float32",
            "what": "backbone features (what simgraph evaluate scores by default)"}]
    if with_projector:
        out.append({"name": PROJECTION, "shape": ["N", arch.projector_dim], "dtype": "float32",
                    "what": "projector output, not normalised (the losses L2-normalise it)"})
    return out


# timm's names of the resize kernels (timm.data.transforms.str_to_interp_mode) for the
# evaluation reader's: OpenCV's INTER_AREA averages each output pixel's footprint, as PIL's
# BOX filter does when shrinking.
TIMM_INTERPOLATION = {"bilinear": "bilinear", "area": "box"}


def timm_section(arch: Architecture, augment: AugmentConfig, backbone: nn.Module,
                 description: str) -> dict[str, Any]:
    """``config.json``'s top-level keys in timm's ``save_for_hf`` layout (``architecture``: the
    timm name; ``num_classes`` 0; ``num_features``; ``model_args``: what the
    run built it with; ``pretrained_cfg``: the run's input size, normalisation, centre crop and
    resize kernel), for a timm backbone's safetensors export: ``timm.create_model("local-dir:
    <dir>", pretrained=True)`` reads them (``timm.models._hub._parse_model_cfg``) and loads
    ``model.safetensors`` beside them, and ``timm.data.resolve_data_config(model=...)`` then
    gives the run's preprocessing. Of the registry's ``pretrained_cfg`` only what describes the
    architecture is kept (first conv, classifier, fixed input size; the pool size when the
    resolution is the registry's): its weights' tag, licence and papers are not these weights'.
    ``description``: what trained them (the recipe)."""
    registry = dict(getattr(backbone, "pretrained_cfg", None) or {})
    r = augment.resolution
    size = [3, r, r]
    same_size = list(registry.get("input_size") or [])[1:] == [r, r]
    pretrained_cfg: dict[str, Any] = {
        "input_size": size,
        "fixed_input_size": bool(registry.get("fixed_input_size", False)),
        "interpolation": TIMM_INTERPOLATION[augment.interpolation],
        "crop_pct": augment.eval_crop_ratio,
        "crop_mode": "center",
        "mean": [float(m) for m in augment.mean],
        "std": [float(s) for s in augment.std],
        "num_classes": 0,
        "pool_size": registry.get("pool_size") if same_size else None,
        "first_conv": registry.get("first_conv"),
        "classifier": registry.get("classifier"),
        "description": description,
    }
    out: dict[str, Any] = {"architecture": arch.timm_model_name, "num_classes": 0,
                           "num_features": arch.feature_dim}
    out["model_args"] = {k: v for k, v in arch.timm_kwargs().items() if k != "num_classes"}
    out["pretrained_cfg"] = pretrained_cfg
    return out


def own_module(mod: ModuleType, encoder: Encoder, with_projector: bool) -> nn.Module:
    """A copy of the encoder's own backbone (a timm model, for TorchScript and ONNX: the
    run's module as it ran, scripted or traced from it rather than from a rebuild), in
    ``model.py``'s ``WithProjector`` with a copy of its projector, in eval mode on the CPU."""
    backbone = copy.deepcopy(encoder.backbone).to("cpu").eval()
    if not with_projector:
        return backbone
    return mod.WithProjector(backbone, copy.deepcopy(encoder.projector).to("cpu")).eval()


def export_encoder(encoder: Encoder, model: ModelConfig, augment: AugmentConfig, out: Path, *,
                   fmt: str, with_projector: bool, run: str,
                   describe: dict[str, Any] | None = None,
                   card_extra: Callable[[dict[str, Any]], str] | None = None,
                   replaceable: Collection[str] = ()) -> dict[str, Any]:
    """Write ``encoder`` (backbone, + projector) in ``fmt`` to the local dir ``out`` with
    ``config.json`` and ``model_card.md``; check it (:func:`check_export`); remove the files
    of ``replaceable`` (what :func:`claim_export_dir` found an earlier export wrote there)
    that this one does not write. ``describe``: more ``config.json`` keys (loss, dataset,
    metrics, provenance). Returns the ``config.json`` content.

    Raises:
        UnknownFormat: ``fmt`` is not one of :data:`FORMATS`.
        ExportError: the export does not reproduce the encoder.
    """
    check_format(fmt)
    encoder = encoder.eval()
    arch = Architecture.of(model, encoder.feat_dim, augment.resolution)
    backbone_sd, projector_sd = plain_state_dicts(encoder)
    out.mkdir(parents=True, exist_ok=True)
    source = model_source(arch, augment, run)
    with imported_source(source) as mod:
        written: list[str]
        if fmt == "safetensors":
            written = write_safetensors(out, backbone_sd,
                                        projector_sd if with_projector else None,
                                        {"backbone": arch.backbone})
            write_text(out / MODEL_PY, source)
            written.append(MODEL_PY)
        else:
            module = (own_module(mod, encoder, with_projector) if arch.timm
                      else plain_module(mod, backbone_sd, projector_sd if with_projector else None))
            written = (write_torchscript(out, module) if fmt == "torchscript"
                       else write_onnx(out, module, augment.resolution, with_projector))
        check = check_export(fmt, out, mod, encoder, with_projector, augment.resolution)
    config: dict[str, Any] = {"format": FORMAT}
    architecture = "architecture"
    if arch.timm and fmt == "safetensors":  # timm's layout: "local-dir:<dir>" loads it
        recipe = ((describe or {}).get("recipe") or {}).get("summary")
        config.update(timm_section(arch, augment, encoder.backbone,
                                   "simgraph pretraining" + (f": {recipe}" if recipe else "")))
        architecture = "simgraph_architecture"
    config.update({
        "weights": {"format": fmt, "files": {f: sha256_file(out / f) for f in written}},
        architecture: arch.describe(with_projector),
        "input": input_spec(augment),
        "outputs": outputs_spec(arch, with_projector),
        "check": check,
        **(describe or {}),
    })
    write_json(out / CONFIG, config)
    write_text(out / CARD, model_card(config, card_extra(config) if card_extra else ""))
    for stale in (set(EXPORT_FILES) - {*written, CONFIG, CARD}) & set(replaceable):
        (out / stale).unlink(missing_ok=True)
    return config



def claim_export_dir(dest: str) -> set[str]:
    """Check that ``dest`` (a path or URI) may receive an export, and mark a new or empty one
    as simgraph's (:func:`components.io.storage.claim_dir`); returns the files of
    :data:`EXPORT_FILES` there that simgraph wrote (an export may replace or delete them).

    Those are: every one, when the dir holds the mark of an export killed before its
    ``config.json``; else ``config.json``, ``model_card.md`` and the weight files the earlier
    export's ``config.json`` records, each only while its sha256 is still the recorded one.

    Raises:
        ExportError: ``dest`` holds files simgraph did not write (a user's ``model.py`` in
            ``--out .``), another kind of simgraph output, or a file of an export's names
            that the earlier export did not write or that changed since (naming them).
    """
    fix = "give --out a new or empty folder"

    def earlier() -> dict[str, Any] | None:
        try:
            data = json.loads(storage.read_text(storage.join(dest, CONFIG)))
        except (storage.StorageError, ValueError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) and data.get("format") == FORMAT else None

    prior = earlier()
    had = storage.claim_dir(dest, "export", lambda _p, _n: prior is not None,
                            error=ExportError, command="export", fix=fix)
    if not had:
        return set()
    try:
        names = set(EXPORT_FILES) & set(storage.list_dir(dest))
    except storage.StorageError as e:
        raise ExportError(f"cannot use {storage.display(dest)} for an export: {e}") from None
    if prior is None:  # the mark of an export killed before its config.json: all its own
        return names
    files = (prior.get("weights") or {}).get("files") or {}
    mine, other = {CONFIG, CARD} & names, []
    for name in sorted(names - {CONFIG, CARD}):
        try:
            same = (isinstance(files, dict) and name in files and hashlib.sha256(
                storage.read_bytes(storage.join(dest, name))).hexdigest() == files[name])
        except storage.StorageError:
            same = False
        (mine.add(name) if same else other.append(name))
    if other:
        raise ExportError(
            f"{storage.display(dest)} holds {', '.join(other)}, which the export there "
            f"({CONFIG}) did not write or which changed since: simgraph export replaces or "
            f"deletes only its own files; move them aside, or {fix}")
    return mine
