"""Building a dataset dir: images → FFCV ``.beton`` splits + caption embeddings (``simgraph
preprocess``, :mod:`pipelines.preprocess`, and ``simgraph run`` drive :func:`run`).

Reads top to bottom as the data flow in DESIGN.md:

1. list the source on the driver (paths, labels, captions) and apply the caption policy
   (invalid UTF-8 and empty captions are counted, never silent);
2. hash every item's stored pixels (Ray tasks; ``components/data/integrity.py``): drop exact
   duplicates (``duplicate-of``), group near duplicates (and ``split.group_by`` values), then
   assign stratified splits group by group and cut each split into shards of ``shard_size``;
3. embed the unique captions and the class captions (Ray Data actor pool, one model each);
4. one Ray task per shard: read → validate → decode/RGB/resize → write the shard (temp
   name, then rename, with a sidecar JSON holding its checksum and skipped items);
5. merge each split's shards into ``<split>.beton`` (one Ray task per split) and write
   ``manifest.json`` last.

Every image stage runs as plain Ray tasks of hundreds of items or more, all queued at once
(:func:`map_tasks`): per-task overhead, a Ray Data executor's gaps between tasks and a shuffle
would otherwise bound how far more CPUs speed a build up (``bench/preprocess.py``). The
caption stage is a Ray Data actor pool (one model per actor, batches streamed to it).

Re-running skips every shard whose sidecar matches the plan and whose checksum verifies, so a
killed run continues where it stopped and produces identical files. An output holding a
dataset built with other parameters (for a URI output: the remote manifest says so) is refused
unless ``--overwrite`` is given. ``--overwrite`` rebuilds from scratch *beside* the current
dataset, in ``.next/``, and swaps the new one in only when it is complete and its split files
verify: a failed, killed or mistyped rebuild leaves the current dataset as it was, and a
re-run with the same parameters resumes ``.next/`` (one with other parameters deletes it
first). Meanwhile the output needs room for both datasets.

Output directory::

    manifest.json  train.beton  val.beton  test.beton  classes.json
    class_embeddings.npy  class_similarity.npy   (labelled data with captions enabled)
    shards/<split>-<k>.json (+ .beton while building, or with keep_shards)
    captions.npz   (the embedded caption table; a re-run reuses it)
    captions.json  caption_index.npy   (caption texts and token counts; sample id -> caption id)
    content.npz    (every item's content hashes; a resumed run reuses them)
    .lock          (held by the one preprocess writing here; everything below happens under it)
    .next/         (an --overwrite build: the same layout, plus .staging.json naming its
                    params digest; gone once swapped in)
    .swap.json  .previous/   (only while a swap runs: the journal, the replaced entries; a run
                    killed mid-swap is finished, or rolled back when .next/ does not verify,
                    by the next run here — see :func:`_swap`)

A reader sees either the old manifest with the old files, no manifest (for the moment of the
swap), or the new manifest with the new files: the old manifest is moved aside first and the
new one moved in last.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import math
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.config import PreprocessConfig, to_dict
from components.data import captions as cap
from components.data import integrity, shards
from components.data.images import ImageError, decode_image
from components.data.shards import FORMAT, MANIFEST
from components.data.sources import (
    FASHION_SCHEME,
    MISSING_CAPTION,
    UNKNOWN_LABEL,
    Item,
    Listing,
    Skip,
    SourceError,
    list_source,
    read_item,
    skip_record,
)
from components.data.splits import SPLITS, assign_splits
from components.errors import SimgraphError, root_cause
from components.files import remove_temporaries, replacing, sha256_file, write_json
from components.session import ray_session

DUPLICATE_OF = "duplicate-of"
CAPTION_TRUNCATED = "caption-truncated"
LISTED_MAX = 1000  # near-duplicate groups / truncated captions listed in full in the manifest
ITEMS_PER_TASK = 1000  # hashing: enough per Ray task that its fixed cost (~10-30 ms) is small


class PreprocessError(SimgraphError, RuntimeError):
    """Preprocessing cannot produce a usable dataset (the message says why and what to do)."""


# ---------------------------------------------------------------------------------------------
# 1–2. Listing, caption policy, splits and the shard plan (driver, no Ray).


@dataclasses.dataclass(frozen=True)
class Planned:
    sample_id: int
    path: str
    label: int
    caption_id: int  # row of the caption table, -1 when captions are disabled
    split: str
    shard: str


def _fields(row: Planned) -> tuple[Any, ...]:
    return tuple(getattr(row, f.name) for f in dataclasses.fields(row))


def _subset(listing: Listing, max_per_class: int | None) -> list[Item]:
    if max_per_class is None:
        return listing.items
    seen: collections.Counter[tuple[int, str | None]] = collections.Counter()
    out = []
    for it in listing.items:  # listing order is sorted, so the subset is deterministic
        key = (it.label, it.official_split)
        if seen[key] < max_per_class:
            seen[key] += 1
            out.append(it)
    return out


@dataclasses.dataclass
class Listed:
    """The source after the caption policy: kept items (sample id = index here), their caption
    texts, the classes, skipped items and caption problems that did not skip an item."""

    items: list[Item]
    texts: list[str | None]
    classes: list[str]
    skipped: list[Skip]
    caption_notes: list[dict[str, Any]]


@dataclasses.dataclass
class Plan:
    rows: list[Planned]
    classes: list[str]
    texts: list[str]  # the caption table (unique texts, sorted)
    skipped: list[Skip]
    caption_notes: list[dict[str, Any]]
    near_duplicates: dict[str, Any] | None
    split_groups: dict[str, Any] | None


def _caption_texts(
    cfg: PreprocessConfig, items: list[Item], classes: list[str], skipped: list[Skip],
    notes: list[dict[str, Any]],
) -> tuple[list[Item], list[str | None]]:
    """Apply ``captions.missing``; returns the kept items and one caption text per item.

    A caption that is not valid UTF-8 or is empty counts as missing, under its own reason
    (``caption-encoding`` / ``caption-empty``): skipped with it, or — ``from-label`` — given the
    class template and listed in ``notes`` so the manifest counts it.
    """
    if not cfg.captions.enabled:
        return items, [None] * len(items)
    kept: list[Item] = []
    texts: list[str | None] = []
    for it in items:
        text = it.caption
        if text is None:
            policy = cfg.captions.missing
            problem = {"caption-encoding": "caption is not valid UTF-8",
                       "caption-empty": "caption is empty or whitespace only"}.get(
                it.caption_issue or "", "no caption")
            if policy == "error":
                has = "has no caption" if problem == "no caption" else f"{problem}: no caption"
                raise PreprocessError(
                    f"{it.path} {has} (captions.missing=error); give it one, or set "
                    "captions.missing=skip or from-label"
                )
            if policy == "from-label" and it.label >= 0:
                text = cfg.captions.templates[0].format(classes[it.label])
                if it.caption_issue:
                    notes.append({"path": it.path, "reason": it.caption_issue,
                                  "detail": f"{problem}; used the class template",
                                  "action": "from-label"})
            else:
                why = problem + (" and no label" if policy == "from-label" else "")
                if cfg.bad_input == "error":
                    raise PreprocessError(f"{it.path}: {why} (bad_input=error)")
                skipped.append(Skip(it.path, it.caption_issue or MISSING_CAPTION, why))
                continue
        kept.append(it)
        texts.append(text)
    return kept, texts


def list_items(cfg: PreprocessConfig) -> Listed:
    """Step 1 (driver, no Ray): list the source, take the subset, apply the caption policy."""
    from components.paths import resolve_path

    source = resolve_path(cfg.source.path) if cfg.source.path else None
    try:
        listing = list_source(cfg.source.kind, source, cfg.source.classes, cfg.bad_input,
                              cfg.split.group_by, cfg.source.label_depth)
    except SourceError as e:
        raise PreprocessError(str(e)) from None
    skipped = list(listing.skipped)
    notes: list[dict[str, Any]] = []
    items = _subset(listing, cfg.source.max_per_class)
    items, texts = _caption_texts(cfg, items, listing.classes, skipped, notes)
    return Listed(items, texts, listing.classes, skipped, notes)


def dedupe_enabled(cfg: PreprocessConfig) -> bool:
    return cfg.dedupe.exact or cfg.dedupe.near_threshold is not None


def hash_batch(batch: dict[str, np.ndarray], max_side: int, min_side: int) -> dict[str, Any]:
    """One Ray task of the content pass (and the in-process fallback): decode each item as it
    will be stored and hash it (``integrity.hash_item``); a failure becomes a row with a
    ``reason``."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "reason", "detail", "bytes_sha256", "pixels_sha256", "phash", "thumb")}
    for path in batch["path"]:
        try:
            data = read_item(str(path))
            rgb = decode_image(data, max_side=max_side, min_side=min_side)
            h = integrity.hash_item(data, rgb)
            row = ["", "", h.bytes_sha256, h.pixels_sha256, h.phash, h.thumb]
        except (ImageError, OSError) as e:
            row = [getattr(e, "reason", "unreadable-file"), str(e), "", "", 0,
                   bytes(integrity.THUMB**2)]
        for k, v in zip(cols, row, strict=True):
            cols[k].append(v)
    return {
        "idx": batch["idx"],
        **{k: np.array(cols[k], dtype=object) for k in ("reason", "detail", "bytes_sha256",
                                                         "pixels_sha256", "thumb")},
        "phash": np.array(cols["phash"], dtype=np.uint64),
    }


