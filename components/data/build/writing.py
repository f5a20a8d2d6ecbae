"""Step 4: shard writing, one Ray task per shard (:func:`write_shard`; module-level so Ray
pickles it by reference): read → validate → decode/RGB/resize (:func:`decode_batch`) → write the
FFCV shard under a temporary name, then rename, and its sidecar ``shards/<name>.json``
(checksum, plan digest, skipped items) last. The sidecar marks the shard complete:
:func:`_shard_done` decides which shards a resumed build reuses."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from components.data import shards
from components.data.build.common import PreprocessError, _read_json
from components.data.build.embedding import CaptionTable
from components.data.build.planning import Plan
from components.data.images import ImageError, decode_image
from components.data.shard_paths import take_paths
from components.data.sources import read_item
from components.io.files import replacing, sha256_file, write_json


def decode_batch(batch: dict[str, np.ndarray], max_side: int, min_side: int) -> dict[str, Any]:
    """read → validate → decode/RGB/resize. Failures become rows with a ``reason``."""
    pixels, heights, widths, reasons, details = [], [], [], [], []
    for path in batch["path"]:
        try:
            rgb = decode_image(read_item(str(path)), max_side=max_side, min_side=min_side)
            pixels.append(rgb.tobytes())
            heights.append(rgb.shape[0])
            widths.append(rgb.shape[1])
            reasons.append("")
            details.append("")
        except (ImageError, OSError) as e:
            pixels.append(b"")
            heights.append(0)
            widths.append(0)
            reasons.append(getattr(e, "reason", "unreadable-file"))
            details.append(str(e))
    return {
        **batch,
        "pixels": np.array(pixels, dtype=object),
        "height": np.array(heights, dtype=np.int64),
        "width": np.array(widths, dtype=np.int64),
        "reason": np.array(reasons, dtype=object),
        "detail": np.array(details, dtype=object),
    }


SHARD_COLUMNS = ("sample_id", "path", "label", "caption_id")


def shard_specs(p: Plan, todo: list[int]) -> list[dict[str, Any]]:
    """One row per shard still to write (``todo``: indices into ``p.shard_names``), holding
    its rows' columns as views of the plan's arrays (lists of Python ints were ~80 B an item,
    every shard's alive until its task was done; a view is serialised as its own rows) and its
    paths' columns; largest first so the last tasks to start are the short ones."""
    specs = []
    for k in todo:
        rows = p.shard(k)
        specs.append({"shard": p.shard_names[k], "sample_id": p.sample_ids[rows],
                      "path": take_paths(p.paths, p.sample_ids[rows], compact=True),
                      "label": p.labels[rows], "caption_id": p.caption_ids[rows]})
    return sorted(specs, key=lambda sp: (-len(sp["path"]), sp["shard"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardSettings:
    """What every shard task needs besides its items (stored once, passed to each task)."""

    out_dir: str
    captions: CaptionTable | None  # the caption embeddings' file, None without captions
    digests: dict[str, str]  # shard name -> its plan digest (kept in the sidecar)
    image: dict[str, Any]  # the ImageConfig as a dict
    caption_dtype: str
    bad_input: str


def write_shard(spec: dict[str, Any], settings: ShardSettings) -> int:
    """One Ray task per :func:`shard_specs` row: decode and write its shard; returns the
    samples written."""
    group = {"sample_id": np.asarray(spec["sample_id"], dtype=np.int64),
             "path": np.array(list(spec["path"]), dtype=object),
             "label": np.asarray(spec["label"], dtype=np.int64),
             "caption_id": np.asarray(spec["caption_id"], dtype=np.int64)}
    group = decode_batch(group, settings.image["max_side"], settings.image["min_side"])
    return write_group(str(spec["shard"]), group, settings)


def write_group(name: str, group: dict[str, np.ndarray], settings: ShardSettings) -> int:
    """Write shard ``name`` (its decoded rows, :func:`decode_batch`) and its sidecar; returns
    the samples written. Its items' caption embeddings are read from the build's file (this
    shard's rows only)."""
    order = np.argsort(group["sample_id"], kind="stable")
    ok = [i for i in order if not group["reason"][i]]
    skipped = [
        {"path": str(group["path"][i]), "reason": str(group["reason"][i]),
         "detail": str(group["detail"][i])}
        for i in order if group["reason"][i]
    ]
    if skipped and settings.bad_input == "error":
        s = skipped[0]
        raise PreprocessError(f"{s['path']}: {s['detail']} (bad_input=error)")
    image = settings.image
    target = Path(settings.out_dir) / "shards" / f"{name}.beton"
    info: dict[str, Any] = {"name": name, "split": name.rsplit("-", 1)[0], "samples": len(ok),
                            "digest": settings.digests[name], "skipped": skipped}
    if ok:
        images = [
            np.frombuffer(group["pixels"][i], np.uint8).reshape(
                int(group["height"][i]), int(group["width"][i]), 3)
            for i in ok
        ]
        captions = None
        if settings.captions is not None:
            captions = settings.captions.take(group["caption_id"][ok]).astype(
                settings.caption_dtype)
        with replacing(target) as tmp:
            shards.write_shard(
                tmp, images, group["label"][ok], group["sample_id"][ok], captions,
                write_mode=image["write_mode"], jpeg_quality=image["jpeg_quality"],
                page_size=shards.page_size_for(
                    image["max_side"], 0 if captions is None else captions[0].nbytes),
            )
            info["sha256"] = sha256_file(tmp)
        info["labels"] = {str(k): int(v) for k, v in collections.Counter(
            group["label"][ok].tolist()).items()}
    write_json(target.with_suffix(".json"), info)  # the sidecar marks the shard complete
    return len(ok)


def _shard_done(out: Path, name: str, digest: str, verify: bool = True) -> dict[str, Any] | None:
    """The sidecar if the shard is complete, matches the plan and (``verify``) its checksum
    verifies."""
    side = _read_json(out / "shards" / f"{name}.json")
    if not side or side.get("digest") != digest:
        return None
    if side["samples"] == 0:
        return side
    beton = out / "shards" / f"{name}.beton"
    if beton.exists() and (not verify or sha256_file(beton) == side.get("sha256")):
        return side
    return None
