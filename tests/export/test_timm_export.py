"""``simgraph export --format safetensors`` of a timm backbone (issue 43 item 7): the weights
are timm's own state dict, so a fresh Python without simgraph loads them with
``timm.create_model(<name>, pretrained=True, pretrained_cfg_overlay=dict(file=...))``, and
the export dir's ``config.json`` (timm's ``save_for_hf`` layout at its top level) with
``timm.create_model("local-dir:<dir>", pretrained=True)``; each gives the features simgraph
computes from the same checkpoint. A ResNet (BatchNorm statistics randomised: eval mode
matters) and a ViT built for 32-px crops (its position embeddings must load as they are, not
resampled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from components.export.formats import CHECK_TOLERANCE
from pipelines.export import main
from tests.support.datasets import run_with_checkpoint, synthetic_dataset
from tests.support.fresh_python import NO_SIMGRAPH

RESOLUTION = 32  # ViT-Ti/16: 2×2 patches
TIMM = {"resnet10t": {"model__backbone": "timm/resnet10t", "model__small_images": False},
        "vit_tiny": {"model__backbone": "timm/vit_tiny_patch16_224",
                     "model__small_images": False}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("timm-export") / "ds", size=RESOLUTION,
                             train_per_class=8, val_per_class=2)


def _run(dataset: Path, storage: Path, name: str, **over: Any) -> Path:
    return run_with_checkpoint(dataset, storage, name, random_bn_stats=True,
                               data__augment={"resolution": RESOLUTION,
                                              "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
                               **over)


def _reference(run_dir: Path, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's backbone features and projection, the long way round
    (tests.support.datasets.checkpoint_encoder: the whole training model rebuilt)."""
    from tests.support.datasets import checkpoint_encoder

    _, encoder = checkpoint_encoder(run_dir / "epoch_00001")
    encoder.eval()
    with torch.no_grad():
        h = encoder.backbone(x)
        return h, encoder.projector(h)


# A fresh interpreter that cannot import simgraph (the venv's editable install would otherwise
# make it importable): torch, timm and safetensors only, as a timm user has them.
LOADER = NO_SIMGRAPH + r'''
import importlib.util
import json
import os

import timm
import torch
from safetensors.torch import load_file
from torch import nn

jobs = json.load(open("jobs.json"))
x = torch.load("x.pt")
home = os.getcwd()
results = {}
for job in jobs:  # one interpreter for every model: timm and torch import once
    os.chdir(home)
    d, name, img_size = job["dir"], job["name"], job["img_size"]
    kwargs = {} if img_size is None else {"img_size": img_size}
    out = {}
    # the same keys as timm's own model of that name: no prefix, no classifier
    sd = load_file(d + "/model.safetensors")
    own = timm.create_model(name, pretrained=False, num_classes=0, **kwargs).state_dict()
    assert sorted(sd) == sorted(own), (sorted(set(sd) ^ set(own)))[:10]
    assert all(sd[k].shape == own[k].shape for k in own)
    with torch.no_grad():
        model = timm.create_model(
            name, pretrained=True, num_classes=0,
            pretrained_cfg_overlay=dict(file=d + "/model.safetensors", num_classes=0), **kwargs)
        out["file"] = model.eval()(x)
        local = timm.create_model("local-dir:" + d, pretrained=True)
        out["local-dir"] = local.eval()(x)
        cfg = local.pretrained_cfg
        assert local.num_classes == 0 and cfg["source"] == "local-dir", cfg
        # the projector: an nn.Sequential from config.json's description
        config = json.load(open(d + "/config.json"))
        p = config["simgraph_architecture"]["projector"]
        mods, dim = [], config["num_features"]
        for _ in range(p["layers"] - 1):
            mods += [nn.Linear(dim, p["hidden"], bias=not p["batch_norm"])]
            mods += [nn.BatchNorm1d(p["hidden"])] if p["batch_norm"] else []
            mods += [nn.ReLU()]
            dim = p["hidden"]
        projector = nn.Sequential(*mods, nn.Linear(dim, p["out_dim"]))
        projector.load_state_dict(load_file(d + "/projector.safetensors"), strict=True)
        out["projection"] = projector.eval()(out["file"])
        # model.py beside the weights: load() builds the same through timm
        spec = importlib.util.spec_from_file_location("exported_model", d + "/model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        backbone, proj = module.load(d)
        out["model.py"] = backbone(x)
        out["model.py:projection"] = proj(out["model.py"])
        # the model card's loading block, run as printed in the export dir, on its zeros input
        block = open(d + "/model_card.md").read().split("```python\n")[1].split("```")[0]
        os.chdir(d)
        ns = {}
        exec(block, ns)
        out["card"] = torch.as_tensor(ns["features"])
        out["card:projection"] = torch.as_tensor(ns["projection"])
    out["preprocessing"] = [list(cfg["input_size"]), list(cfg["mean"]), list(cfg["std"]),
                            cfg["crop_pct"], cfg["interpolation"]]
    results[job["key"]] = out
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("components", "pipelines"))
assert not leaked, leaked
torch.save(results, os.path.join(home, "got.pt"))
'''