@dataclasses.dataclass
class Content:
    """Per listed item: its decode failure (``reason`` non-empty) or its hashes (see
    :mod:`components.data.integrity`)."""

    reason: list[str]
    detail: list[str]
    bytes_sha256: list[str]
    pixels_sha256: list[str]
    phash: np.ndarray  # [n] uint64
    thumbs: np.ndarray  # [n, 256] uint8

    @classmethod
    def from_columns(cls, cols: dict[str, Any]) -> Content:
        order = np.argsort(np.asarray(cols["idx"], dtype=np.int64), kind="stable")
        thumbs = np.frombuffer(b"".join(cols["thumb"][i] for i in order), np.uint8)
        return cls(
            [str(cols["reason"][i]) for i in order], [str(cols["detail"][i]) for i in order],
            [str(cols["bytes_sha256"][i]) for i in order],
            [str(cols["pixels_sha256"][i]) for i in order],
            np.asarray(cols["phash"], dtype=np.uint64)[order],
            thumbs.reshape(len(order), integrity.THUMB**2).copy(),
        )


def hash_local(cfg: PreprocessConfig, items: Sequence[Item]) -> Content:
    """The content pass in this process (small sources, unit tests)."""
    batch = {"idx": np.arange(len(items)), "path": np.array([it.path for it in items], object)}
    return Content.from_columns(hash_batch(batch, cfg.image.max_side, cfg.image.min_side))


def _content_key(cfg: PreprocessConfig, items: Sequence[Item]) -> str:
    stats = []
    for it in items:
        local = it.path.partition("#")[0].removeprefix(FASHION_SCHEME)
        try:
            st = os.stat(local) if "://" not in local else None
        except OSError:
            st = None
        stats.append((it.path, st.st_size if st else None, st.st_mtime_ns if st else None))
    return _digest({"items": stats, "image": [cfg.image.max_side, cfg.image.min_side],
                    "hash": "sha256+phash64+thumb16/1"})


def hash_with_ray(cfg: PreprocessConfig, items: Sequence[Item], out: Path) -> Content:
    """The content pass as Ray tasks of about ``ITEMS_PER_TASK`` items (:func:`map_tasks`);
    cached in ``content.npz`` (keyed by the items' paths, sizes and mtimes), so a resumed run
    does not hash again."""
    cache = out / "content.npz"
    key = _content_key(cfg, items)
    if cache.exists():
        with np.load(cache, allow_pickle=False) as z:
            if str(z["key"]) == key:
                return Content([str(x) for x in z["reason"]], [str(x) for x in z["detail"]],
                               [str(x) for x in z["bytes_sha256"]],
                               [str(x) for x in z["pixels_sha256"]],
                               z["phash"].copy(), z["thumbs"].copy())
    bounds = np.linspace(0, len(items), _task_count(len(items)) + 1).astype(int)
    batches = [{"idx": np.arange(a, b),
                "path": np.array([it.path for it in items[a:b]], dtype=object)}
               for a, b in itertools.pairwise(bounds) if b > a]
    parts = map_tasks(hash_batch, batches, max_side=cfg.image.max_side,
                      min_side=cfg.image.min_side)
    content = Content.from_columns({k: np.concatenate([part[k] for part in parts])
                                    for k in parts[0]})
    with replacing(cache) as tmp:
        np.savez(tmp, key=np.array(key), reason=np.array(content.reason, dtype=str),
                 detail=np.array(content.detail, dtype=str),
                 bytes_sha256=np.array(content.bytes_sha256, dtype=str),
                 pixels_sha256=np.array(content.pixels_sha256, dtype=str),
                 phash=content.phash, thumbs=content.thumbs)
    return content


