"""Step 1 of the build (driver, no Ray): list the source (``components/data/sources.py``),
take the ``source.max_per_class`` subset and apply the caption policy (``captions.missing``:
invalid UTF-8 and empty captions are counted, never silent). Its :class:`Listed` is what every
later stage works from (sample id = index in it)."""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.config import PreprocessConfig
from components.data.build.common import PreprocessError
from components.data.caption_texts import CaptionTexts
from components.data.shard_sources import ShardOptions
from components.data.sources import (
    CAPTION_ISSUES,
    MISSING_CAPTION,
    ItemTable,
    Skip,
    SourceError,
    list_source_table,
)


def _subset(table: ItemTable, max_per_class: int | None) -> ItemTable:
    if max_per_class is None:
        return table
    seen: collections.Counter[tuple[int, str | None]] = collections.Counter()
    keep = []
    official = table.official
    for i, label in enumerate(table.labels.tolist()):  # listing order is sorted: deterministic
        key = (label, None if official is None else official[i])
        if seen[key] < max_per_class:
            seen[key] += 1
            keep.append(i)
    return table.take(np.array(keep, dtype=np.int64))


@dataclasses.dataclass(kw_only=True)
class Listed:
    """The source after the caption policy, as columns (sample id = index here): the kept
    items' paths (:class:`~components.data.sources.ShardPaths` for a shard source: no str per
    item), labels, caption ids into ``captions`` (the unique texts; -1: none), official
    splits and ``split.group_by`` values where the source has them; the classes, skipped
    items and caption problems that did not skip an item."""

    paths: Sequence[str]  # [n]
    labels: np.ndarray  # [n] int32
    caption_ids: np.ndarray  # [n] int32 into captions, -1 = no caption
    captions: Sequence[str]  # a list, or CaptionTexts (a shard source's: no str per caption)
    official: Sequence[str | None] | None  # [n], None when the source defines no split
    groups: list[str | None] | None  # [n], None without split.group_by
    classes: list[str]
    skipped: list[Skip]
    caption_notes: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.labels)

    def text(self, i: int) -> str | None:
        """Item ``i``'s caption text."""
        c = int(self.caption_ids[i])
        return None if c < 0 else self.captions[c]


def _caption_texts(
    cfg: PreprocessConfig, table: ItemTable, skipped: list[Skip], notes: list[dict[str, Any]],
) -> tuple[ItemTable, Sequence[str]]:
    """Apply ``captions.missing``; returns the kept items, their ``caption_ids`` pointing
    into the returned caption table (the class template appended for ``from-label``).

    A caption that is not valid UTF-8 or is empty counts as missing, under its own reason
    (``caption-encoding`` / ``caption-empty``): skipped with it, or — ``from-label`` — given the
    class template and listed in ``notes`` so the manifest counts it.
    """
    if not cfg.captions.enabled:
        return dataclasses.replace(table, caption_ids=np.full(len(table), -1, np.int32)), []
    captions = table.captions
    added: list[str] = []  # class template texts no listed caption has, appended at the end
    missing = np.flatnonzero(table.caption_ids < 0)
    unmatched = _unmatched_caption_setting(cfg, table, len(missing))
    if unmatched is not None:
        notes.append(unmatched)
    index = _template_ids(cfg, table, missing)
    ids = table.caption_ids.copy()
    keep = np.ones(len(table), dtype=bool)
    for i in missing.tolist():  # only the items without a caption
        path, label = table.paths[i], int(table.labels[i])
        issue = CAPTION_ISSUES[int(table.caption_issues[i])]
        policy = cfg.captions.missing
        problem = {"caption-encoding": "caption is not valid UTF-8",
                   "caption-empty": "caption is empty or whitespace only"}.get(
            issue or "", "no caption")
        if policy == "error":
            has = "has no caption" if problem == "no caption" else f"{problem}: no caption"
            raise PreprocessError(
                f"{path} {has} (captions.missing=error); give it one, or set "
                "captions.missing=skip or from-label"
            )
        if policy == "from-label" and label >= 0:
            text = cfg.captions.templates[0].format(table.classes[label])
            ids[i] = index.setdefault(text, len(captions) + len(added))
            if ids[i] == len(captions) + len(added):
                added.append(text)
            if issue:
                notes.append({"path": path, "reason": issue,
                              "detail": f"{problem}; used the class template",
                              "action": "from-label"})
        else:
            why = problem + (" and no label" if policy == "from-label" else "")
            if cfg.bad_input == "error":
                raise PreprocessError(f"{path}: {why} (bad_input=error)")
            skipped.append(Skip(path=path, reason=issue or MISSING_CAPTION, detail=why))
            keep[i] = False
    table = dataclasses.replace(table, caption_ids=ids)
    if added:  # a new table: the listed one is not changed
        captions = (captions.plus(added) if isinstance(captions, CaptionTexts)
                    else [*captions, *added])
    return (table if keep.all() else table.take(np.flatnonzero(keep))), captions


