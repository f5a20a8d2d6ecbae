"""Read W&B offline runs back (wandb ≥ 0.2x has no Python reader for its ``.wandb`` files).

A ``run-<id>.wandb`` file is a 7-byte header (``:W&B``, magic, version) followed by a LevelDB
log: 32 KiB blocks of records, each a 7-byte header (CRC32C, length, type: 1 full, 2 first,
3 middle, 4 last) and a payload, a serialised ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


@dataclasses.dataclass
class OfflineRun:
    run_id: str
    name: str
    project: str
    config: dict[str, Any]
    history: list[dict[str, Any]]  # one dict per logged row, wandb's own keys (_step, ...) too


def _payloads(raw: bytes) -> Iterator[bytes]:
    assert raw[:4] == b":W&B", raw[:7]
    pos, buf = HEADER, b""
    while pos + HEADER <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        data = raw[pos + HEADER:pos + HEADER + length]
        if len(data) < length:  # a run killed mid-write: its last record is cut short
            return
        pos += HEADER + length
        if kind == 1:
            yield data
        elif kind == 2:
            buf = data
        elif kind == 3:
            buf += data
        elif kind == 4:
            yield buf + data


def read_offline_run(path: Path) -> OfflineRun:
    """The run in ``path`` (an ``offline-run-*`` dir or its ``run-*.wandb`` file); of a
    killed run, the records written before the kill."""
    from wandb.proto import wandb_internal_pb2 as pb

    file = path if path.is_file() else next(path.glob("run-*.wandb"))
    run = OfflineRun("", "", "", {}, [])
    for data in _payloads(file.read_bytes()):
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name, run.project = (rec.run.run_id, rec.run.display_name,
                                                 rec.run.project)
            run.config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            run.config.update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            run.history.append({u.key or "/".join(u.nested_key): json.loads(u.value_json)
                                for u in rec.history.item})
    return run


def offline_runs(root: Path) -> list[OfflineRun]:
    """Every offline run under ``root`` (``**/wandb/offline-run-*``), oldest first; a run
    killed before its ``.wandb`` file was created is left out."""
    return [read_offline_run(d) for d in sorted(root.glob("**/wandb/offline-run-*"))
            if any(d.glob("run-*.wandb"))]
