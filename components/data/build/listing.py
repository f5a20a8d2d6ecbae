"""Step 1 of the build (driver, no Ray): list the source (``components/data/sources.py``),
take the ``source.max_per_class`` subset and apply the caption policy (``captions.missing``:
invalid UTF-8 and empty captions are counted, never silent). Its :class:`Listed` is what every
later stage works from (sample id = index in it)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from components.config import PreprocessConfig
from components.data.build.common import PreprocessError
from components.data.shard_sources import ShardOptions
from components.data.sources import (
    MISSING_CAPTION,
    Item,
    Listing,
    Skip,
    SourceError,
    list_source,
)


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


@dataclasses.dataclass(kw_only=True)
class Listed:
    """The source after the caption policy: kept items (sample id = index here), their caption
    texts, the classes, skipped items and caption problems that did not skip an item."""

    items: list[Item]
    texts: list[str | None]
    classes: list[str]
    skipped: list[Skip]
    caption_notes: list[dict[str, Any]]


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
                skipped.append(Skip(path=it.path, reason=it.caption_issue or MISSING_CAPTION,
                                    detail=why))
                continue
        kept.append(it)
        texts.append(text)
    return kept, texts


def list_items(cfg: PreprocessConfig) -> Listed:
    """Step 1 (driver, no Ray): list the source, take the subset, apply the caption policy."""
    from components.io.paths import resolve_path

    src = cfg.source
    source = resolve_path(src.path) if src.path else None
    try:
        listing = list_source(src.kind, source, src.classes, cfg.bad_input,
                              cfg.split.group_by, src.label_depth, ShardOptions.of(src))
    except SourceError as e:
        raise PreprocessError(str(e)) from None
    skipped = list(listing.skipped)
    notes: list[dict[str, Any]] = []
    items = _subset(listing, cfg.source.max_per_class)
    items, texts = _caption_texts(cfg, items, listing.classes, skipped, notes)
    return Listed(items=items, texts=texts, classes=listing.classes, skipped=skipped,
                  caption_notes=notes)