NO_CAPTION_FROM_SOURCE = "no-caption-from-source"


def _unmatched_caption_setting(cfg: PreprocessConfig, table: ItemTable,
                               missing: int) -> dict[str, Any] | None:
    """A caption note when a shard source's caption setting gave not one item a caption (a
    mistyped ``caption_column`` / ``caption_key``: every caption silently the class template
    otherwise), naming the setting and, for columns, what the files have."""
    src = cfg.source
    setting = {"webdataset": ("caption_key", src.caption_key),
               "parquet": ("caption_column", src.caption_column),
               "huggingface": ("caption_column", src.caption_column)}.get(src.kind)
    if (setting is None or setting[1] is None or not len(table) or missing < len(table)
            or bool(table.caption_issues.any())):
        return None
    hint = f" ({table.caption_hint})" if table.caption_hint else ""
    action = {"from-label": "; each took its class template (captions.missing=from-label)",
              "skip": "; each was skipped (captions.missing=skip)"}.get(
                  cfg.captions.missing, " (captions.missing=error)")
    detail = (f"none of the {len(table)} items has a caption from "
              f"source.{setting[0]}={setting[1]!r}{hint}{action}: name the source's caption "
              f"{setting[0].split('_')[1]}, or set it to null for no captions")
    if cfg.captions.missing == "error":
        raise PreprocessError(detail)
    return {"path": str(src.path), "reason": NO_CAPTION_FROM_SOURCE, "detail": detail,
            "action": cfg.captions.missing}


def _template_ids(cfg: PreprocessConfig, table: ItemTable,
                  missing: np.ndarray) -> dict[str, int]:
    """``captions.missing: from-label``: the class template texts the items ``missing`` a
    caption may take, each with its id when a listed caption already has that text — found in
    one pass over the caption table, without a dict of every caption (CC12M: ~12M texts)."""
    if cfg.captions.missing != "from-label" or not len(missing):
        return {}
    labels = np.unique(table.labels[missing])
    wanted = {cfg.captions.templates[0].format(table.classes[int(c)]) for c in labels
              if c >= 0}
    found: dict[str, int] = {}
    for k, text in enumerate(table.captions):
        if text in wanted and text not in found:
            found[text] = k
    return found


def list_items(cfg: PreprocessConfig, spill: str | os.PathLike[str] | None = None) -> Listed:
    """Step 1 (driver, no Ray): list the source, take the subset, apply the caption policy.
    ``spill``: a directory (the build's) where a shard source's caption texts are kept in a
    mapped, unlinked file instead of the driver's memory (CC12M: ~1.3 GB of UTF-8)."""
    from components.io.paths import resolve_path

    src = cfg.source
    source = resolve_path(src.path) if src.path else None
    try:
        table = list_source_table(src.kind, source, src.classes, cfg.bad_input,
                                  cfg.split.group_by, src.label_depth, ShardOptions.of(src),
                                  None if spill is None else os.fspath(spill))
    except SourceError as e:
        raise PreprocessError(str(e)) from None
    skipped = list(table.skipped)
    notes: list[dict[str, Any]] = []
    table = _subset(table, cfg.source.max_per_class)
    table, captions = _caption_texts(cfg, table, skipped, notes)
    return Listed(paths=table.paths, labels=table.labels, caption_ids=table.caption_ids,
                  captions=captions, official=table.official, groups=table.groups,
                  classes=table.classes, skipped=skipped, caption_notes=notes)
