"""A trained encoder as files that load without simgraph (``simgraph export``).

What a run's checkpoint holds (``state["model"]``: the ``PretrainModel``'s state dict —
encoder, projector, classifier head, objective with its memory bank) becomes plain-torch
weights for the **backbone** (and, on request, the **projector**), in one of three formats:

* ``safetensors`` (default): ``model.safetensors`` with the backbone's state dict under the
  names plain modules use — torchvision's own keys for the ResNets (``conv1.weight``,
  ``layer1.0.bn1.running_mean``, …; no ``fc``: it is an ``nn.Identity``), ``features.<i>.*``
  for the ConvNet — and ``projector.safetensors`` (``--projector``) with the keys of an
  ``nn.Sequential`` (``0.weight``, ``1.running_mean``, …). Beside them ``model.py``: one
  self-contained file (torch, and torchvision for the ResNets) whose ``build()`` /
  ``build_projector()`` make modules those state dicts load into with ``strict=True``.
* ``torchscript``: ``model.ts`` (``torch.jit.script``), loads with ``torch.jit.load``.
* ``onnx``: ``model.onnx`` (opset :data:`ONNX_OPSET`), input ``images`` ``[N, 3, R, R]`` with
  a dynamic batch axis.

The backbone's output is named ``features`` ``[N, F]``; with the projector the TorchScript
and ONNX models return ``(features, projection [N, D])``. The modules behind every format are
the ones ``model.py`` defines (:data:`MODEL_MODULE`), imported from that text, so the file a
user reads is the code the TorchScript and ONNX files were made from. Every export is checked
before it is described: the written file, loaded the way the card says, must reproduce the
simgraph encoder's output on a fixed input (:func:`check_export`).

``config.json`` (:data:`CONFIG`, format :data:`FORMAT`) and ``model_card.md`` (:data:`CARD`)
describe the files: architecture, input (resolution, RGB, NCHW float32, normalisation mean /
std as the evaluation reader applies them), outputs, and what the pipeline adds (loss, dataset,
classes, metrics, provenance). Every file is written atomically (:mod:`components.io.files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from components.config import AugmentConfig, ModelConfig
from components.errors import SimgraphError
from components.io.files import replacing, sha256_file, write_json, write_text
from components.models.encoders import Encoder, build_backbone, projector

FORMAT = "simgraph-export/1"
FORMATS = ("safetensors", "torchscript", "onnx")
CONFIG, CARD, MODEL_PY = "config.json", "model_card.md", "model.py"
BACKBONE_FILE, PROJECTOR_FILE = "model.safetensors", "projector.safetensors"
TORCHSCRIPT_FILE, ONNX_FILE = "model.ts", "model.onnx"
# Every file an export may write: a new export into the same dir removes those of them the
# earlier export wrote (its config.json records them with their sha256) and this one does not,
# so the dir always describes one export; a file of these names it did not write is refused
# (:func:`claim_export_dir`), never replaced or deleted.
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


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`FORMATS`.

    Raises:
        UnknownFormat: it is not.
    """
    if fmt not in FORMATS:
        raise UnknownFormat(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What builds the exported modules (``model.py``'s constants)."""

    backbone: str
    small_images: bool
    width: int
    blocks: int
    feature_dim: int
    projector_hidden: int
    projector_dim: int
    projector_layers: int
    projector_bn: bool

    @classmethod
    def of(cls, model: ModelConfig, feature_dim: int) -> Architecture:
        return cls(backbone=model.backbone, small_images=model.small_images,
                   width=model.width, blocks=model.blocks, feature_dim=feature_dim,
                   projector_hidden=model.projector_hidden, projector_dim=model.projector_dim,
                   projector_layers=model.projector_layers, projector_bn=model.projector_bn)

    def describe(self, with_projector: bool) -> dict[str, Any]:
        """``config.json``'s ``architecture``."""
        out: dict[str, Any] = {"backbone": self.backbone, "feature_dim": self.feature_dim}
        if self.backbone == "convnet":
            out.update(width=self.width, blocks=self.blocks, min_side=2**self.blocks,
                       definition=f"{MODEL_PY}: ConvNet")
        else:
            out.update(small_images=self.small_images,
                       definition=f"torchvision.models.{self.backbone}(weights=None)"
                                  + (", conv1 = Conv2d(3, 64, 3, 1, 1, bias=False), maxpool = "
                                     "Identity()" if self.small_images else "")
                                  + ", fc = Identity()")
        if with_projector:
            out["projector"] = {"layers": self.projector_layers, "hidden": self.projector_hidden,
                                "out_dim": self.projector_dim, "batch_norm": self.projector_bn,
                                "definition": f"{MODEL_PY}: build_projector (nn.Sequential)",
                                "keys": projector_keys(self)}
        return out


def projector_keys(arch: Architecture) -> list[str]:
    """The projector ``nn.Sequential``'s module layout, e.g. ``['0: Linear(512, 2048, bias=False)',
    '1: BatchNorm1d(2048)', '2: ReLU', '3: Linear(2048, 128)']``."""
    out, i, d = [], 0, arch.feature_dim
    for _ in range(arch.projector_layers - 1):
        out.append(f"{i}: Linear({d}, {arch.projector_hidden}"
                   f"{', bias=False' if arch.projector_bn else ''})")
        i += 1
        if arch.projector_bn:
            out.append(f"{i}: BatchNorm1d({arch.projector_hidden})")
            i += 1
        out.append(f"{i}: ReLU")
        i += 1
        d = arch.projector_hidden
    out.append(f"{i}: Linear({d}, {arch.projector_dim})")
    return out


# ---------------------------------------------------------------------------------------------
# From a checkpoint to plain state dicts.


def encoder_from_state(model: ModelConfig, state_model: dict[str, Tensor]) -> Encoder:
    """The checkpoint's backbone and projector (no classifier head, no objective) as an
    :class:`~components.models.encoders.Encoder`, in eval mode on the CPU.

    Raises:
        ExportError: the checkpoint's model does not fit ``model`` (missing or other keys).
    """
    backbone, dim = build_backbone(model.backbone, model.small_images, model.width,
                                   model.blocks)
    proj = projector(dim, model.projector_hidden, model.projector_dim, model.projector_layers,
                     model.projector_bn)
    encoder = Encoder(backbone, dim, proj)
    for name, module in (("backbone", backbone), ("projector", proj)):
        prefix = f"encoder.{name}."
        part = {k[len(prefix):]: v for k, v in state_model.items() if k.startswith(prefix)}
        try:
            module.load_state_dict(part)
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise ExportError(
                f"the checkpoint's {name} does not fit the run config's model section "
                f"({first[1].strip() if len(first) > 1 else first[0]})") from None
    return encoder.eval()


def plain_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """``module``'s state dict as a plain module of the same structure names it, detached,
    on the CPU, contiguous in NCHW order (a ``channels_last`` run's weights included) and not
    sharing storage (as safetensors requires)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}


def plain_state_dicts(encoder: Encoder) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The backbone's (torchvision's keys for a ResNet, without ``fc``; ``features.<i>.*`` for
    the ConvNet) and the projector's (``nn.Sequential``: ``<i>.*``) state dicts."""
    return plain_state_dict(encoder.backbone), plain_state_dict(encoder.projector)


# ---------------------------------------------------------------------------------------------
# model.py: the plain modules, written beside safetensors weights and used for every format.

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


def _run_written(fmt: str, out: Path, mod: ModuleType, with_projector: bool,
                 x: Tensor) -> list[Tensor]:
    if fmt == "safetensors":
        from safetensors.torch import load_file

        backbone = mod.build()
        backbone.load_state_dict(load_file(str(out / BACKBONE_FILE)), strict=True)
        backbone.eval()
        with torch.no_grad():
            h = backbone(x)
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


# ---------------------------------------------------------------------------------------------
# The whole export.


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
    arch = Architecture.of(model, encoder.feat_dim)
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
            module = plain_module(mod, backbone_sd, projector_sd if with_projector else None)
            written = (write_torchscript(out, module) if fmt == "torchscript"
                       else write_onnx(out, module, augment.resolution, with_projector))
        check = check_export(fmt, out, mod, encoder, with_projector, augment.resolution)
    config: dict[str, Any] = {
        "format": FORMAT,
        "weights": {"format": fmt, "files": {f: sha256_file(out / f) for f in written}},
        "architecture": arch.describe(with_projector),
        "input": input_spec(augment),
        "outputs": outputs_spec(arch, with_projector),
        "check": check,
        **(describe or {}),
    }
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
    import json

    from components.io import storage

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


# ---------------------------------------------------------------------------------------------
# model_card.md


def projector_expression(projector: dict[str, Any], in_dim: int) -> str:
    """The projector as one ``nn.Sequential(...)`` expression (``config.json``'s
    ``architecture.projector``)."""
    mods, d = [], in_dim
    for _ in range(projector["layers"] - 1):
        bn = projector["batch_norm"]
        mods.append(f"nn.Linear({d}, {projector['hidden']}{', bias=False' if bn else ''})")
        if bn:
            mods.append(f"nn.BatchNorm1d({projector['hidden']})")
        mods.append("nn.ReLU()")
        d = projector["hidden"]
    mods.append(f"nn.Linear({d}, {projector['out_dim']})")
    return f"nn.Sequential({', '.join(mods)})"


def loading_code(config: dict[str, Any]) -> str:
    """The lines that load the export without simgraph, for its format and backbone."""
    fmt = config["weights"]["format"]
    arch = config["architecture"]
    with_projector = "projector" in arch
    r = config["input"]["resolution"]
    if fmt == "torchscript":
        call = ("features, projection = model(images)" if with_projector
                else "features = model(images)")
        return f"""```python
import torch

model = torch.jit.load("{TORCHSCRIPT_FILE}").eval()
images = torch.zeros(8, 3, {r}, {r})  # preprocessed as below; any batch size
with torch.no_grad():
    {call}
```"""
    if fmt == "onnx":
        call = ("features, projection = session.run(None, {\"images\": images})"
                if with_projector else "(features,) = session.run(None, {\"images\": images})")
        return f"""```python
import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("{ONNX_FILE}", providers=["CPUExecutionProvider"])
images = np.zeros((8, 3, {r}, {r}), np.float32)  # preprocessed as below; any batch size
{call}
```"""
    proj = ""
    if with_projector:
        proj = (f"\nprojector = {projector_expression(arch['projector'], arch['feature_dim'])}"
                f"\nprojector.load_state_dict(load_file(\"{PROJECTOR_FILE}\"), strict=True)"
                "\nprojection = projector.eval()(features)")
    if arch["backbone"] == "convnet":
        nn_import = "from torch import nn\n" if with_projector else ""
        return f"""```python
import torch
{nn_import}from safetensors.torch import load_file
import model  # {MODEL_PY} beside this card: plain torch, no simgraph

backbone = model.build()  # ConvNet(width={arch['width']}, blocks={arch['blocks']})
backbone.load_state_dict(load_file("{BACKBONE_FILE}"), strict=True)
features = backbone.eval()(torch.zeros(8, 3, {r}, {r}))  # [8, {arch['feature_dim']}]{proj}
```

(Or `backbone, projector = model.load()`; `{MODEL_PY}` needs torch only.)"""
    stem = ("\nbackbone.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # small-image stem"
            "\nbackbone.maxpool = nn.Identity()" if arch.get("small_images") else "")
    return f"""```python
import torch, torchvision
from torch import nn
from safetensors.torch import load_file

backbone = torchvision.models.{arch['backbone']}(){stem}
backbone.fc = nn.Identity()
backbone.load_state_dict(load_file("{BACKBONE_FILE}"), strict=True)  # torchvision's own keys
features = backbone.eval()(torch.zeros(8, 3, {r}, {r}))  # [8, {arch['feature_dim']}]{proj}
```

(`{MODEL_PY}` beside it does the same: `import model; backbone, projector = model.load()`.)"""


def preprocessing_code(spec: dict[str, Any]) -> str:
    r = spec["resolution"]
    ratio = spec["eval_crop"]["ratio"]
    return f"""```python
import torch
from torchvision.transforms.v2 import functional as F

def preprocess(image):  # a PIL image or a uint8 tensor [3, H, W], RGB
    x = F.to_image(image)
    side = int({ratio} * min(x.shape[-2:]))
    x = F.center_crop(x, [side, side])
    x = F.resize(x, [{r}, {r}], antialias=True)  # bilinear
    x = F.to_dtype(x, torch.float32, scale=True)  # [0, 1]
    return F.normalize(x, mean={spec['mean']}, std={spec['std']})
```"""


def model_card(config: dict[str, Any], extra: str = "") -> str:
    """``model_card.md``: what the export is, how to load it, preprocessing; ``extra``: the
    pipeline's sections (training, metrics, provenance)."""
    arch, spec, w = config["architecture"], config["input"], config["weights"]
    r, crop = spec["resolution"], spec["eval_crop"]
    outs = ", ".join(f"`{o['name']}` [{', '.join(map(str, o['shape']))}]"
                     for o in config["outputs"])
    files = ", ".join(f"`{f}`" for f in w["files"])
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in config["check"]["max_abs_diff"].items())
    loss = config.get("loss", {}).get("name")
    what = (f"A {arch['backbone']} backbone{' and its projector' if 'projector' in arch else ''}"
            f" pretrained by simgraph{f' with the **{loss}** loss' if loss else ''}, exported "
            f"as {w['format']} ({files}) for use without simgraph.")
    needs = {"safetensors": "torch, safetensors"
                            + ("" if arch["backbone"] == "convnet" else ", torchvision"),
             "torchscript": "torch", "onnx": "onnxruntime, numpy"}[w["format"]]
    note = ("\n\nTorchScript is deprecated in recent PyTorch releases; `--format safetensors` "
            "is the durable export." if w["format"] == "torchscript" else "")
    resize = crop["resize"].split(", ", 1)[1] if ", " in crop["resize"] else crop["resize"]
    intro = (f"{what} Input `{spec['name']}` [N, 3, {r}, {r}] float32, RGB, NCHW, normalised; "
             f"outputs {outs}. `{CONFIG}` holds all of this card in machine-readable form.")
    checked = ("Checked when written: loaded this way, it reproduced the simgraph encoder's "
               f"outputs on a fixed random input to within {diffs} (max absolute difference).")
    prep = (f"As evaluation fed the encoder: a square centre crop of side int({crop['ratio']} × "
            f"the shorter side), resized to {r}×{r} ({resize}), RGB scaled to [0, 1], then "
            f"`(x - mean) / std` per channel with mean {spec['mean']} and std {spec['std']}; "
            "NCHW, float32.")
    title = f"{config.get('run', {}).get('name', 'encoder')}: {arch['backbone']} image encoder"
    return f"""# {title}

{intro}

## Load it

Needs {needs}; not simgraph.

{loading_code(config)}{note}

{checked}

## Preprocessing

{prep}

{preprocessing_code(spec)}

(torchvision's centre crop may sit one pixel off simgraph's when H − side is odd.)
{extra}"""
