"""Building a dataset dir: images → FFCV ``.beton`` splits + caption embeddings (``simgraph
preprocess``, :mod:`pipelines.preprocess`, and ``simgraph run`` drive :func:`run`).

Reads top to bottom as the data flow in docs/design.md, one module of this package per stage:

1. list the source on the driver (paths, labels, captions) and apply the caption policy
   (invalid UTF-8 and empty captions are counted, never silent): ``listing.py``;
2. hash every item's stored pixels (Ray tasks; ``components/data/integrity.py``):
   ``hashing.py``; drop exact duplicates (``duplicate-of``), group near duplicates (and
   ``split.group_by`` values), then assign stratified splits group by group and cut each split
   into shards of ``shard_size``: ``planning.py``;
3. embed the unique captions and the class captions (Ray Data actor pool, one model each):
   ``embedding.py``;
4. one Ray task per shard: read → validate → decode/RGB/resize → write the shard (temp
   name, then rename, with a sidecar JSON holding its checksum and skipped items):
   ``writing.py``;
5. merge each split's shards into ``<split>.beton`` (one Ray task per split): ``merging.py``;
   and write ``manifest.json`` last: ``manifest.py``.

``driver.py`` runs steps 2–5 in that order into one dir, timing each stage on the build's
clock (``timing.py``: :class:`BuildTimes`, the manifest's ``build_seconds``).
``transaction.py`` holds :func:`run`: the output's lock, resume or refusal, the
``--overwrite`` staging dir and its swap, the recovery of an interrupted swap, URI outputs.
``tasks.py`` is the Ray task helper the image stages share (:func:`map_tasks`), run on the
nodes ``placement.py`` finds seeing the build dir and the source (all, on a shared
filesystem); ``common.py``
what every stage shares (:class:`PreprocessError`, the digest, reading a JSON file).

Every image stage runs as plain Ray tasks of hundreds of items or more, all queued at once
(:func:`map_tasks`): per-task overhead, a Ray Data executor's gaps between tasks and a shuffle
would otherwise bound how far more CPUs speed a build up (``bench/preprocess.py``). The
caption stage is a Ray Data actor pool (one model per actor, batches streamed to it). Ray
pickles a task's function by reference to its module: the task functions live at module level
in this package (``hashing.hash_batch``, ``writing.write_shard``, ``merging.merge_split``,
``tasks._call``), which every worker imports by the same path.

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
    caption_embeddings.npy + .json   (the embedded caption table and its cache key; a re-run
                                      reuses it; captions.npz before 2026-11-27)
    captions.json  caption_index.npy   (caption texts and token counts; sample id -> caption id)
    content.npz    (every item's content hashes; a resumed run reuses them)
    source.json.gz (the source as listed: every item's path, label, caption and file
                    metadata; a re-run refuses a complete dataset whose source changed since,
                    naming what changed: ``source_record.py``)
    .lock          (held by the one preprocess writing here, naming it: host, pid, since;
                    everything below happens under it)
    .simgraph-owner.json  (only until the first manifest: the folder was new or empty, so a
                    killed first build is resumed; a non-empty folder without a manifest or
                    this mark is refused, nothing in it touched)
    .next/         (an --overwrite build: the same layout, plus .staging.json naming its
                    params digest; gone once swapped in)
    .swap.json  .previous/   (only while a swap runs: the journal, the replaced entries; a run
                    killed mid-swap is finished, or rolled back when .next/ does not verify,
                    by the next run here — see ``transaction._swap``)

A reader sees either the old manifest with the old files, no manifest (for the moment of the
swap), or the new manifest with the new files: the old manifest is moved aside first and the
new one moved in last.

The names below are the package's interface. Each is defined in its stage's module and looked
up there by the code that calls it: to replace one in a test, patch that module
(``driver.merge_splits``, ``transaction._move``), not this package.
"""

from __future__ import annotations

from components.data.build.common import LISTED_MAX, PreprocessError
from components.data.build.embedding import (
    CAPTION_TRUNCATED,
    caption_files,
    embed_captions,
    write_class_files,
)
from components.data.build.hashing import (
    Content,
    dedupe_enabled,
    hash_batch,
    hash_local,
    hash_with_ray,
)
from components.data.build.listing import Listed, list_items
from components.data.build.manifest import summary, versions
from components.data.build.merging import merge_split, merge_splits
from components.data.build.planning import DUPLICATE_OF, Plan, Planned, plan
from components.data.build.tasks import ITEMS_PER_TASK, map_tasks
from components.data.build.timing import BuildTimes
from components.data.build.transaction import (
    NEXT,
    OWNED,
    PREVIOUS,
    STAGE_MARK,
    SWAP_JOURNAL,
    run,
)
from components.data.build.writing import (
    SHARD_COLUMNS,
    ShardSettings,
    decode_batch,
    shard_specs,
    write_group,
    write_shard,
)
from components.data.shards import FORMAT, MANIFEST
from components.data.sources import UNKNOWN_LABEL

__all__ = [
    "CAPTION_TRUNCATED", "DUPLICATE_OF", "FORMAT", "ITEMS_PER_TASK", "LISTED_MAX", "MANIFEST",
    "NEXT", "OWNED", "PREVIOUS", "SHARD_COLUMNS", "STAGE_MARK", "SWAP_JOURNAL",
    "UNKNOWN_LABEL", "BuildTimes", "Content", "Listed", "Plan", "Planned", "PreprocessError",
    "ShardSettings", "caption_files", "decode_batch", "dedupe_enabled", "embed_captions",
    "hash_batch", "hash_local", "hash_with_ray", "list_items", "map_tasks", "merge_split",
    "merge_splits", "plan", "run", "shard_specs", "summary", "versions", "write_class_files",
    "write_group", "write_shard",
]