def _load_without_simgraph(tmp_path: Path, x: torch.Tensor,
                           jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:data:`LOADER` in a fresh interpreter over ``jobs`` (``key``, export ``dir``, timm
    ``name``, ``img_size``): what each way of loading computed, by job key."""
    work = tmp_path / "loader"
    work.mkdir()
    torch.save(x, work / "x.pt")
    (work / "jobs.json").write_text(json.dumps(jobs))
    (work / "load.py").write_text(LOADER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"  # a download would fail, not pass silently
    done = subprocess.run([sys.executable, "load.py"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, dict[str, Any]] = torch.load(work / "got.pt")
    return got


IMG_SIZE = {"resnet10t": None, "vit_tiny": RESOLUTION}  # ViT-like: built for the run's size


def test_a_timm_backbone_loads_with_timm_create_model_without_simgraph(
        dataset: Path, tmp_path: Path) -> None:
    x = torch.randn(5, 3, RESOLUTION, RESOLUTION, generator=torch.Generator().manual_seed(1))
    runs, jobs = {}, []
    for key, img_size in IMG_SIZE.items():
        runs[key] = _run(dataset, tmp_path / "runs", key, **TIMM[key])
        out = tmp_path / f"export-{key}"
        assert main(str(runs[key]), fmt="safetensors", projector=True, out=str(out)) == 0
        assert sorted(p.name for p in out.iterdir()) == [
            "config.json", "model.py", "model.safetensors", "model_card.md",
            "projector.safetensors"]
        jobs.append({"key": key, "dir": str(out), "img_size": img_size,
                     "name": TIMM[key]["model__backbone"][len("timm/"):]})
    loaded = _load_without_simgraph(tmp_path, x, jobs)
    for job in jobs:
        _check_loaded(job, loaded[job["key"]], runs[job["key"]], x)


def _check_loaded(job: dict[str, Any], got: dict[str, Any], run: Path, x: torch.Tensor) -> None:
    name, img_size, out = job["name"], job["img_size"], Path(job["dir"])
    h, z = _reference(run, x)
    h0, z0 = _reference(run, torch.zeros(8, 3, RESOLUTION, RESOLUTION))
    tol = CHECK_TOLERANCE["safetensors"]
    for way in ("file", "local-dir", "model.py"):
        torch.testing.assert_close(got[way], h, atol=tol, rtol=0, msg=f"{name}: {way}")
    torch.testing.assert_close(got["projection"], z, atol=tol, rtol=0)
    torch.testing.assert_close(got["model.py:projection"], z, atol=tol, rtol=0)
    torch.testing.assert_close(got["card"], h0, atol=tol, rtol=0)
    torch.testing.assert_close(got["card:projection"], z0, atol=tol, rtol=0)
    # timm reads the run's preprocessing from config.json (timm.data.resolve_data_config)
    assert got["preprocessing"] == [[3, RESOLUTION, RESOLUTION], [0.5, 0.4, 0.3],
                                    [0.2, 0.25, 0.3], 1.0, "bilinear"]
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "simgraph-export/1"
    assert config["architecture"] == name and config["num_classes"] == 0
    assert config["num_features"] == h.shape[1]
    assert config["model_args"] == ({} if img_size is None else {"img_size": img_size})
    arch = config["simgraph_architecture"]
    assert arch["backbone"] == f"timm/{name}" and arch["feature_dim"] == h.shape[1]
    assert set(config["check"]["max_abs_diff"]) == {"features", "projection"}
    import timm

    assert config["provenance"]["timm"] == timm.__version__  # its module names are the keys
    card = (out / "model_card.md").read_text()
    call = (f'timm.create_model(\n    "{name}", pretrained=True, num_classes=0,'
            + ("" if img_size is None else f" img_size={img_size},")
            + '\n    pretrained_cfg_overlay=dict(file="model.safetensors", num_classes=0))')
    for text in (call, "Needs torch, safetensors, timm; not simgraph.",
                 'timm.create_model("local-dir:', "**supcon**",
                 "Recipe: supcon (",
                 f"on timm/{name}, 4 epochs, batch 32 (16 × 2 workers), lars lr 0.2, 32 px"):
        assert text in card, text


def test_timms_load_of_the_export_is_strict(dataset: Path, tmp_path: Path) -> None:
    """The card's call keeps timm's loader strict (``num_classes=0`` in the overlay: timm
    otherwise drops strictness when the head differs from its registry's 1000 classes), so
    weights that do not fit fail instead of leaving layers at random init."""
    import timm
    from safetensors.torch import load_file, save_file

    run = _run(dataset, tmp_path / "runs", "strict", **TIMM["resnet10t"])
    out = tmp_path / "export"
    assert main(str(run), out=str(out)) == 0
    sd = load_file(str(out / "model.safetensors"))
    sd.pop("conv1.0.weight")
    save_file(sd, str(tmp_path / "partial.safetensors"))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*conv1\.0\.weight"):
        timm.create_model("resnet10t", pretrained=True, num_classes=0, pretrained_cfg_overlay=dict(
            file=str(tmp_path / "partial.safetensors"), num_classes=0))


def test_an_export_timm_cannot_load_as_written_is_one_line(
        dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The check loads the file through timm as the card says; where that fails (here: the
    ViT's img_size left out, so timm builds it for 224 px and resamples its position
    embeddings, and the 32-px check input no longer fits), the export is a one-line error
    naming timm's reason and the formats that carry the run's own modules."""
    from components.export import formats

    run = _run(dataset, tmp_path / "runs", "vit", **TIMM["vit_tiny"])
    real = formats.timm_load_kwargs
    monkeypatch.setattr(formats, "timm_load_kwargs",
                        lambda img_size, file: real(None, file))
    assert main(str(run), out=str(tmp_path / "export")) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("simgraph export: timm.create_model('vit_tiny_patch16_224', "), err
    assert "cannot load or run the exported model.safetensors (" in err
    assert err.endswith("export this backbone with --format torchscript or --format onnx, "
                        "and please report it")
    assert not (tmp_path / "export" / "config.json").exists()  # nothing described
