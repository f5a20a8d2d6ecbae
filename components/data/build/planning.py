"""Step 2b (driver, no Ray): everything decided before a shard is written (:func:`plan`, a
:class:`Plan`: its rows as columns, :class:`Planned` objects only on demand). Exact
duplicates are dropped (``duplicate-of``), near duplicates and ``split.group_by`` values
grouped, stratified splits assigned group by group and each split cut into shards of
``shard_size``; the manifest's ``near_duplicates`` and ``split_groups`` reports. Also the build
parameters a dataset's ``params_digest`` is taken over (:func:`_params`: what the bytes of a
shard depend on)."""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from components.config import PreprocessConfig, to_dict
from components.config.preprocess import SHARD_KEYS
from components.data import integrity
from components.data.build.common import LISTED_MAX, PreprocessError
from components.data.build.hashing import Content, dedupe_enabled, hash_local
from components.data.build.listing import NO_CAPTION_FROM_SOURCE, Listed, list_items
from components.data.build.placement import Placement
from components.data.build.tasks import iter_tasks
from components.data.build.timing import BuildTimes
from components.data.caption_texts import CaptionTexts
from components.data.hash_search import KeyMapper
from components.data.shards import FORMAT
from components.data.sources import Skip
from components.data.splits import SPLITS, assign_split_codes
from components.io.files import sha256_file

DUPLICATE_OF = "duplicate-of"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Planned:
    sample_id: int
    path: str
    label: int
    caption_id: int  # row of the caption table, -1 when captions are disabled
    split: str
    shard: str


def _fields(row: Planned) -> tuple[Any, ...]:
    return tuple(getattr(row, f.name) for f in dataclasses.fields(row))


@dataclasses.dataclass(kw_only=True)
class Plan:
    """The rows to write, as columns in write order (split by split, shard by shard: shard
    ``k``'s rows are ``shard_bounds[k]:shard_bounds[k + 1]``), no object per row; ``rows``
    builds the :class:`Planned` objects on demand (tests, small tools)."""

    sample_ids: np.ndarray  # [m] int64: index into paths (the listing)
    labels: np.ndarray  # [m] int32
    caption_ids: np.ndarray  # [m] int32: row of the caption table, -1 without captions
    shard_names: list[str]  # "<split>-<k:05d>", in write order
    shard_bounds: np.ndarray  # [shards + 1] int64
    paths: Sequence[str]  # the listed items' paths (by sample id)
    classes: list[str]
    texts: Sequence[str]  # the caption table (unique texts, sorted; CaptionTexts for a shard
    # source's: an index into the listing's)
    skipped: list[Skip]
    caption_notes: list[dict[str, Any]]
    near_duplicates: dict[str, Any] | None
    split_groups: dict[str, Any] | None

    def __len__(self) -> int:
        return len(self.sample_ids)

    def shard(self, k: int) -> slice:
        """The rows of shard ``k``."""
        return slice(int(self.shard_bounds[k]), int(self.shard_bounds[k + 1]))

    def shard_fields(self, k: int) -> list[list[Any]]:
        """Shard ``k``'s rows as :func:`_fields` gives them (sample id, path, label, caption
        id, split, shard)."""
        rows, name = self.shard(k), self.shard_names[k]
        split = name.rsplit("-", 1)[0]
        return [[i, self.paths[i], lab, c, split, name] for i, lab, c in zip(
            self.sample_ids[rows].tolist(), self.labels[rows].tolist(),
            self.caption_ids[rows].tolist(), strict=True)]

    @property
    def rows(self) -> list[Planned]:
        return [Planned(sample_id=i, path=p, label=lab, caption_id=c, split=sp, shard=sh)
                for k in range(len(self.shard_names))
                for i, p, lab, c, sp, sh in self.shard_fields(k)]


NEAR_TASKS_MIN = 250_000  # kept items from which the near-duplicate search runs as Ray tasks


