"""bench/gpu_acceptance.py on a machine without a GPU: ``--estimate-only`` prints a paper
estimate that agrees with itself and with an independent count, and the GPU mode refuses
with one line and exit code 2 instead of a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.gpu_acceptance import CONFIG, check_device_crops, find_gpu
from components.config import PretrainConfig, load_config
from components.training.step import build_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gpu_acceptance.py"
FASHION = Path("/usr/share/datasets/fashion-mnist")


def _run(*args: str, cuda: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU even where the suite has one
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def _table_row(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    return dict(zip(header, row, strict=True))


@pytest.mark.skipif(not FASHION.is_dir(), reason="needs apt dataset-fashion-mnist")
def test_estimate_only_is_consistent(tmp_path: Path) -> None:
    # A dataset dir that does not exist: images / epoch come from the package's labels.
    out = _run("--estimate-only", "--gpu", "H100", "--dataset", str(tmp_path / "none"))
    assert out.returncode == 0, out.stderr
    row = _table_row(out.stdout)
    assert row["GPU"] == "H100 SXM" and row["AMP"] == "bf16"
    peak, fraction = float(row["peak dense TFLOPS"]), float(row["assumed achieved"])
    gflop, images = float(row["GFLOP / image (train)"]), int(row["images / epoch"])
    seconds = float(row["est. s / epoch (1 GPU)"])
    assert (peak, fraction) == (989.0, 0.35)
    # 60,000 official train images, 600 per class drawn for val: 54,000, cut to batches of 512.
    assert images == (54_000 // 512) * 512
    assert seconds == pytest.approx(images * gflop * 1e9 / (fraction * peak * 1e12), rel=0.01)
    assert float(row["est. img/s per GPU"]) == pytest.approx(
        fraction * peak * 1e12 / (gflop * 1e9), rel=0.01)

    # Independently: count a real forward + backward (not 3 × forward) of the config's model.
    cfg = load_config(CONFIG, PretrainConfig)
    model, _ = build_model(cfg.model, cfg.loss, 10, None, 0)
    b, v, r = 4, cfg.data.views, cfg.data.augment.resolution
    with FlopCounterMode(display=False) as count:
        loss, _ = model(torch.randn(b, v, 3, r, r), torch.arange(b) % 2, torch.arange(b), None)
        loss.backward()
    encoder_only = count.get_total_flops() / b / 1e9  # the objective at batch 4: negligible
    # The first conv needs no input gradient, so the real count is a little under 3 × forward.
    assert encoder_only == pytest.approx(gflop, rel=0.01)
    assert encoder_only < gflop


def test_without_cuda_exits_2_with_one_line() -> None:
    out = _run(cuda=False)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--estimate-only" in lines[0]


def test_unknown_gpu_asks_for_its_peak() -> None:
    out = _run("--estimate-only", "--gpu", "RTX 9090")
    assert out.returncode == 2 and "--peak-tflops" in out.stderr and "Traceback" not in out.stderr


def test_gpu_names() -> None:
    names = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",
             "NVIDIA H200": "H200 SXM", "NVIDIA A100-SXM4-80GB": "A100", "NVIDIA A10": "A10",
             "NVIDIA L4": "L4", "NVIDIA L40S": "L40S", "Tesla T4": "T4",
             "Tesla V100-SXM2-16GB": "V100"}
    for device, spec in names.items():
        found = find_gpu(device)
        assert found is not None and found.name == spec, device
    assert find_gpu("NVIDIA GeForce RTX 4090") is None


def test_the_device_crop_check_runs_where_there_is_no_gpu(tmp_path: Path) -> None:
    """The acceptance run's device-crop check, on the CPU (its code, not a GPU's numbers):
    the crops after the loader give FFCV's views from the same seed, and a timing."""
    from components.data.reader import set_jit
    from tests.support.datasets import synthetic_dataset

    synthetic_dataset(tmp_path / "data", size=16)
    set_jit(False)
    check = check_device_crops(tmp_path / "data", torch.device("cpu"), batch=4, side=24,
                               stored=32, repeats=2, compare=8)
    assert check.ok is True, check.detail
    assert check.detail.startswith("views within ") and "[8, 2, 3, 16, 16]" in check.detail
    assert "per 4 × 2 views of 24 px from 32-px slots on cpu" in check.detail
