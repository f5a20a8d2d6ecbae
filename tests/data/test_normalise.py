"""The reader's CPU normalisation (components/data/normalise.py): the table kernel gives
torch's ``(x.float() - mean) / std`` bit for bit on FFCV's HWC buffer, into a strided view of a
batch; the host batch pool reuses a buffer only when nothing references it."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from components.data.normalise import HostBatchPool, normalise_hwc_into, normalise_table


def test_the_kernel_gives_torchs_float32_values_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (5, 7, 9, 3), dtype=np.uint8)
    hwc[0, 0, :3] = [[0, 0, 0], [255, 255, 255], [128, 1, 254]]  # the table's ends
    mean = torch.tensor([0.485, 0.456, 0.406]) * 255
    std = torch.tensor([0.229, 0.224, 0.225]) * 255
    batch = torch.full((5, 2, 3, 7, 9), float("nan"))  # [B, V, 3, H, W]: view 1 is written
    normalise_hwc_into(hwc, batch[:, 1].numpy(), normalise_table(mean.numpy(), std.numpy()))
    chw = torch.from_numpy(hwc).permute(0, 3, 1, 2)
    want = (chw.float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    assert torch.equal(batch[:, 1], want)
    assert torch.isnan(batch[:, 0]).all()  # the other view untouched


def test_the_table_holds_every_uint8_value_normalised() -> None:
    mean, std = np.float32([10.0, 20.0, 30.0]), np.float32([2.0, 4.0, 8.0])
    t = normalise_table(mean, std)
    assert t.shape == (3, 256) and t.dtype == np.float32
    v = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(t[2], (v - np.float32(30)) / np.float32(8))
    assert t[0, 0] == -5.0 and t[1, 255] == (255 - 20) / 4


def test_the_pool_reuses_a_buffer_only_when_nothing_references_it() -> None:
    pool = HostBatchPool(keep=2)
    a = pool.take((2, 3))
    ptr = a.data_ptr()
    b = pool.take((2, 3))  # a is held: another buffer
    assert b.data_ptr() != ptr and pool.made == 2
    view = a[:, 1]  # a slice keeps a's buffer alive after a is gone
    del a
    gc.collect()
    assert pool.take((2, 3)).data_ptr() not in (ptr, b.data_ptr())
    arr = view.numpy()  # so does a numpy array over the slice
    del view
    gc.collect()
    assert pool.take((2, 3)).data_ptr() != ptr
    del arr
    c = pool.take((2, 3))  # now only the pool holds it
    assert c.data_ptr() == ptr
    made = pool.made
    del b, c
    for _ in range(5):  # a consumer dropping each batch: no new buffers
        x = pool.take((2, 3))
        del x
    assert pool.made == made
    assert pool.take((4,)).shape == (4,)  # another shape: its own buffers


def test_autograds_saved_input_keeps_its_buffer() -> None:
    pool = HostBatchPool(keep=2)
    x = pool.take((4, 3))
    x.fill_(1.0)
    w = torch.ones(3, requires_grad=True)
    loss = (x * w).sum()  # mul saves x for w's gradient
    ptr = x.data_ptr()
    del x
    assert pool.take((4, 3)).data_ptr() != ptr
    loss.backward()
    del loss
    gc.collect()
    assert pool.take((4, 3)).data_ptr() == ptr
    assert torch.equal(w.grad, torch.full((3,), 4.0))


def test_keep_is_checked() -> None:
    with pytest.raises(ValueError, match="keep=0"):
        HostBatchPool(keep=0)