def plan(
    cfg: PreprocessConfig, listed: Listed | None = None, content: Content | None = None,
    times: BuildTimes | None = None, placement: Placement | None = None,
) -> Plan:
    """Everything decided before the shards are written: rows (sample id, split, shard),
    classes, the caption table, skips, and the near-duplicate / group report.

    With ``dedupe`` on, ``content`` (the items' hashes) is computed here, in this process, when
    not given (:func:`hash_with_ray` computes it in parallel for :func:`run`). ``times``: the
    build's clock; the near-duplicate search is timed on it as its own stage (as are the
    listing and the content pass when they run here). ``placement``: the build's Ray nodes
    (a Ray session is open): from :data:`NEAR_TASKS_MIN` kept items the near-duplicate
    search's keys are searched in Ray tasks there, two per CPU (the same pairs; its work off
    the driver); None: here.
    """
    clock = times if times is not None else BuildTimes()
    if listed is None:
        with clock.stage("listing"):
            listed = list_items(cfg)
    paths, skipped = listed.paths, list(listed.skipped)
    n = len(listed)
    keep = np.ones(n, dtype=bool)
    pairs: np.ndarray | None = None
    split_groups: dict[str, Any] | None = None
    # pairs of kept items that share a split, as positions in ``ok`` (the kept rows)
    joined = [np.zeros((0, 2), dtype=np.int64)]
    if n and dedupe_enabled(cfg):
        if content is None:
            with clock.stage("hashing"):
                content = hash_local(cfg, paths)
        for i, reason, detail in content.failures():
            if cfg.bad_input == "error":
                raise PreprocessError(f"{paths[i]}: {detail} (bad_input=error)")
            skipped.append(Skip(path=paths[i], reason=reason, detail=detail))
            keep[i] = False
        if cfg.dedupe.exact:
            _drop_exact(cfg, listed, content, keep, skipped)
    ok = np.flatnonzero(keep)
    if content is not None and cfg.dedupe.near_threshold is not None:
        spread: dict[str, Any] = {}
        if placement is not None and len(ok) >= NEAR_TASKS_MIN:
            spread = {"tasks": 2 * max(1, int(placement.cpus())),
                      "map_keys": key_mapper(placement)}
        with clock.stage("near_duplicates"):
            local_pairs = integrity.near_duplicate_pairs(
                content.phash[ok], content.thumbs, cfg.dedupe.near_threshold,
                cfg.dedupe.near_max_diff, rows=ok,  # the kept thumbnails, not a copy
                **spread)
        pairs = ok[local_pairs]
        joined.append(local_pairs)
    if n and cfg.split.group_by is not None:  # with deduplication or without
        split_groups, same_group = _group_by(cfg, listed.groups, ok)
        joined.append(np.searchsorted(ok, same_group))
    joined_pairs = np.concatenate(joined)
    # each kept row's group as the position of its first member (singletons: its own), which
    # assign_split_codes takes without a sort or a str per item
    groups = integrity.group_roots(len(ok), joined_pairs)
    if not len(ok):
        raise PreprocessError(
            f"source {cfg.source.kind} {cfg.source.path or ''} gave no usable items: every "
            f"item was skipped ({_why_skipped(skipped, listed.caption_notes)}); nothing to "
            "write"
        )
    # the caption table: the kept rows' texts, sorted (as sorted() orders str); each item's id
    # into it (-1: none). Sorted as an array of the texts' references: no dict of every text.
    cids = listed.caption_ids
    used = np.unique(cids[ok])
    used = used[used >= 0]
    table: Sequence[str]
    if isinstance(listed.captions, CaptionTexts) and listed.captions.rows is None:
        # sorted by Arrow: an index into the listing's buffer, no str per caption
        sorted_table = listed.captions.sorted_subset(used)
        assert sorted_table.rows is not None
        table, sorted_ids = sorted_table, sorted_table.rows
    else:
        texts = np.empty(len(used), dtype=object)
        texts[:] = [listed.captions[c] for c in used.tolist()]
        by_text = np.argsort(texts, kind="stable")
        table = texts[by_text].tolist()
        del texts
        sorted_ids = used[by_text]
    remap = np.full(len(listed.captions) + 1, -1, dtype=np.int32)  # [-1] stays -1
    remap[sorted_ids] = np.arange(len(sorted_ids), dtype=np.int32)
    official = listed.official
    # each kept item's index into SPLITS (no str or list per item without official splits)
    split_code = assign_split_codes(
        listed.labels[ok],
        None if official is None else [official[i] for i in ok.tolist()],
        cfg.split.val, cfg.split.test, cfg.split.seed,
        # with official splits and no pairs, the ungrouped walk (the same answer, no lists)
        groups if official is None or len(joined_pairs) else None,
    )
    order, names, bounds = [], [], [0]
    for code, split in enumerate(SPLITS):
        members = ok[split_code == code]
        for k in range(0, len(members), cfg.shard_size):
            names.append(f"{split}-{k // cfg.shard_size:05d}")
            order.append(members[k : k + cfg.shard_size])
            bounds.append(bounds[-1] + len(order[-1]))
    sample_ids = np.concatenate(order).astype(np.int64) if order else np.zeros(0, np.int64)
    near = None
    if pairs is not None:
        split_of = np.full(n, -1, dtype=np.int8)  # [n] index into SPLITS, -1: not kept
        split_of[ok] = split_code
        near = _near_report(cfg, paths, pairs, split_of)
    if split_groups is not None:
        # units: the groups' first members (a root is its own)
        split_groups["units"] = int(np.count_nonzero(groups == np.arange(len(groups))))
    return Plan(sample_ids=sample_ids, labels=listed.labels[sample_ids].astype(np.int32),
                caption_ids=remap[cids[sample_ids]], shard_names=names,
                shard_bounds=np.array(bounds, dtype=np.int64), paths=paths,
                classes=listed.classes, texts=table, skipped=skipped,
                caption_notes=listed.caption_notes, near_duplicates=near,
                split_groups=split_groups)


