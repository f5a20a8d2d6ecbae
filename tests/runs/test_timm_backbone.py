"""A timm backbone end to end in one process (issue 43 item 1): pretrain (the in-process host,
one CPU worker, a ViT-Ti/16 built for 32-px crops: 2×2 patches), evaluate (the checkpoint's
encoder and the random-init baseline through build_encoder / encoder_from_state), and export:
TorchScript and ONNX carry the timm model, and safetensors holds timm's own state dict, which
timm.create_model loads (tests/export/test_timm_export.py: without simgraph). No Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from components.config import PretrainConfig, from_dict
from components.runs.evaluate import evaluate_run
from components.runs.recipe import run_pretraining
from pipelines.export import main as export
from tests.support.datasets import synthetic_dataset, tiny_run_config


@pytest.mark.slow
def test_a_timm_vit_pretrains_evaluates_and_exports(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = synthetic_dataset(tmp_path / "ds", size=32, train_per_class=8, val_per_class=4,
                             test_per_class=4)
    cfg = from_dict(PretrainConfig, tiny_run_config(
        data, tmp_path / "runs", name="vit", knn__every_epochs=0,
        scaling={"num_workers": 1, "cpus_per_worker": 1.0},
        data__augment={"resolution": 32},
        model={"backbone": "timm/vit_tiny_patch16_224", "small_images": False,
               "projector_hidden": 32, "projector_dim": 16},
        optim={"name": "adamw", "lr": 0.001, "weight_decay": 0.05, "warmup_epochs": 0},
        **{"train__epochs": 1, "checkpoint": {"every_epochs": 1, "keep": 1}}))
    run_pretraining(cfg, echo=False)
    run = tmp_path / "runs" / "vit"
    assert any(p.name.startswith("epoch_") for p in run.iterdir())

    ev = evaluate_run(run, probe_epochs=5)
    assert ev.feature == "backbone"
    assert all(0 <= v["top1"] <= 1 for v in ev.knn.values())

    out = tmp_path / "export"
    assert export(str(run), fmt="torchscript", projector=True, out=str(out)) == 0
    arch = json.loads((out / "config.json").read_text())["architecture"]
    assert arch["backbone"] == "timm/vit_tiny_patch16_224" and arch["feature_dim"] == 192
    features, projection = torch.jit.load(str(out / "model.ts"))(torch.zeros(2, 3, 32, 32))
    assert features.shape == (2, 192) and projection.shape == (2, 16)
    assert export(str(run), fmt="onnx", out=str(tmp_path / "onnx")) == 0
    # safetensors: timm's own state dict, loaded by timm.create_model with the weights file
    import timm

    assert export(str(run), fmt="safetensors", out=str(tmp_path / "st")) == 0
    capsys.readouterr()
    loaded = timm.create_model("vit_tiny_patch16_224", pretrained=True, num_classes=0,
                               img_size=32, pretrained_cfg_overlay=dict(
                                   file=str(tmp_path / "st" / "model.safetensors"),
                                   num_classes=0)).eval()
    with torch.no_grad():  # the TorchScript file's features, above, on the same input
        torch.testing.assert_close(loaded(torch.zeros(2, 3, 32, 32)), features, atol=1e-5,
                                   rtol=0)