def plan(
    cfg: PreprocessConfig, listed: Listed | None = None, content: Content | None = None
) -> Plan:
    """Everything decided before the shards are written: rows (sample id, split, shard),
    classes, the caption table, skips, and the near-duplicate / group report.

    With ``dedupe`` on, ``content`` (the items' hashes) is computed here, in this process, when
    not given (:func:`hash_with_ray` computes it in parallel for :func:`run`).
    """
    listed = listed or list_items(cfg)
    items, texts, skipped = listed.items, listed.texts, list(listed.skipped)
    keep = np.ones(len(items), dtype=bool)
    groups: np.ndarray | None = None
    pairs: np.ndarray | None = None
    split_groups: dict[str, Any] | None = None
    if items and dedupe_enabled(cfg):
        content = content or hash_local(cfg, items)
        for i, reason in enumerate(content.reason):
            if reason:
                if cfg.bad_input == "error":
                    raise PreprocessError(f"{items[i].path}: {content.detail[i]} (bad_input=error)")
                skipped.append(Skip(items[i].path, reason, content.detail[i]))
                keep[i] = False
        if cfg.dedupe.exact:
            _drop_exact(cfg, listed, content, keep, skipped)
        ok = np.flatnonzero(keep)
        uf = integrity.UnionFind(len(items))
        if cfg.dedupe.near_threshold is not None:
            _, local_pairs = integrity.near_duplicate_groups(
                content.phash[ok], content.thumbs[ok], cfg.dedupe.near_threshold,
                cfg.dedupe.near_max_diff)
            pairs = ok[local_pairs]
            for a, b in pairs.tolist():
                uf.union(a, b)
        if cfg.split.group_by is not None:
            split_groups = _group_by(cfg, items, ok, uf)
        groups = uf.labels()
    rows_idx = np.flatnonzero(keep)
    if not len(rows_idx):
        raise PreprocessError(
            f"source {cfg.source.kind} {cfg.source.path or ''} gave no usable items: every "
            f"item was skipped ({len(skipped)}); nothing to write"
        )
    table = sorted({t for i in rows_idx if (t := texts[i]) is not None})
    index = {t: i for i, t in enumerate(table)}
    sub = [items[i] for i in rows_idx]
    splits = assign_splits(
        [it.label for it in sub], [it.official_split for it in sub],
        cfg.split.val, cfg.split.test, cfg.split.seed,
        None if groups is None else groups[rows_idx].tolist(),
    )
    split_of = {int(i): s for i, s in zip(rows_idx, splits, strict=True)}
    rows: list[Planned] = []
    for split in SPLITS:
        members = [int(i) for i, s in zip(rows_idx, splits, strict=True) if s == split]
        for k in range(0, len(members), cfg.shard_size):
            name = f"{split}-{k // cfg.shard_size:05d}"
            for i in members[k : k + cfg.shard_size]:
                it, t = items[i], texts[i]
                cid = -1 if t is None else index[t]
                rows.append(Planned(i, it.path, it.label, cid, split, name))
    near = None if pairs is None else _near_report(cfg, items, pairs, split_of)
    if split_groups is not None and groups is not None:
        split_groups["units"] = len(set(groups[rows_idx].tolist()))
    return Plan(rows, listed.classes, table, skipped, listed.caption_notes, near, split_groups)


def _drop_exact(
    cfg: PreprocessConfig, listed: Listed, content: Content, keep: np.ndarray,
    skipped: list[Skip],
) -> None:
    """Exact duplicates: the first copy in listing order is kept, the others are skipped as
    ``duplicate-of`` it (``of`` names the kept copy)."""
    items = listed.items
    ok = np.flatnonzero(keep)
    dropped = integrity.exact_duplicates([content.pixels_sha256[i] for i in ok])
    for d, k in sorted(dropped.items()):
        di, ki = int(ok[d]), int(ok[k])
        same = ("same bytes" if content.bytes_sha256[di] == content.bytes_sha256[ki]
                else "same pixels after decoding and resizing")
        labels = "" if items[di].label == items[ki].label else (
            f"; its label {_label(listed.classes, items[di].label)} differs from the kept "
            f"copy's {_label(listed.classes, items[ki].label)}")
        if cfg.bad_input == "error":
            raise PreprocessError(
                f"{items[di].path}: {same} as {items[ki].path} (bad_input=error; "
                "dedupe.exact=false keeps exact duplicates)")
        skipped.append(Skip(items[di].path, DUPLICATE_OF, f"{same} as {items[ki].path}{labels}",
                            items[ki].path))
        keep[di] = False


def _group_by(
    cfg: PreprocessConfig, items: list[Item], ok: np.ndarray, uf: integrity.UnionFind
) -> dict[str, Any]:
    """Join items sharing a ``split.group_by`` value; the manifest's ``split_groups``."""
    first: dict[str, int] = {}
    for i in ok.tolist():
        g = items[i].group
        if g is not None:
            uf.union(first.setdefault(g, i), i)
    count = collections.Counter(items[i].group for i in ok.tolist() if items[i].group is not None)
    return {"column": cfg.split.group_by, "values": len(count), "items": sum(count.values()),
            "largest": max(count.values(), default=0)}


def _label(classes: list[str], label: int) -> str:
    return repr(classes[label]) if 0 <= label < len(classes) else "(none)"


def _near_report(
    cfg: PreprocessConfig, items: list[Item], pairs: np.ndarray, split_of: dict[int, str]
) -> dict[str, Any]:
    """The manifest's ``near_duplicates`` section (groups from near-duplicate pairs only)."""
    uf = integrity.UnionFind(len(items))
    for a, b in pairs.tolist():
        uf.union(a, b)
    found = integrity.groups_from_roots(uf.labels())
    found.sort(key=lambda g: (-len(g), g[0]))
    straddle = [(a, b) for a, b in pairs.tolist() if split_of.get(a) != split_of.get(b)]
    sizes = collections.Counter(len(g) for g in found)
    return {
        "method": "64-bit DCT pHash within threshold_bits, confirmed by 16x16 grey thumbnails "
                  "within max_diff grey levels (components/data/integrity.py)",
        "threshold_bits": cfg.dedupe.near_threshold,
        "max_diff": cfg.dedupe.near_max_diff,
        "pairs": len(pairs),
        "groups": len(found),
        "items": sum(len(g) for g in found),
        "sizes": {str(k): sizes[k] for k in sorted(sizes)},
        # Only official splits (kept as the source defines them) can separate a pair.
        "straddling_splits": {
            "pairs": len(straddle),
            "examples": [{"a": items[a].path, "a_split": split_of.get(a),
                          "b": items[b].path, "b_split": split_of.get(b)}
                         for a, b in straddle[:20]],
        },
        "listed": min(len(found), LISTED_MAX),
        "list": [[{"sample_id": i, "path": items[i].path, "split": split_of.get(i)} for i in g]
                 for g in found[:LISTED_MAX]],
    }


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _params(cfg: PreprocessConfig) -> dict[str, Any]:
    """What the bytes of a shard depend on (not paths of the output or Ray sizing)."""
    p = to_dict(cfg)
    for k in ("output", "keep_shards", "num_cpus"):
        p.pop(k)
    p["captions"].pop("actors")
    p["captions"].pop("batch_size")
    if cfg.captions.backend == "torch":
        p["captions"].pop("backend")  # the default: datasets built before it existed stay valid
    if cfg.source.label_depth == 1:
        p["source"].pop("label_depth")  # the default: datasets built before it existed stay valid
    if cfg.captions.class_descriptions:
        p["captions"]["class_descriptions_sha256"] = sha256_file(cfg.captions.class_descriptions)
    p["format"] = FORMAT
    return p