def _why_skipped(skipped: Sequence[Skip], notes: Sequence[dict[str, Any]],
                 reasons: int = 3) -> str:
    """``skipped``'s count, by reason (most first), the first skip of each of the ``reasons``
    commonest and the source-wide caption ``notes``: what to fix when nothing is left to
    write."""
    counts = collections.Counter(s.reason for s in skipped)
    first: dict[str, Skip] = {}
    for s in skipped:
        first.setdefault(s.reason, s)
    top = counts.most_common()
    parts = [f"{len(skipped)}: " + ", ".join(f"{r}: {n}" for r, n in top)]
    parts += [f"first {r}: {first[r].path}: {first[r].detail}" for r, _ in top[:reasons]]
    parts += [n["detail"] for n in notes if n.get("reason") == NO_CAPTION_FROM_SOURCE]
    return "; ".join(parts)


def key_mapper(placement: Placement) -> KeyMapper:
    """The :data:`~components.data.hash_search.KeyMapper` a build's near-duplicate search
    runs its key groups with from :data:`NEAR_TASKS_MIN` items: Ray tasks on ``placement``'s
    nodes (the hashes put in the object store once)."""
    return functools.partial(_map_keys, placement)


def _map_keys(placement: Placement, fn: Callable[..., np.ndarray], args: Sequence[Any],
              kwargs: dict[str, Any]) -> Iterator[np.ndarray]:
    return iter_tasks(fn, args, placement=placement, **kwargs)


def _drop_exact(
    cfg: PreprocessConfig, listed: Listed, content: Content, keep: np.ndarray,
    skipped: list[Skip],
) -> None:
    """Exact duplicates: the first copy in listing order is kept, the others are skipped as
    ``duplicate-of`` it (``of`` names the kept copy)."""
    paths, labels = listed.paths, listed.labels
    ok = np.flatnonzero(keep)
    dropped = integrity.exact_duplicates(content.pixels_sha256, rows=ok)  # not a copy of them
    for d, k in sorted(dropped.items()):
        di, ki = int(ok[d]), int(ok[k])
        same = ("same bytes" if content.bytes_sha256[di] == content.bytes_sha256[ki]
                else "same pixels after decoding and resizing")
        labels_ = "" if labels[di] == labels[ki] else (
            f"; its label {_label(listed.classes, int(labels[di]))} differs from the kept "
            f"copy's {_label(listed.classes, int(labels[ki]))}")
        if cfg.bad_input == "error":
            raise PreprocessError(
                f"{paths[di]}: {same} as {paths[ki]} (bad_input=error; "
                "dedupe.exact=false keeps exact duplicates)")
        skipped.append(Skip(path=paths[di], reason=DUPLICATE_OF,
                            detail=f"{same} as {paths[ki]}{labels_}", of=paths[ki]))
        keep[di] = False


