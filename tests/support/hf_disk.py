"""Folders as Hugging Face ``datasets`` (3.x / 4.x) ``save_to_disk`` writes them, made with
pyarrow alone (the package is not a dependency): ``state.json``, ``dataset_info.json`` and
``data-XXXXX-of-NNNNN.arrow`` Arrow IPC streams; a DatasetDict adds ``dataset_dict.json`` and
one such folder per split. The layout follows ``Dataset.save_to_disk`` /
``DatasetDict.save_to_disk`` (src/datasets/arrow_dataset.py, dataset_dict.py) and the
features' ``asdict`` (defaults left out, ``_type`` always written)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

IMAGE = {"_type": "Image"}
STRING = {"dtype": "string", "_type": "Value"}
INT64 = {"dtype": "int64", "_type": "Value"}
BINARY = {"dtype": "binary", "_type": "Value"}


def class_label(names: Sequence[str]) -> dict[str, Any]:
    return {"names": list(names), "_type": "ClassLabel"}


def _arrow_type(feature: Mapping[str, Any]) -> pa.DataType:
    kind = feature.get("_type")
    if kind == "Image":
        return pa.struct({"bytes": pa.binary(), "path": pa.string()})
    if kind == "ClassLabel":
        return pa.int64()
    if kind in ("List", "Sequence"):
        return pa.list_(_arrow_type(feature["feature"]))
    return {"string": pa.string(), "int64": pa.int64(), "binary": pa.binary()}[feature["dtype"]]


def image_cell(data: bytes | None, path: str | None = None) -> dict[str, Any]:
    """An ``Image`` cell as stored: the encoded bytes (embedded) and the original path."""
    return {"bytes": data, "path": path}


def save_to_disk(
    folder: Path, columns: Mapping[str, Sequence[Any]], features: Mapping[str, Mapping[str, Any]],
    *, num_shards: int = 1, batch_rows: int = 100, split: str | None = None,
    info: bool = True,
) -> list[Path]:
    """Write ``columns`` (name -> values, in ``features``' order) as ``Dataset.save_to_disk``:
    ``num_shards`` contiguous data files of record batches of at most ``batch_rows`` rows
    (datasets writes 100-row batches for image datasets); ``info=False`` leaves out
    ``dataset_info.json`` (its features are still in each file's schema metadata). Returns
    the data files."""
    folder.mkdir(parents=True, exist_ok=True)
    fingerprint = "8f6e4a2b0c1d3e5f"
    meta = {"huggingface": json.dumps({"info": {"features": dict(features)},
                                       "fingerprint": fingerprint})}
    schema = pa.schema([(name, _arrow_type(f)) for name, f in features.items()], metadata=meta)
    table = pa.table({name: list(columns[name]) for name in features}, schema=schema)
    n = len(table)
    div, mod = divmod(n, num_shards)  # datasets' Dataset.shard(contiguous=True)
    files: list[Path] = []
    start = 0
    for k in range(num_shards):
        size = div + (1 if k < mod else 0)
        path = folder / f"data-{k:05d}-of-{num_shards:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            part = table.slice(start, size)
            for b in range(0, size, batch_rows):
                writer.write_table(part.slice(b, batch_rows))
        files.append(path)
        start += size
    state = {"_data_files": [{"filename": p.name} for p in files], "_fingerprint": fingerprint,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
             "_output_all_columns": False, "_split": split}
    with open(folder / "state.json", "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    if info:
        dataset_info = {"citation": "", "description": "", "features": dict(features),
                        "homepage": "", "license": ""}
        with open(folder / "dataset_info.json", "w", encoding="utf-8") as f:
            json.dump(dataset_info, f, indent=2)
    return files


def save_dict_to_disk(folder: Path, splits: Mapping[str, Mapping[str, Sequence[Any]]],
                      features: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> Path:
    """``DatasetDict.save_to_disk``: ``dataset_dict.json`` and one folder per split (in
    ``splits``' order), each written by :func:`save_to_disk` (``kwargs``)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "dataset_dict.json", "w", encoding="utf-8") as f:
        json.dump({"splits": list(splits)}, f)
    for name, columns in splits.items():
        save_to_disk(folder / name, columns, features, split=name, **kwargs)
    return folder
