"""``simgraph export``: every format loads in a fresh Python that cannot import simgraph and
gives the features simgraph computes from the same checkpoint; config.json / model_card.md
describe it; bad input is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from components.export.formats import FORMATS
from components.runs.checkpoint import load_state
from components.training.step import extract_features
from pipelines.export import main
from tests.support.datasets import checkpoint_encoder, run_with_checkpoint, synthetic_dataset
from tests.support.fresh_python import NO_SIMGRAPH

RESNET = {"model__backbone": "resnet18", "model__small_images": True}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("export") / "ds")


def _run(dataset: Path, storage: Path, name: str, checkpoint: bool = True,
         **over: Any) -> Path:
    """A run dir with one checkpoint, BatchNorm running statistics randomised (eval mode
    matters)."""
    return run_with_checkpoint(dataset, storage, name, checkpoint, random_bn_stats=True,
                               **over)


def _reference(run_dir: Path, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What simgraph computes from the run's checkpoint: extract_features of the backbone and
    of the projector, in eval mode, on the CPU."""
    _, encoder = checkpoint_encoder(run_dir / "epoch_00001")
    batch = [SimpleNamespace(images=x[:, None], labels=torch.zeros(len(x), dtype=torch.long))]
    cpu = torch.device("cpu")
    h, _ = extract_features(encoder, batch, cpu)
    z, _ = extract_features(encoder, batch, cpu, projector=True)
    return {"features": h, "projection": z}


# Runs in a fresh interpreter: imports of simgraph's packages fail (the venv's editable install
# would otherwise make them importable from anywhere), only torch / torchvision / safetensors /
# onnxruntime are used, as a user without simgraph would.
LOADER = NO_SIMGRAPH + r'''
import importlib.util
import json
import os

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from safetensors.torch import load_file
from torch import nn

x = torch.load("x.pt")
home = os.getcwd()
results = {}
for job in json.load(open("jobs.json")):
    d, fmt, proj = job["dir"], job["format"], job["projector"]
    config = json.load(open(d + "/config.json"))
    arch = config["architecture"]
    assert config["input"]["shape"] == ["N", 3, x.shape[-1], x.shape[-1]]
    if fmt == "safetensors":
        if arch["backbone"] == "convnet":  # the card's way: model.py beside the weights
            spec = importlib.util.spec_from_file_location("model_" + str(len(results)),
                                                          d + "/model.py")
            model = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(model)
            backbone = model.build()
        else:  # torchvision alone, with the small-image stem the card names
            backbone = torchvision.models.resnet18()
            backbone.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            backbone.maxpool = nn.Identity()
            backbone.fc = nn.Identity()
        backbone.load_state_dict(load_file(d + "/model.safetensors"), strict=True)
        with torch.no_grad():
            out = [backbone.eval()(x)]
            if proj:  # an nn.Sequential from config.json's description alone
                p = arch["projector"]
                mods, dim = [], arch["feature_dim"]
                for _ in range(p["layers"] - 1):
                    mods.append(nn.Linear(dim, p["hidden"], bias=not p["batch_norm"]))
                    if p["batch_norm"]:
                        mods.append(nn.BatchNorm1d(p["hidden"]))
                    mods.append(nn.ReLU())
                    dim = p["hidden"]
                mods.append(nn.Linear(dim, p["out_dim"]))
                projector = nn.Sequential(*mods)
                projector.load_state_dict(load_file(d + "/projector.safetensors"), strict=True)
                out.append(projector.eval()(out[0]))
        # model.py's load() (either backbone) gives the same modules
        spec = importlib.util.spec_from_file_location("model_load_" + str(len(results)),
                                                      d + "/model.py")
        model = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model)
        b, p = model.load(d)
        assert (p is None) != proj
        with torch.no_grad():
            assert torch.equal(b(x), out[0]) and (p is None or torch.equal(p(out[0]), out[1]))
    elif fmt == "torchscript":
        model = torch.jit.load(d + "/model.ts").eval()
        with torch.no_grad():
            y = model(x)
        out = list(y) if isinstance(y, tuple) else [y]
    else:
        session = ort.InferenceSession(d + "/model.onnx", providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].shape[0] == "batch"  # a dynamic batch axis
        out = [torch.from_numpy(y) for y in session.run(None, {"images": x.numpy()})]
        # another batch size through the same session
        (one, *_) = session.run(None, {"images": x[:1].numpy()})
        assert np.allclose(one, out[0][:1].numpy(), atol=1e-5)
    results[job["name"]] = out
    # the model card's own code, as printed: its loading block (on zeros) and preprocess()
    blocks = open(d + "/model_card.md").read().split("```python\n")[1:]
    load, prep = (b.split("```")[0] for b in blocks[:2])
    os.chdir(d)
    sys.path.insert(0, d)
    sys.modules.pop("model", None)
    ns = {}
    with torch.no_grad():
        exec(load, ns)
    sys.path.remove(d)
    os.chdir(home)
    card = [torch.as_tensor(ns["features"])]
    if proj:
        card.append(torch.as_tensor(ns["projection"]))
    results[job["name"] + ":card"] = card
    exec(prep, ns)
    image = torch.randint(0, 256, (3, 20, 25), dtype=torch.uint8)
    assert ns["preprocess"](image).shape == (3, x.shape[-1], x.shape[-1])

leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("components", "pipelines"))
assert not leaked, leaked
assert "components" not in sys.modules
torch.save(results, "got.pt")
'''