def _group_by(
    cfg: PreprocessConfig, values: list[str | None] | None, ok: np.ndarray
) -> tuple[dict[str, Any], np.ndarray]:
    """The manifest's ``split_groups``, and the pairs ``[m, 2]`` joining items that share a
    ``split.group_by`` value (each item to the value's first)."""
    first: dict[str, int] = {}
    edges: list[tuple[int, int]] = []
    vals: list[str | None] = values if values is not None else []
    present = [i for i in ok.tolist() if i < len(vals) and vals[i] is not None]
    for i in present:
        g = vals[i]
        assert g is not None
        edges.append((first.setdefault(g, i), i))
    count = collections.Counter(vals[i] for i in present)
    return ({"column": cfg.split.group_by, "values": len(count), "items": sum(count.values()),
             "largest": max(count.values(), default=0)},
            np.array(edges, dtype=np.int64).reshape(-1, 2))


def _label(classes: list[str], label: int) -> str:
    return repr(classes[label]) if 0 <= label < len(classes) else "(none)"


def _near_report(
    cfg: PreprocessConfig, paths: Sequence[str], pairs: np.ndarray, split_code: np.ndarray,
) -> dict[str, Any]:
    """The manifest's ``near_duplicates`` section (groups from near-duplicate pairs only);
    ``split_code``: ``[n]`` each item's index into SPLITS (-1: not kept)."""
    def split_of(i: int) -> str | None:
        c = int(split_code[i])
        return None if c < 0 else SPLITS[c]

    found = integrity.pair_groups(pairs)
    found.sort(key=lambda g: (-len(g), g[0]))
    straddle = [(a, b) for a, b in pairs.tolist() if split_code[a] != split_code[b]]
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
            "examples": [{"a": paths[a], "a_split": split_of(a),
                          "b": paths[b], "b_split": split_of(b)}
                         for a, b in straddle[:20]],
        },
        "listed": min(len(found), LISTED_MAX),
        "list": [[{"sample_id": i, "path": paths[i], "split": split_of(i)} for i in g]
                 for g in found[:LISTED_MAX]],
    }


def _params(cfg: PreprocessConfig) -> dict[str, Any]:
    """What the bytes of a shard depend on (not paths of the output or Ray sizing), without
    credentials."""
    from components.io.storage import redacted

    p = to_dict(cfg)
    for k in ("output", "keep_shards", "num_cpus"):
        p.pop(k)
    p["captions"].pop("actors")
    p["captions"].pop("batch_size")
    if cfg.captions.backend in ("torch", "auto"):
        # The reference embeddings (auto: a backend checked to give them): datasets built
        # before the key existed, or with the old default torch, stay valid.
        p["captions"].pop("backend")
    if cfg.source.label_depth == 1:
        p["source"].pop("label_depth")  # the default: datasets built before it existed stay valid
    # Shard settings only for their kind (elsewhere they are the defaults): datasets built
    # before they existed stay valid.
    for key, kinds in SHARD_KEYS.items():
        if cfg.source.kind not in kinds:
            p["source"].pop(key)
    if cfg.captions.class_descriptions:
        p["captions"]["class_descriptions_sha256"] = sha256_file(cfg.captions.class_descriptions)
    p["format"] = FORMAT
    # Stored in the manifest and digested into the dataset's identity: never a credential
    # (a source URI's ``user:secret@``), and rotated keys are the same build.
    return dict(redacted(p))
