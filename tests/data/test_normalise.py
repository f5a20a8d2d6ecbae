"""The reader's CPU normalisation kernel (components/data/normalise.py): bit-identical to
torch's ``(x.float() - mean) / std`` on FFCV's HWC buffer, into a strided view of a batch."""

from __future__ import annotations

import numpy as np
import torch

from components.data.normalise import normalise_hwc_into


def test_the_kernel_gives_torchs_float32_values_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (5, 7, 9, 3), dtype=np.uint8)
    mean = torch.tensor([0.485, 0.456, 0.406]) * 255
    std = torch.tensor([0.229, 0.224, 0.225]) * 255
    batch = torch.full((5, 2, 3, 7, 9), float("nan"))  # [B, V, 3, H, W]: view 1 is written
    normalise_hwc_into(hwc, batch[:, 1].numpy(), mean.numpy(), std.numpy())
    chw = torch.from_numpy(hwc).permute(0, 3, 1, 2)
    want = (chw.float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    assert torch.equal(batch[:, 1], want)
    assert torch.isnan(batch[:, 0]).all()  # the other view untouched
