"""Step 5a: each split's shards merged into ``<split>.beton`` (:func:`merge_splits`, one Ray
task per split: :func:`merge_split`), every shard's checksum verified against its sidecar
first. The FFCV merge itself is ``components/data/shards.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.data import shards
from components.data.build.common import PreprocessError
from components.data.build.placement import ANYWHERE, Placement
from components.data.build.tasks import map_tasks
from components.data.splits import SPLITS
from components.io.files import sha256_file


def merge_split(row: dict[str, Any]) -> str:
    """One Ray task per split: verify its shards' checksums, merge them into ``row["target"]``
    (:func:`shards.merge_shards`), return the merged file's checksum."""
    for part, want in zip(row["parts"], row["sha256"], strict=True):
        if sha256_file(part) != want:
            raise PreprocessError(f"shard {part} changed since it was written (checksum "
                                  "mismatch); re-run to rebuild it")
    shards.merge_shards([str(x) for x in row["parts"]], str(row["target"]))
    return sha256_file(row["target"])


def _split_shards(sides: dict[str, dict[str, Any]], split: str) -> list[str]:
    """The names of ``split``'s shards that hold samples, in merge order."""
    return sorted(n for n, side in sides.items() if side["split"] == split and side["samples"])


def merge_splits(out: Path, sides: dict[str, dict[str, Any]],
                 placement: Placement = ANYWHERE) -> dict[str, str | None]:
    """Merge each split's non-empty shards into ``<split>.beton`` (one Ray task per split);
    ``{split: sha256 of the file, or None when the split is empty (file removed)}``."""

    rows: list[dict[str, Any]] = []
    merged: dict[str, str | None] = {}
    for split in SPLITS:
        names = _split_shards(sides, split)
        if names:
            rows.append({"split": split, "target": str(out / f"{split}.beton"),
                         "parts": [str(out / "shards" / f"{n}.beton") for n in names],
                         "sha256": [sides[n]["sha256"] for n in names]})
        else:
            (out / f"{split}.beton").unlink(missing_ok=True)
            merged[split] = None
    digests = map_tasks(merge_split, rows, placement=placement)
    merged.update({r["split"]: d for r, d in zip(rows, digests, strict=True)})
    return merged
