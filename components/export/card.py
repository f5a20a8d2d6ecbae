"""``model_card.md`` of an export (``simgraph export``): what the export is, the code that
loads it without simgraph for its format and backbone, the preprocessing, and the sections a
run's export adds (training, metrics, provenance); all of it from ``config.json``'s content.
"""

from __future__ import annotations

from typing import Any

from components.config.backbones import is_timm, timm_name
from components.export.formats import (
    BACKBONE_FILE,
    CONFIG,
    MODEL_PY,
    ONNX_FILE,
    PROJECTOR_FILE,
    TORCHSCRIPT_FILE,
    timm_load_kwargs,
)


def architecture_of(config: dict[str, Any]) -> dict[str, Any]:
    """simgraph's description of the architecture: ``config.json``'s ``architecture``, or
    ``simgraph_architecture`` where ``architecture`` is timm's (the timm name: a timm
    backbone's safetensors export, in timm's layout)."""
    arch = config.get("simgraph_architecture", config["architecture"])
    if not isinstance(arch, dict):
        raise TypeError(f"{CONFIG} has no simgraph architecture description")
    return arch


def timm_call(name: str, img_size: int | None, file: str) -> str:
    """The ``timm.create_model(...)`` call that loads a timm backbone's ``model.safetensors``
    (``file``), as :func:`components.export.formats.timm_load_kwargs` makes it."""
    kw = timm_load_kwargs(img_size, file)
    overlay = ", ".join(f"{k}={v!r}" for k, v in kw.pop("pretrained_cfg_overlay").items())
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return (f"timm.create_model(\n    {name!r}, {args},\n"
            f"    pretrained_cfg_overlay=dict({overlay}))").replace("'", '"')


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
    arch = architecture_of(config)
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
    if is_timm(arch["backbone"]):
        imports = ("from safetensors.torch import load_file\nfrom torch import nn\n"
                   if with_projector else "")
        call = timm_call(timm_name(arch["backbone"]), arch.get("img_size"), BACKBONE_FILE)
        return f"""```python
import timm
import torch
{imports}
backbone = {call}
features = backbone.eval()(torch.zeros(8, 3, {r}, {r}))  # [8, {arch['feature_dim']}]{proj}
```

timm's own model of that name, built as the run built it (no classifier: `num_classes=0`;
global pooling), loads `{BACKBONE_FILE}` strictly: `num_classes=0` in the overlay too keeps
timm's loader strict. `{CONFIG}` is in timm's layout as well (`architecture`, `num_classes`,
`model_args`, `pretrained_cfg` with this card's preprocessing), so
`timm.create_model("local-dir:<this folder>", pretrained=True)` gives the same model, whose
`pretrained_cfg` holds the preprocessing below (`timm.data.resolve_data_config(model=...)`).
(`{MODEL_PY}` beside it does the same without the overlay: `import model; backbone,
projector = model.load()`.)"""
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
    arch, spec, w = architecture_of(config), config["input"], config["weights"]
    r, crop = spec["resolution"], spec["eval_crop"]
    outs = ", ".join(f"`{o['name']}` [{', '.join(map(str, o['shape']))}]"
                     for o in config["outputs"])
    files = ", ".join(f"`{f}`" for f in w["files"])
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in config["check"]["max_abs_diff"].items())
    loss = config.get("loss", {}).get("name")
    recipe = config.get("recipe", {}).get("summary")
    what = (f"A {arch['backbone']} backbone{' and its projector' if 'projector' in arch else ''}"
            f" pretrained by simgraph{f' with the **{loss}** loss' if loss else ''}, exported "
            f"as {w['format']} ({files}) for use without simgraph."
            + (f" Recipe: {recipe}." if recipe else ""))
    library = ("" if arch["backbone"] == "convnet" else
               ", timm" if is_timm(arch["backbone"]) else ", torchvision")
    needs = {"safetensors": "torch, safetensors" + library,
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


# ---------------------------------------------------------------------------------------------
# The sections a run's export adds (``components.export.run_export``).


def _pct(x: Any) -> str:
    return "—" if not isinstance(x, (int, float)) else f"{100 * x:.1f} %"


def _interval(iv: dict[str, Any] | None, scale: float = 100.0, digits: int = 1) -> str:
    if not iv or not all(isinstance(iv.get(k), (int, float)) for k in ("low", "high")):
        return ""
    return f" [{scale * iv['low']:.{digits}f}, {scale * iv['high']:.{digits}f}]"


def init_line(init: dict[str, Any] | None) -> str:
    """Where the training started: ``initialised from <file name> (sha256 …)`` for a run
    with ``model.init``, else random weights."""
    if not init:
        return "Initialised from random weights (no `model.init`)."
    sha = init.get("sha256")
    return (f"Initialised from `{init['file']}` (sha256 {sha or 'not recorded'}; "
            f"`model.init` {init['path']}).")


def card_sections(config: dict[str, Any]) -> str:
    """``model_card.md``'s training, metrics and provenance sections."""
    loss, run, ds, prov = config["loss"], config["run"], config["dataset"], config["provenance"]
    params = ", ".join(f"{k}={v}" for k, v in loss.items() if k != "name")
    classes = ds.get("classes")
    cls = (f"{len(classes)} classes (label i is `dataset.classes[i]` in `{CONFIG}`): "
           + ", ".join(classes[:20]) + (", …" if len(classes) > 20 else "")
           if classes else "classes: not known here")
    lines = [
        "", "## Training", "",
        f"Loss **{loss['name']}** ({params}); run `{run['name']}`, checkpoint after epoch "
        f"{run['epoch']} of {run['epochs']} (step {run['step']}): `{run['checkpoint']}`.", "",
        f"Dataset `{ds['path']}`; {cls}.", "",
        init_line(config.get("init")),
    ]
    m = config.get("metrics")
    lines += ["", "## Metrics", ""]
    if m is None:
        lines.append("Not evaluated: run `simgraph evaluate` on the run dir, then export again "
                     "to include its metrics.")
    else:
        iv = m.get("intervals") or {}
        knn = m.get("knn") or {}
        rows = ["| metric | value | 95 % interval |", "|---|---:|---|"]
        for k in sorted(knn, key=lambda s: int(s) if str(s).isdigit() else 0):
            rows.append(f"| weighted kNN@{k} top-1 | {_pct(knn[k].get('top1'))} | "
                        f"{_interval(iv.get(f'knn@{k}')).strip() or '—'} |")
        probe = (m.get("probe") or {}).get("top1")
        rows.append(f"| linear probe top-1 | {_pct(probe)} | "
                    f"{_interval(iv.get('probe')).strip() or '—'} |")
        margin = (m.get("separation") or {}).get("margin")
        if isinstance(margin, (int, float)):
            rows.append(f"| SINCERE margin | {margin:.3f} | "
                        f"{_interval(iv.get('margin'), 1.0, 3).strip() or '—'} |")
        when = m.get("epoch")
        note = (f"\n\n**These metrics are of the checkpoint after epoch {when}, not of the "
                f"exported one (epoch {run['epoch']}).**" if when != run["epoch"] else "")
        lines += [
            f"From `{m['file']}` (`simgraph evaluate`): {m.get('feature', 'backbone')} features, "
            f"labels: {m.get('labels', 'dataset classes')}; "
            f"{m.get('interval_method', 'no intervals')}.", "", *rows, note,
        ]
    lines += [
        "", "## Provenance", "",
        f"simgraph {prov['simgraph']} (git commit `{prov['git_commit']}`), torch "
        f"{prov['torch']}, torchvision {prov['torchvision']}"
        + (f", timm {prov['timm']}" if prov.get("timm") else "")
        + f"; exported {prov['exported_at']}.",
        f"Dataset identity (manifest digest and split checksums) in `{CONFIG}` "
        "→ `dataset.identity`.", "",
    ]
    return "\n".join(lines)
