"""Small builders shared by the objective tests; a TensorBoard events reader; the
folder digests and one-line-error check of the ownership / one-writer tests."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from components.objectives import ContrastiveBatch


def label_patterns(n: int) -> dict[str, np.ndarray]:
    """The label patterns every supervised loss is tested on, for ``n`` ≥ 5 samples."""
    rng = np.random.default_rng(n)
    singles = np.array([0, 0, 1, 2, 2, *range(3, n - 2)])  # classes 1 and ≥ 3 are singletons
    return {
        "unique": np.arange(n),
        "one_class": np.zeros(n, dtype=np.int64),
        "singletons": singles.astype(np.int64),
        "random": rng.integers(0, 3, size=n),
    }


def batch_from(
    z: np.ndarray | torch.Tensor, **fields: np.ndarray | torch.Tensor
) -> ContrastiveBatch:
    """A float64 :class:`ContrastiveBatch` whose ``z`` requires grad (returned as ``.z``)."""
    zt = torch.as_tensor(np.asarray(z), dtype=torch.float64).clone().requires_grad_(True)
    tensors = {}
    for name, value in fields.items():
        t = torch.as_tensor(np.asarray(value))
        tensors[name] = t.double() if t.is_floating_point() else t.long()
    return ContrastiveBatch(z=zt, **tensors)


def numeric_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Central finite differences of the scalar ``f(x)`` (float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        idx = it.multi_index
        old = x[idx]
        x[idx] = old + h
        up = f(x)
        x[idx] = old - h
        down = f(x)
        x[idx] = old
        g[idx] = (up - down) / (2 * h)
    return g


def tensorboard_events(folder: Path) -> list[tuple[str, int, Any]]:
    """(tag, step, value) of every summary value in ``folder``'s event files (TFRecord
    framing: u64 length, u32 crc, the Event proto, u32 crc); HParams as their plugin name."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    for f in sorted(folder.glob("events.out.tfevents.*")):
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                value = (v.metadata.plugin_data.plugin_name if v.metadata.plugin_data.plugin_name
                         else round(v.simple_value, 6))
                out.append((v.tag, event.step, value))
    return out


def tree_digests(root: Path) -> dict[str, str]:
    """Relative path → sha256 of every file under ``root`` (what "nothing was lost" compares)."""
    from components.io.files import sha256_file

    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file()}


def one_line_error(capsys: Any) -> str:
    """What the command printed on stderr, asserted to be one line."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return str(err)