# ---------------------------------------------------------------------------------------------
# 3. Caption embeddings (Ray Data actor pool) and class embeddings.


def embed_captions(cfg: PreprocessConfig, texts: list[str], out: Path) -> np.ndarray:
    """``[len(texts), E]`` float32 rows, one per unique text; cached in ``captions.npz``."""
    import ray

    cache = out / "captions.npz"
    key = _digest({"texts": texts, "model": cfg.captions.model,
                   **({} if cfg.captions.backend == "torch" else
                      {"backend": cfg.captions.backend})})
    if cache.exists():
        with np.load(cache) as z:
            if str(z["key"]) == key:
                return np.asarray(z["embeddings"])
    # The ONNX backends run on CPU (the same encoder as the driver's class embeddings).
    use_gpu = cfg.captions.backend == "torch" and ray.cluster_resources().get("GPU", 0) > 0
    # Shortest first: each actor batch then holds captions of similar length, so the encoder
    # pads little (the table itself is sorted alphabetically); caption_id maps rows back.
    by_length = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    items = ray.data.from_items([{"caption_id": i, "text": texts[i]} for i in by_length])
    ds = items.map_batches(
        cap.CaptionEmbedder,
        fn_constructor_kwargs={"model": cfg.captions.model, "device": "cuda" if use_gpu else "cpu",
                               "backend": cfg.captions.backend},
        batch_size=cfg.captions.batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=cfg.captions.actors),
        num_gpus=1 if use_gpu else 0,
        num_cpus=1,
    )
    got = ds.to_pandas()
    emb = np.zeros((len(texts), len(got["embedding"].iloc[0])), dtype=np.float32)
    emb[got["caption_id"].to_numpy()] = np.stack(got["embedding"].to_numpy())
    with replacing(cache) as tmp:
        np.savez(tmp, key=np.array(key), embeddings=emb)
    return emb


def write_class_files(
    cfg: PreprocessConfig, classes: list[str], out: Path, model: Any = None
) -> dict[str, str]:
    """``classes.json``, and with captions the class embeddings and similarity (X-CLR)."""
    write_json(out / "classes.json", classes)
    if not cfg.captions.enabled or not classes:
        return {}
    desc = (
        cap.load_descriptions(cfg.captions.class_descriptions)
        if cfg.captions.class_descriptions
        else None
    )
    texts = cap.class_texts(classes, cfg.captions.templates, desc)
    model = model if model is not None else cap.load_encoder(cfg.captions.model,
                                                             backend=cfg.captions.backend)
    emb = cap.class_embeddings(model, texts)
    sim = (emb.astype(np.float64) @ emb.astype(np.float64).T).astype(np.float32)
    for name, arr in (("class_embeddings", emb), ("class_similarity", sim)):
        with replacing(out / f"{name}.npy") as tmp:
            np.save(tmp, arr)
    return {"class_embeddings": "class_embeddings.npy", "class_similarity": "class_similarity.npy"}