def _load_without_simgraph(tmp_path: Path, x: torch.Tensor,
                           jobs: list[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    torch.save(x, tmp_path / "x.pt")
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "load_export.py").write_text(LOADER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "load_export.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, list[torch.Tensor]] = torch.load(tmp_path / "got.pt")
    return got


@pytest.mark.parametrize("over", [{}, RESNET], ids=["convnet", "resnet18-small"])
def test_every_format_loads_without_simgraph(dataset: Path, tmp_path: Path,
                                             over: dict[str, Any]) -> None:
    run = _run(dataset, tmp_path / "runs", "r", **over)
    jobs = []
    for fmt in FORMATS:
        for proj in (False, True):
            name = f"{fmt}-{'proj' if proj else 'backbone'}"
            out = tmp_path / "exports" / name
            assert main(str(run), fmt=fmt, projector=proj, out=str(out)) == 0, name
            jobs.append({"name": name, "dir": str(out), "format": fmt, "projector": proj})
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    got = _load_without_simgraph(tmp_path, x, jobs)
    want = _reference(run, x)
    zeros = _reference(run, torch.zeros(8, 3, 16, 16))
    for job in jobs:
        outs = got[job["name"]]
        assert len(outs) == (2 if job["projector"] else 1), job["name"]
        # float32 throughout; ONNX Runtime's kernels sum in other orders, and stay within this
        # too (measured ≤ 4e-6 on these models)
        torch.testing.assert_close(outs[0], want["features"], atol=1e-5, rtol=0,
                                   msg=job["name"])
        if job["projector"]:
            torch.testing.assert_close(outs[1], want["projection"], atol=1e-5, rtol=0,
                                       msg=job["name"])
        # model_card.md's loading code, run as printed, on its zeros input
        card = got[job["name"] + ":card"]
        assert len(card) == len(outs), job["name"]
        for g, w in zip(card, (zeros["features"], zeros["projection"]), strict=False):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=0, msg=job["name"] + " card")


def test_config_json_and_card(dataset: Path, tmp_path: Path) -> None:
    run = _run(dataset, tmp_path, "c", data__augment={"resolution": 16, "eval_crop_ratio": 0.875,
                                                     "mean": [0.5, 0.4, 0.3],
                                                     "std": [0.2, 0.25, 0.3]},
               recipe={"name": "supcon-tiny", "paper": "Khosla et al. 2020, Table 1"})
    state = load_state(run / "epoch_00001")
    # an evaluated run: its metrics (with intervals) travel with the export
    (run / "eval").mkdir()
    metrics = {"run": "c", "loss": "supcon", "epoch": 1, "feature": "backbone",
               "labels": "dataset classes", "knn": {"20": {"top1": 0.75, "top5": 1.0}},
               "probe": {"top1": 0.8, "top5": 1.0, "weight_decay": 0.0},
               "separation": {"margin": 0.12}, "graph": {"label_error": 0.1},
               "intervals": {"knn@20": {"value": 0.75, "low": 0.6, "high": 0.9},
                             "probe": {"value": 0.8, "low": 0.65, "high": 0.93},
                             "margin": {"value": 0.12, "low": 0.05, "high": 0.2}},
               "interval_method": "95 % percentile bootstrap over the 32 query images"}
    (run / "eval" / "metrics.json").write_text(json.dumps(metrics))
    assert main(str(run)) == 0  # defaults: safetensors into <run>/export
    out = run / "export"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.py", "model.safetensors", "model_card.md"]
    c = json.loads((out / "config.json").read_text())
    assert c["architecture"]["backbone"] == "convnet" and c["architecture"]["feature_dim"] == 16
    spec = c["input"]
    assert spec["shape"] == ["N", 3, 16, 16] and spec["layout"] == "NCHW"
    assert spec["channel_order"] == "RGB" and spec["dtype"] == "float32"
    assert spec["mean"] == [0.5, 0.4, 0.3] and spec["std"] == [0.2, 0.25, 0.3]
    assert spec["eval_crop"]["ratio"] == 0.875
    assert c["loss"]["name"] == "supcon" and c["loss"]["tau"] == 0.2
    assert c["loss"]["bank_size"] == 40
    assert c["dataset"]["identity"] == state["dataset"]
    assert c["dataset"]["classes"] == [f"class{i}" for i in range(4)]
    assert c["metrics"]["intervals"]["knn@20"]["low"] == 0.6
    assert c["metrics"]["knn"]["20"]["top1"] == 0.75
    assert c["run"]["epoch"] == 1 and c["run"]["step"] == 4
    # the config's recipe: leads the one-line summary the card quotes
    assert c["recipe"]["recipe_name"] == "supcon-tiny"
    assert c["recipe"]["summary"].startswith("supcon-tiny — Khosla et al. 2020, Table 1: "
                                             "supcon (tau=0.2, ")
    prov = c["provenance"]
    assert prov["simgraph"] == "0.1.0"
    assert prov["git_commit"] == "unknown" or len(prov["git_commit"]) == 40
    assert set(c["weights"]["files"]) == {"model.safetensors", "model.py"}
    card = (out / "model_card.md").read_text()
    for text in ("## Load it", "## Preprocessing", "## Metrics", "## Provenance",
                 "load_state_dict(load_file(\"model.safetensors\"), strict=True)",
                 "| weighted kNN@20 top-1 | 75.0 % | [60.0, 90.0] |",
                 "int(0.875 * min(x.shape[-2:]))", "mean=[0.5, 0.4, 0.3]", "**supcon**",
                 "Recipe: supcon-tiny — Khosla et al. 2020, Table 1: supcon ("):
        assert text in card, text
    # another format into the same dir replaces the first: the dir describes one export
    assert main(str(run), fmt="onnx") == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.onnx",
                                                    "model_card.md"]
    assert "onnxruntime" in (out / "model_card.md").read_text()


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_errors_are_one_line(dataset: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main as cli

    run = _run(dataset, tmp_path, "e")
    assert cli(["export", str(run), "--format", "bogus"]) == 2
    err = _one_line(capsys)
    assert err.startswith("simgraph export: ") and "'bogus'" in err and "onnx" in err
    (tmp_path / "plain").mkdir()
    assert cli(["export", str(tmp_path / "plain")]) == 1
    assert "is not a run dir" in _one_line(capsys)
    empty = _run(dataset, tmp_path, "empty", checkpoint=False)
    assert cli(["export", str(empty), "--out", str(tmp_path / "x")]) == 1
    assert "has no complete checkpoint" in _one_line(capsys)
    assert not (tmp_path / "x").exists()
    # --checkpoint: an incomplete one is refused
    (tmp_path / "half").mkdir()
    assert cli(["export", str(run), "--checkpoint", str(tmp_path / "half")]) == 1
    assert "not a complete checkpoint" in _one_line(capsys)
    # one that is not there (a typo, an epoch pruned by checkpoint.keep): said so, with the
    # epochs the run dir has (was "no meta.json (its write was interrupted)")
    assert cli(["export", str(run), "--checkpoint", str(run / "epoch_00099")]) == 1
    line = _one_line(capsys)
    assert f"checkpoint {run / 'epoch_00099'} does not exist; {run} has epoch_" in line
    assert cli(["export", str(run), "--format", "torchscript", "--projector"]) == 0
    assert capsys.readouterr().out.strip() == str(run / "export" / "model_card.md")


def test_model_py_is_the_standalone_module_with_the_runs_constants(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.py`` is ``components/export/standalone_model.py``'s code with the run's name and
    constants baked in; a module that lost a constant an export sets is named, not exported."""
    from components.config import AugmentConfig
    from components.export import model_file
    from components.export.architecture import Architecture
    from components.export.formats import ExportError

    arch = Architecture(backbone="resnet18", small_images=False, width=32, blocks=4,
                        feature_dim=512, projector_hidden=2048, projector_dim=128,
                        projector_layers=3, projector_bn=False)
    src = model_file.model_source(arch, AugmentConfig(), "my-run")
    module = model_file.MODEL_MODULE.read_text()
    assert src.startswith('"""The encoder of run my-run exported by `simgraph export`')
    assert "PROJECTOR_LAYERS = 3\n" in src and "BACKBONE = 'resnet18'\n" in src
    assert "# This file is `simgraph export`'s model.py" not in src  # the maintainers' note
    code = module[module.index("\nclass ConvNet"):]
    assert code in src  # the code itself is exported as it is
    broken = module.replace("PROJECTOR_BN = True\n", "")
    monkeypatch.setattr(model_file, "_model_template", lambda: broken)
    with pytest.raises(ExportError, match=r"standalone_model.py lacks the constants "
                                          r"\['PROJECTOR_BN'\]"):
        model_file.model_source(arch, AugmentConfig(), "my-run")