def caption_files(
    cfg: PreprocessConfig, plan_: Plan, out: Path, model: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """``captions.json`` (texts, token counts, the encoder's window) and ``caption_index.npy``
    (``[N, 2]`` sample id, caption id); returns the manifest's ``caption_checks`` section and
    the files. A caption longer than the window is embedded from its first tokens only
    (sentence-transformers truncates): each such item is counted as ``caption-truncated``."""
    limit = int(model.max_seq_length)
    tokens = cap.token_counts(model, plan_.texts)
    data = {"model": cfg.captions.model, "max_seq_length": limit, "texts": plan_.texts,
            "tokens": tokens}
    write_json(out / "captions.json", data)
    index = np.array([(r.sample_id, r.caption_id) for r in plan_.rows], dtype=np.int64)
    with replacing(out / "caption_index.npy") as tmp:
        np.save(tmp, index.reshape(-1, 2))
    long = [r for r in plan_.rows if r.caption_id >= 0 and tokens[r.caption_id] > limit]
    notes = list(plan_.caption_notes) + [
        {"path": r.path, "reason": CAPTION_TRUNCATED,
         "detail": f"{tokens[r.caption_id]} tokens; the text encoder reads the first {limit}",
         "action": "truncated"}
        for r in sorted(long, key=lambda r: r.sample_id)
    ]
    skipped = collections.Counter(
        s.reason for s in plan_.skipped if s.reason in ("caption-encoding", "caption-empty"))
    by_reason = collections.Counter(n["reason"] for n in notes) + skipped
    checks = {
        "max_seq_length": limit,
        "by_reason": dict(sorted(by_reason.items())),
        "skipped": dict(sorted(skipped.items())),
        "replaced_or_truncated": len(notes),
        "listed": min(len(notes), LISTED_MAX),
        "items": notes[:LISTED_MAX],
    }
    return checks, {"captions": "captions.json", "caption_index": "caption_index.npy"}


# ---------------------------------------------------------------------------------------------
# 4. Shard tasks (module-level so they pickle by reference).


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


def shard_specs(todo: dict[str, list[Planned]]) -> list[dict[str, Any]]:
    """One row per shard still to write (``todo``: shard name -> its rows), holding its rows'
    columns as lists; largest first so the last tasks to start are the short ones."""
    specs = [{"shard": name, **{c: [getattr(m, c) for m in members] for c in SHARD_COLUMNS}}
             for name, members in todo.items()]
    return sorted(specs, key=lambda sp: (-len(sp["path"]), sp["shard"]))


@dataclasses.dataclass(frozen=True)
class ShardSettings:
    """What every shard task needs besides its items (stored once, passed to each task)."""

    out_dir: str
    table_ref: list[Any]  # [the caption table's ObjectRef], or [] without captions
    digests: dict[str, str]  # shard name -> its plan digest (kept in the sidecar)
    image: dict[str, Any]  # the ImageConfig as a dict
    caption_dtype: str
    bad_input: str


def write_shard(spec: dict[str, Any], settings: ShardSettings) -> int:
    """One Ray task per :func:`shard_specs` row: decode and write its shard; returns the
    samples written."""
    import ray

    table = ray.get(settings.table_ref[0]) if settings.table_ref else None
    group = {"sample_id": np.asarray(spec["sample_id"], dtype=np.int64),
             "path": np.asarray(spec["path"], dtype=object),
             "label": np.asarray(spec["label"], dtype=np.int64),
             "caption_id": np.asarray(spec["caption_id"], dtype=np.int64)}
    group = decode_batch(group, settings.image["max_side"], settings.image["min_side"])
    return write_group(str(spec["shard"]), group, table, settings)


def write_group(name: str, group: dict[str, np.ndarray], table: np.ndarray | None,
                settings: ShardSettings) -> int:
    """Write shard ``name`` (its decoded rows, :func:`decode_batch`) and its sidecar; returns
    the samples written."""
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
        if table is not None:
            captions = table[group["caption_id"][ok]].astype(settings.caption_dtype)
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


# ---------------------------------------------------------------------------------------------
# Driver.


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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


def _task_count(n: int) -> int:
    """Ray tasks for a stage over ``n`` items: about ``ITEMS_PER_TASK`` items a task, and at
    least 4 per cluster CPU (load balance) while that leaves ≥ 1 item each."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(n, max(math.ceil(n / ITEMS_PER_TASK), 4 * cpus)))


def _call(fn: Callable[..., Any], arg: Any, kwargs: dict[str, Any]) -> Any:
    return fn(arg, **kwargs)


def map_tasks(fn: Callable[..., Any], args: Sequence[Any], **kwargs: Any) -> list[Any]:
    """``[fn(a, **kwargs) for a in args]``, one Ray task (1 CPU) per ``a``, all submitted at
    once; ``kwargs`` is stored once in the object store. A task's PreprocessError (which Ray
    wraps) is re-raised as is, and the tasks still queued or running are cancelled.

    Plain tasks, not a Ray Data stage: with every task queued, a worker's lease passes straight
    to the next task, where Ray Data's executor submits one only after it sees another finish
    (0.1–0.4 s idle per task on busy cores): the content pass over 24,000 photos took 13.5 s
    this way on 2 CPUs against 16.3–17.3 s as a Ray Data stage, and the same 27 s on 1 CPU
    (docs/benchmarks.md)."""
    import ray

    task = ray.remote(num_cpus=1)(_call)
    shared = ray.put(kwargs)
    refs = [task.remote(fn, a, shared) for a in args]
    try:
        return ray.get(refs)
    except BaseException as e:
        for r in refs:
            ray.cancel(r, force=False)
        cause = root_cause(e)
        if isinstance(cause, PreprocessError):
            raise PreprocessError(str(cause)) from None
        raise


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


def merge_splits(out: Path, sides: dict[str, dict[str, Any]]) -> dict[str, str | None]:
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
    merged.update({r["split"]: digest for r, digest in zip(rows, map_tasks(merge_split, rows),
                                                           strict=True)})
    return merged


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("simgraph", "ray", "ffcv", "torch", "numpy", "pillow", "sentence-transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _verified_manifest(out: Path, params_digest: str) -> dict[str, Any] | None:
    m = _read_json(out / MANIFEST)
    if not m or not m.get("complete") or m.get("params_digest") != params_digest:
        return None
    for split in m["splits"].values():
        f = out / split["file"]
        if split["samples"] and (not f.exists() or sha256_file(f) != split["sha256"]):
            return None
    return m


def run(cfg: PreprocessConfig, overwrite: bool = False, echo: bool = True) -> dict[str, Any]:
    """Build (or finish building) the dataset dir ``cfg.output``; return the manifest.

    Without ``overwrite`` the build resumes in place, and an output holding a dataset built
    with other parameters is refused (:class:`PreprocessError` naming ``--overwrite``). With
    ``overwrite`` the new dataset is built beside the current one (in ``<output>/.next/``) and
    swapped in only once it is complete and its split files verify: a build that fails, is
    killed or was given a mistyped source leaves the current dataset as it was
    (:func:`_swap`, the module docstring).

    A URI output (``s3://…``, ``gs://…``) is checked against the manifest already there, built
    in a local dir under the staging cache (resumable like any other) and then uploaded: the
    split files and class files first, ``manifest.json`` last, so readers never see a manifest
    whose files are missing (:func:`_run_uri`).

    Raises:
        PreprocessError: the source cannot be listed or gives nothing usable, another preprocess
            holds the output, the output holds a dataset built with other parameters (and
            ``overwrite`` is off), or an upload fails.
    """
    from components import storage
    from components.paths import resolve_path

    if storage.is_uri(cfg.output):
        return _run_uri(cfg, overwrite, echo)
    out = Path(resolve_path(cfg.output))
    params = _params(cfg)
    params_digest = _digest(params)
    out.mkdir(parents=True, exist_ok=True)  # for the lock file; nothing else before the lock
    with _exclusive(out):
        return _run_locked(cfg, out, params, params_digest, overwrite, echo)


# Entries of a dataset dir that a build writes (and an --overwrite replaces); anything else in
# the dir (``inspect/``, a user's notes) is left alone.
OWNED = ("shards", MANIFEST, "captions.npz", "classes.json", "class_embeddings.npy",
         "class_similarity.npy", "captions.json", "caption_index.npy", "content.npz",
         *(f"{s}.beton" for s in SPLITS))
NEXT = ".next"  # an --overwrite build in progress (same filesystem: renames are atomic)
PREVIOUS = ".previous"  # the replaced dataset's entries while a swap runs
SWAP_JOURNAL = ".swap.json"  # present exactly while a swap runs (see _swap)
STAGE_MARK = ".staging.json"  # in NEXT: {"params_digest": the parameters it is built with}


def _run_uri(cfg: PreprocessConfig, overwrite: bool, echo: bool) -> dict[str, Any]:
    """:func:`run` for a URI output.

    The remote ``manifest.json`` decides whether the output holds a dataset built with other
    parameters (the local build dir is only this host's cache: it may be missing, or stale
    after another host replaced the remote dataset). A remote dataset is replaced only after
    the local build is complete: its manifest is deleted first (readers then see no dataset
    rather than a manifest naming files being replaced), the files are uploaded, the new
    manifest last, then the old dataset's files the new one does not have are deleted.
    """
    from components import storage
    from components.data.staging import default_cache_dir

    uri = cfg.output
    params_digest = _digest(_params(cfg))
    remote = _remote_manifest(uri)
    if remote is not None and remote.get("params_digest") != params_digest and not overwrite:
        raise PreprocessError(
            f"{storage.display(uri)} holds a dataset built with other parameters; choose "
            "another output or pass --overwrite to rebuild it"
        )
    local = default_cache_dir() / "build" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    cached = _read_json(local / MANIFEST)
    # The cache holding other parameters than asked for is not the user's dataset (the remote
    # one, checked above, is): rebuild it (beside it, swapped in when complete).
    stale = isinstance(cached, dict) and cached.get("params_digest") != params_digest
    manifest = run(dataclasses.replace(cfg, output=str(local)), overwrite or stale, echo)
    try:
        names = [n for n in sorted(os.listdir(local))
                 if n not in (MANIFEST, "shards") and not n.startswith(".")
                 and (local / n).is_file()]
        if remote is not None and _canonical(remote) != _canonical(manifest):
            _delete_remote(storage.join(uri, MANIFEST))
        for name in names:
            storage.upload_file(local / name, storage.join(uri, name))
        if cfg.keep_shards:
            storage.upload_dir(local / "shards", storage.join(uri, "shards"))
        storage.upload_file(local / MANIFEST, storage.join(uri, MANIFEST))
        # Files of a dataset this one replaced (or of an upload that stopped half-way) that
        # the new manifest does not name: a split file it lacks, shards it did not keep.
        sent = {*names, MANIFEST, *(("shards",) if cfg.keep_shards else ())}
        for name in sorted(set(OWNED) & set(storage.list_dir(uri)) - sent):
            stale_path = storage.join(uri, name)
            if storage.is_dir(stale_path):
                storage.delete_dir(stale_path)
            else:
                _delete_remote(stale_path)
    except storage.StorageError as e:
        raise PreprocessError(f"built {local} but cannot upload it: {e}; re-run to upload "
                              "it again") from None
    if echo:
        print(f"uploaded to {storage.display(uri)}")
    return manifest


def _remote_manifest(uri: str) -> dict[str, Any] | None:
    """The manifest at the URI dataset dir ``uri``; ``None`` when there is none (or it is not
    JSON, as a local manifest that does not parse counts as none).

    Raises:
        PreprocessError: the URI cannot be read (no bucket, no credentials, ...).
    """
    from components import storage

    try:
        text = storage.read_text(storage.join(uri, MANIFEST))
    except storage.StorageNotFoundError:
        return None
    except storage.StorageError as e:
        raise PreprocessError(f"cannot check what {storage.display(uri)} holds: {e}") from None
    try:
        m = json.loads(text)
    except ValueError:
        return None
    return m if isinstance(m, dict) else None


def _canonical(manifest: dict[str, Any]) -> str:
    """``manifest`` as comparable text (a dict read back from JSON has lists for tuples)."""
    return json.dumps(manifest, sort_keys=True, default=str)


def _delete_remote(path: str) -> None:
    """Delete one object (nothing happens if it is not there); errors as ``StorageError``."""
    from components import storage

    fs, p = storage.resolve(path)
    try:
        fs.delete_file(p)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise storage.StorageError(f"cannot delete {storage.display(path)}: {e}") from None


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """One preprocess per output dir at a time (two would overwrite each other's shards)."""
    import fcntl

    with open(out / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PreprocessError(
                f"another simgraph preprocess is writing {out}; wait for it or stop it"
            ) from None
        yield


def _run_locked(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str,
    overwrite: bool, echo: bool,
) -> dict[str, Any]:
    """:func:`run` under the output's lock: finish or undo an interrupted swap, then build in
    place (resume) or, with ``overwrite``, in ``out/.next`` and swap it in."""
    _recover_swap(out, echo)
    stage = out / NEXT
    for d in (out, out / "shards", stage, stage / "shards"):
        remove_temporaries(d)  # left by a killed run; under the lock nobody else writes
    if not overwrite:
        old = _read_json(out / MANIFEST)
        if old and old.get("params_digest") != params_digest:
            raise PreprocessError(
                f"{out} holds a dataset built with other parameters; choose another output or "
                "pass --overwrite to rebuild it"
            )
        done_manifest = _verified_manifest(out, params_digest)
        if done_manifest is not None:
            _cleanup(out, cfg, done_manifest)
            if echo:
                print(f"simgraph preprocess: {out} is already complete and verified")
            return done_manifest
        listed = list_items(cfg)
        (out / "shards").mkdir(exist_ok=True)
        return _build(cfg, out, params, params_digest, listed, echo, out)

    manifest = _verified_manifest(stage, params_digest)
    if manifest is None:
        # List first: a mistyped source fails here, before the staging dir (which may hold a
        # resumable build with the right source) or the dataset is touched.
        listed = list_items(cfg)
        _open_stage(stage, params_digest, echo)
        _build(cfg, stage, params, params_digest, listed, echo, out)
        manifest = _verified_manifest(stage, params_digest)
        if manifest is None:
            raise PreprocessError(
                f"the new build in {stage} does not verify (a split file differs from its "
                f"manifest); {out} is unchanged; re-run with --overwrite to rebuild it")
    elif echo:
        print(f"simgraph preprocess: {stage} is complete and verified")
    _swap(out)
    if echo:
        print(f"simgraph preprocess: swapped the new build into {out}")
    return manifest


def _open_stage(stage: Path, params_digest: str, echo: bool) -> None:
    """Make ``stage`` ready for a build with ``params_digest``: one built (or half built) with
    other parameters, or without a mark saying which, is deleted; one with the same
    parameters is kept, so its finished shards are reused (resume)."""
    mark = _read_json(stage / STAGE_MARK)
    resume = isinstance(mark, dict) and mark.get("params_digest") == params_digest
    if not resume:
        _remove(stage)
    elif echo:
        print(f"simgraph preprocess: resuming the --overwrite build in {stage}")
    (stage / "shards").mkdir(parents=True, exist_ok=True)
    if not resume:  # the mark goes last: a stage without one is deleted as unknown
        write_json(stage / STAGE_MARK, {"params_digest": params_digest})


# ---------------------------------------------------------------------------------------------
# The swap of an --overwrite build into the dataset dir.
#
# On disk while it runs (all under the output's lock, all renames within one filesystem):
#
#   out/.swap.json   {"params_digest": the new build's, "new": [entries of .next to move in],
#                     "old": [entries of out to move aside]}; written (atomically) before the
#                     first rename, deleted after the last: its presence means "swap running".
#   phase 1          old entries out/<name> -> out/.previous/<name>, manifest.json first (a
#                    reader then finds no manifest, never one naming files being moved);
#   phase 2          new entries out/.next/<name> -> out/<name>, manifest.json last;
#   done             .swap.json deleted, then .previous/ and the rest of .next/ (its mark).
#
# Phase 2 starts only after phase 1 has moved every old entry, so for a journal's name:
# .previous/<name> absent -> out/<name> (if any) is the old entry; .next/<name> present -> the
# new entry has not moved; .next/<name> absent and (.previous/<name> present or <name> not
# old) -> out/<name> is the new entry. _recover_swap reads the state back from these rules.


def _move(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` (the one step of a swap; tests inject faults here)."""
    os.rename(src, dst)


def _fsync_dir(path: Path) -> None:
    """Make the renames in ``path`` durable (best effort: not every filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _manifest_first(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: (n != MANIFEST, n))


def _manifest_last(names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: (n == MANIFEST, n))


def _swap(out: Path) -> None:
    """Swap the complete, verified build in ``out/.next`` into ``out`` (the layout above);
    the replaced entries are deleted. Call under the output's lock. Killed at any point, the
    next :func:`run` on ``out`` finishes it (:func:`_recover_swap`)."""
    stage = out / NEXT
    new = sorted(n for n in os.listdir(stage) if not n.startswith("."))
    old = sorted(n for n in set(OWNED) | set(new) if os.path.lexists(out / n))
    manifest = _read_json(stage / MANIFEST)
    if os.path.lexists(out / PREVIOUS):  # only a finished swap's leftovers (see _recover_swap)
        shutil.rmtree(out / PREVIOUS)
    journal = {"params_digest": manifest["params_digest"], "new": new, "old": old}
    write_json(out / SWAP_JOURNAL, journal)
    _fsync_dir(out)
    _complete_swap(out, journal)


def _complete_swap(out: Path, journal: dict[str, Any]) -> None:
    """Run (or finish) the two phases of the swap ``journal`` describes, then clean up."""
    stage, prev = out / NEXT, out / PREVIOUS
    prev.mkdir(exist_ok=True)
    for name in _manifest_first(journal["old"]):
        if not os.path.lexists(prev / name) and os.path.lexists(out / name):
            _move(out / name, prev / name)
    _fsync_dir(prev)
    _fsync_dir(out)
    for name in _manifest_last(journal["new"]):
        if os.path.lexists(stage / name):
            # Every old entry is aside by now: something here is not part of any dataset.
            _remove(out / name)
            _move(stage / name, out / name)
    _fsync_dir(out)
    _discard_swap(out)
    shutil.rmtree(stage, ignore_errors=True)  # its mark (and hidden temporaries) only


def _discard_swap(out: Path) -> None:
    """The end of a swap (or of its roll-back): the journal first, then the leftovers."""
    (out / SWAP_JOURNAL).unlink(missing_ok=True)
    _fsync_dir(out)
    shutil.rmtree(out / PREVIOUS, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _new_entry(out: Path, journal: dict[str, Any], name: str) -> Path | None:
    """Where the swap's new entry ``name`` is now (``.next/<name>`` or ``out/<name>``), or
    ``None`` when it is in neither (the rules above the swap functions)."""
    if os.path.lexists(out / NEXT / name):
        return out / NEXT / name
    moved_in = name not in journal["old"] or os.path.lexists(out / PREVIOUS / name)
    return out / name if moved_in and os.path.lexists(out / name) else None


def _swap_verified(out: Path, journal: dict[str, Any]) -> bool:
    """The swap's new dataset is whole: its manifest is complete with the journal's params
    digest, every new entry exists, and every split file's sha256 matches the manifest."""
    where = _new_entry(out, journal, MANIFEST)
    m = _read_json(where) if where is not None else None
    if (not isinstance(m, dict) or not m.get("complete")
            or m.get("params_digest") != journal.get("params_digest")):
        return False
    if any(_new_entry(out, journal, n) is None for n in journal["new"]):
        return False
    for split in m["splits"].values():
        if split["samples"]:
            f = _new_entry(out, journal, split["file"])
            if f is None or sha256_file(f) != split["sha256"]:
                return False
    return True


def _recover_swap(out: Path, echo: bool) -> None:
    """Under the output's lock, before anything else: finish a swap a killed run left half
    done when its new dataset verifies, else put the previous dataset back (the new entries
    go back to ``.next``, which a later ``--overwrite`` with the same parameters resumes).
    A ``.previous`` without a journal, and a ``.next`` holding nothing but its mark, are a
    finished swap's leftovers and are deleted.

    Raises:
        PreprocessError: ``.swap.json`` is there but is not a journal (it is written
            atomically, so something else wrote it): the message says what to compare.
    """
    journal = _read_json(out / SWAP_JOURNAL)
    if not isinstance(journal, dict):
        if os.path.lexists(out / SWAP_JOURNAL):  # written atomically: not ours, or damaged
            raise PreprocessError(
                f"{out / SWAP_JOURNAL} is not a swap journal; compare {out} with "
                f"{out / PREVIOUS} and {out / NEXT}, fix it by hand, then delete it")
        if os.path.lexists(out / PREVIOUS):
            shutil.rmtree(out / PREVIOUS)
        stage = out / NEXT
        if stage.is_dir() and all(n.startswith(".") for n in os.listdir(stage)):
            shutil.rmtree(stage)  # a finished swap's (its mark): nothing to resume
        return
    if _swap_verified(out, journal):
        _complete_swap(out, journal)
        if echo:
            print(f"simgraph preprocess: finished swapping the new build into {out} "
                  "(an earlier run was interrupted)")
        return
    stage, prev = out / NEXT, out / PREVIOUS
    stage.mkdir(exist_ok=True)
    for name in _manifest_first(journal["new"]):  # the new manifest leaves first
        where = _new_entry(out, journal, name)
        if where == out / name:
            _move(where, stage / name)
    _fsync_dir(out)
    if prev.is_dir():
        for name in _manifest_last(os.listdir(prev)):  # the old manifest comes back last
            if not os.path.lexists(out / name):
                _move(prev / name, out / name)
    _fsync_dir(out)
    _discard_swap(out)
    if echo:
        print(f"simgraph preprocess: an interrupted swap's new build in {stage} does not "
              f"verify; restored the previous dataset in {out}")


def _build(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str,
    listed: Listed, echo: bool, dest: Path,
) -> dict[str, Any]:
    """Steps 2–5 into ``out`` (the dataset dir, or its ``.next`` staging dir for ``dest``),
    reusing the shards already there that match the plan; the manifest is written last."""
    import ray

    if echo:
        where = f"{dest}" if out == dest else f"{dest} (building in {out})"
        print(f"simgraph preprocess: listed {len(listed.items)} items from {cfg.source.kind} "
              f"source -> {where}", flush=True)
    with ray_session(cfg.num_cpus):
        content = None
        if listed.items and dedupe_enabled(cfg):
            t0 = time.perf_counter()
            content = hash_with_ray(cfg, listed.items, out)
            if echo:
                print(f"simgraph preprocess: hashed {len(listed.items)} items "
                      f"in {time.perf_counter() - t0:.1f} s")
        p = plan(cfg, listed, content)
        rows, classes, texts = p.rows, p.classes, p.texts
        digests = {}
        by_shard: dict[str, list[Planned]] = collections.defaultdict(list)
        for r in rows:
            by_shard[r.shard].append(r)
        for name, members in by_shard.items():
            # Field tuples as dataclasses.astuple gives them (same digest), without its deep copy.
            digests[name] = _digest([params_digest, [_fields(m) for m in members]])
        done = {n: s for n in by_shard if (s := _shard_done(out, n, digests[n])) is not None}
        todo = {n: members for n, members in by_shard.items() if n not in done}
        n_todo = sum(len(members) for members in todo.values())
        if echo:
            print(f"simgraph preprocess: {len(rows)} items in {len(by_shard)} shards "
                  f"({len(done)} already complete), {len(texts)} unique captions")

        model = (cap.load_encoder(cfg.captions.model, backend=cfg.captions.backend)
                 if cfg.captions.enabled else None)
        class_files = write_class_files(cfg, classes, out, model)
        checks: dict[str, Any] | None = None
        if model is not None:
            checks, files = caption_files(cfg, p, out, model)
            class_files.update(files)
        t0 = time.perf_counter()
        table = embed_captions(cfg, texts, out) if cfg.captions.enabled and todo else None
        if echo and table is not None:
            took = time.perf_counter() - t0
            print(f"simgraph preprocess: {len(texts)} caption embeddings in {took:.1f} s "
                  f"({len(texts) / max(took, 1e-9):.0f}/s, reused when cached)", flush=True)
        t0 = time.perf_counter()
        if todo:
            specs = shard_specs(todo)
            # one shard per task: no shuffle, each task writes what it read
            map_tasks(write_shard, specs, settings=ShardSettings(
                out_dir=str(out), table_ref=[ray.put(table)] if table is not None else [],
                digests=digests, image=dataclasses.asdict(cfg.image),
                caption_dtype=cfg.captions.dtype, bad_input=cfg.bad_input))
            if echo:
                took = time.perf_counter() - t0
                print(f"simgraph preprocess: decoded and wrote {n_todo} images in "
                      f"{len(specs)} shards in {took:.1f} s ({n_todo / max(took, 1e-9):.0f} "
                      "images/s)", flush=True)
        sides = dict(done)
        for name in todo:
            # Just written: the task hashed the file it renamed; the merge verifies it again.
            side = _shard_done(out, name, digests[name], verify=False)
            if side is None:
                raise PreprocessError(f"shard {name} did not complete; re-run to continue")
            sides[name] = side
        t0 = time.perf_counter()
        merged = merge_splits(out, sides)
        if echo:
            print(f"simgraph preprocess: merged {len(sides)} shards into "
                  f"{len(merged)} split files in {time.perf_counter() - t0:.1f} s", flush=True)
        dim = int(table.shape[1]) if table is not None else _stored_dim(out, by_shard)

    manifest = _assemble(cfg, out, params, params_digest, p, sides, merged, class_files, dim,
                         checks)
    _cleanup(out, cfg, manifest)
    if echo:
        print(summary(manifest))
    return manifest


def _stored_dim(out: Path, by_shard: dict[str, list[Planned]]) -> int:
    cache = out / "captions.npz"
    if cache.exists():
        with np.load(cache) as z:
            return int(z["embeddings"].shape[1])
    return 0


def _assemble(
    cfg: PreprocessConfig, out: Path, params: dict[str, Any], params_digest: str, p: Plan,
    sides: dict[str, dict[str, Any]], merged: dict[str, str | None], class_files: dict[str, str],
    dim: int, caption_checks: dict[str, Any] | None,
) -> dict[str, Any]:
    classes, texts = p.classes, p.texts
    splits: dict[str, Any] = {}
    for split in SPLITS:
        names = _split_shards(sides, split)
        per_class: collections.Counter[str] = collections.Counter()
        for n in names:
            for lab, c in sides[n]["labels"].items():
                per_class[classes[int(lab)] if int(lab) >= 0 else "unlabelled"] += c
        splits[split] = {
            "file": f"{split}.beton", "samples": sum(sides[n]["samples"] for n in names),
            "sha256": merged[split],
            "per_class": dict(sorted(per_class.items())), "shards": names,
        }
    all_skipped = [skip_record(s) for s in p.skipped]
    for name in sorted(sides):
        all_skipped += sides[name]["skipped"]
    if not any(s["samples"] for s in splits.values()):
        raise PreprocessError(
            f"every item was skipped ({len(all_skipped)}): see the reasons in "
            f"{out / 'shards'}/*.json; nothing to train on"
        )
    fields: dict[str, Any] = {
        shards.IMAGE: {"type": "RGBImageField", "write_mode": cfg.image.write_mode,
                       "max_side": cfg.image.max_side},
        shards.LABEL: {"type": "IntField", "dtype": "int64", "unlabelled": -1},
        shards.SAMPLE_ID: {"type": "IntField", "dtype": "int64"},
    }
    if cfg.captions.enabled:
        fields[shards.CAPTION] = {"type": "NDArrayField", "dtype": cfg.captions.dtype,
                                  "shape": [dim], "normalised": True,
                                  # numba has no float16: FFCV stores its bit pattern
                                  "stored_as": "int16" if cfg.captions.dtype == "float16"
                                  else "float32"}
    manifest = {
        "format": FORMAT,
        "complete": True,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "params": params,
        "params_digest": params_digest,
        "classes": classes,
        "splits": splits,
        "shards": [
            {k: v for k, v in sides[n].items() if k not in ("skipped", "digest")}
            for n in sorted(sides)
        ],
        "fields": fields,
        "encoder": (
            {"model": cfg.captions.model, "path": cap.resolve_model(cfg.captions.model),
             "dim": dim, "unique_captions": len(texts)}
            if cfg.captions.enabled else None
        ),
        "class_files": class_files,
        "skipped": {
            "total": len(all_skipped),
            "by_reason": dict(collections.Counter(s["reason"] for s in all_skipped)),
            "items": all_skipped,
        },
        "near_duplicates": p.near_duplicates,
        "split_groups": p.split_groups,
        "caption_checks": caption_checks,
        "versions": versions(),
    }
    write_json(out / MANIFEST, manifest)
    return manifest


def _cleanup(out: Path, cfg: PreprocessConfig, manifest: dict[str, Any]) -> None:
    """After the manifest is written: drop per-shard files unless asked to keep them."""
    if cfg.keep_shards:
        return
    for p in (out / "shards").glob("*.beton*"):
        p.unlink()


def summary(manifest: dict[str, Any]) -> str:
    lines = ["", f"{'split':<8}{'samples':>10}  classes"]
    for name, s in manifest["splits"].items():
        lines.append(f"{name:<8}{s['samples']:>10}  {len(s['per_class'])}")
    sk = manifest["skipped"]
    lines.append(f"skipped: {sk['total']}" + (
        " (" + ", ".join(f"{r}: {n}" for r, n in sorted(sk["by_reason"].items())) + ")"
        if sk["total"] else ""))
    return "\n".join(lines)


__all__ = ["FORMAT", "MANIFEST", "PreprocessError", "UNKNOWN_LABEL", "plan", "run", "summary"]
