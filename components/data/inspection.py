"""The report of ``simgraph inspect``: a look at a dataset dir (:func:`run`).

Writes ``report.md`` and PNGs (default ``DATASET_DIR/inspect/``), read top to bottom:

1. the splits and counts from ``manifest.json`` (no image is read for them);
2. a grid of ``per_class`` samples per class as stored (``samples.png``), read straight from
   the ``.beton`` files with :func:`components.data.shards.read_samples` (no FFCV Loader, no
   JIT), chosen with a fixed seed from the labels column alone;
3. class counts per split (``class_counts.png``);
4. captions: token-length histogram against the text encoder's window (``caption_lengths.png``),
   examples per class, the class-caption similarity X-CLR uses (``class_similarity.png``) and its
   closest class pairs, and the closest pairs of distinct captions;
5. near-duplicate groups with thumbnails (``near_duplicates.png``), exact duplicates dropped;
6. the skip table (counts per reason, examples) and the caption checks.

Only a fixed number of images is decoded, so a 70k-image dataset takes seconds
(docs/benchmarks.md, ``bench/dataset_integrity.py``).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np

from components.data import shards
from components.data.reader import DatasetError, DatasetInfo
from components.data.staging import local_dataset
from components.errors import SimgraphError
from components.io import storage
from components.io.files import write_text

SPLIT_ORDER = ("train", "val", "test")
PAIRS_SAMPLE = 4000  # captions compared for nearest pairs (all of them when fewer)


class InspectError(SimgraphError, RuntimeError):
    """The dataset dir cannot be inspected (the message says why)."""


def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |"
            for r in rows]
    return out + [""]


def _plt() -> Any:
    # matplotlib only when a figure is drawn: importing it costs start-up time
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _class_name(classes: list[str], label: int) -> str:
    return classes[label] if 0 <= label < len(classes) else "unlabelled"


class _Splits:
    """Per split: its file, labels and sample ids (metadata columns only, no image decoded)."""

    def __init__(self, info: DatasetInfo) -> None:
        self.files: dict[str, Path] = {}
        self.labels: dict[str, np.ndarray] = {}
        self.ids: dict[str, np.ndarray] = {}
        for split in SPLIT_ORDER:
            s = info.manifest["splits"].get(split)
            if not s or not s.get("samples"):
                continue
            f = info.root / s["file"]
            self.files[split] = f
            self.labels[split] = shards.read_int_field(f, shards.LABEL)
            self.ids[split] = shards.read_int_field(f, shards.SAMPLE_ID)
        self.where = {int(sid): (split, i) for split, ids in self.ids.items()
                      for i, sid in enumerate(ids.tolist())}

    def read(self, sample_ids: list[int]) -> dict[int, dict[str, Any]]:
        """Samples by id (ids not in the dataset are left out)."""
        by_split: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
        for sid in sample_ids:
            if sid in self.where:
                split, i = self.where[sid]
                by_split[split].append((sid, i))
        out = {}
        for split, pairs in by_split.items():
            got = shards.read_samples(self.files[split], [i for _, i in pairs])
            out.update({sid: s for (sid, _), s in zip(pairs, got, strict=True)})
        return out


def _sample_grid(info: DatasetInfo, sp: _Splits, per_class: int, seed: int,
                 out: Path) -> tuple[list[str], dict[int, list[int]]]:
    plt = _plt()
    split = next(iter(sp.files))  # train when there is one
    labels = sp.labels[split]
    rng = np.random.default_rng(seed)
    chosen: dict[int, list[int]] = {}
    for lab in sorted(set(labels.tolist())):
        idx = np.flatnonzero(labels == lab)
        pick = np.sort(rng.choice(idx, min(per_class, len(idx)), replace=False))
        chosen[lab] = [int(sp.ids[split][i]) for i in pick]
    samples = sp.read([s for ids in chosen.values() for s in ids])
    rows, cols = len(chosen), max(len(v) for v in chosen.values())
    fig, axes = plt.subplots(rows, cols, figsize=(1.3 * cols + 1.5, 1.3 * rows + 0.3),
                             squeeze=False)
    for r, (lab, ids) in enumerate(chosen.items()):
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            for side in ax.spines.values():
                side.set_visible(False)
            if c < len(ids):
                img = samples[ids[c]]["image"]
                ax.imshow(img, interpolation="nearest")
                ax.set_title(f"{img.shape[1]}x{img.shape[0]}", fontsize=6)
            if c == 0:
                ax.set_ylabel(_class_name(info.classes, lab), fontsize=8, rotation=0,
                              ha="right", va="center")
    fig.suptitle(f"{split}: {per_class} samples per class as stored", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "samples.png", dpi=100)
    plt.close(fig)
    return ["![samples per class](samples.png)", ""], chosen


def _class_counts(info: DatasetInfo, labels: dict[str, np.ndarray], out: Path) -> list[str]:
    plt = _plt()
    splits = {k: v for k, v in info.manifest["splits"].items() if v.get("samples")}
    for split, s in splits.items():
        if "per_class" not in s:  # a manifest without counts: count from the labels column
            s["per_class"] = {_class_name(info.classes, int(k)): int(n) for k, n in
                              collections.Counter(labels[split].tolist()).items()}
    names = sorted({c for s in splits.values() for c in s["per_class"]},
                   key=lambda c: (info.classes.index(c) if c in info.classes else 1 << 30, c))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(names) * len(splits)), 3.2))
    width = 0.8 / max(1, len(splits))
    x = np.arange(len(names))
    for k, (split, s) in enumerate(splits.items()):
        ax.bar(x + k * width, [s["per_class"].get(c, 0) for c in names], width, label=split)
    ax.set_xticks(x + 0.4 - width / 2, names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("images")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "class_counts.png", dpi=100)
    plt.close(fig)
    rows = [[c, *[s["per_class"].get(c, 0) for s in splits.values()]] for c in names]
    rows.append(["**total**", *[s["samples"] for s in splits.values()]])
    return ["## Class counts per split", "", "![class counts](class_counts.png)", "",
            *_md_table(["class", *splits], rows)]


def _captions(info: DatasetInfo, sp: _Splits, chosen: dict[int, list[int]],
              out: Path) -> list[str]:
    root, m = info.root, info.manifest
    lines = ["## Captions", ""]
    files = m.get("class_files") or {}
    if "captions" not in files or not (root / files["captions"]).exists():
        return lines + ["No caption texts in this dataset dir (captions disabled, or built "
                        "before captions.json existed).", ""]
    plt = _plt()
    data = json.loads((root / files["captions"]).read_text())
    texts, tokens, limit = data["texts"], np.asarray(data["tokens"]), data["max_seq_length"]
    index = np.load(root / files["caption_index"])
    kept = np.array([sid in sp.where for sid in index[:, 0].tolist()], dtype=bool)
    per_item = tokens[index[kept, 1]] if len(texts) else np.zeros(0, int)
    fig, ax = plt.subplots(figsize=(5.5, 3))
    ax.hist(per_item, bins=min(50, max(5, len(set(per_item.tolist())))), color="tab:blue")
    ax.axvline(limit, color="tab:red", ls="--", label=f"encoder window ({limit} tokens)")
    ax.set_xlabel("tokens per caption (per image)")
    ax.set_ylabel("images")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "caption_lengths.png", dpi=100)
    plt.close(fig)
    over = int((per_item > limit).sum())
    lines += [f"{len(texts)} unique captions over {int(kept.sum())} images; tokens per image: "
              f"median {np.median(per_item):.0f}, max {per_item.max(initial=0)}; "
              f"{over} images exceed the {limit}-token window (embedded truncated).", "",
              "![caption lengths](caption_lengths.png)", ""]
    cid_of = dict(zip(index[:, 0].tolist(), index[:, 1].tolist(), strict=True))
    rows = []
    for lab, ids in chosen.items():
        for sid in ids[:3]:
            cid = cid_of.get(sid, -1)
            if cid >= 0:
                rows.append([_class_name(info.classes, lab), sid, texts[cid][:120], tokens[cid]])
    lines += ["### Examples (the first grid samples of each class)", "",
              *_md_table(["class", "sample id", "caption", "tokens"], rows)]
    lines += _nearest_captions(root, texts)
    return lines


def _class_similarity(info: DatasetInfo, out: Path) -> list[str]:
    files = info.manifest.get("class_files") or {}
    if "class_similarity" not in files:
        return []
    plt = _plt()
    sim = np.load(info.root / files["class_similarity"])
    n = len(sim)
    fig, ax = plt.subplots(figsize=(1.2 + 0.35 * n, 1 + 0.3 * n))
    im = ax.imshow(sim, cmap="viridis")
    ax.set_xticks(range(n), info.classes, rotation=90, fontsize=6)
    ax.set_yticks(range(n), info.classes, fontsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set_title("class-caption cosine similarity (X-CLR's class graph)", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "class_similarity.png", dpi=100)
    plt.close(fig)
    iu = np.triu_indices(n, 1)
    order = np.argsort(-sim[iu], kind="stable")[:10]
    rows = [[info.classes[iu[0][k]], info.classes[iu[1][k]], f"{sim[iu][k]:.3f}"] for k in order]
    return ["### Class-caption similarity", "", "![class similarity](class_similarity.png)", "",
            "Closest class pairs (X-CLR pulls their images together most):", "",
            *_md_table(["class", "class", "cosine"], rows)]


def _nearest_captions(root: Path, texts: list[str]) -> list[str]:
    if len(texts) < 2:
        return []
    new, old = root / "caption_embeddings.npy", root / "captions.npz"
    if new.exists():  # memory-mapped: only the sampled rows are read
        emb = np.load(new, mmap_mode="r")
    elif old.exists():  # a dataset built before 2026-11-27
        with np.load(old) as z:
            emb = np.asarray(z["embeddings"], dtype=np.float32)
    else:
        return []
    if len(emb) != len(texts):
        return []
    idx = np.arange(len(texts))
    note = ""
    if len(idx) > PAIRS_SAMPLE:
        idx = np.sort(np.random.default_rng(0).choice(idx, PAIRS_SAMPLE, replace=False))
        note = f" (among {PAIRS_SAMPLE} captions drawn with seed 0 of {len(texts)})"
    e = np.asarray(emb[idx], dtype=np.float32)
    sim = e @ e.T
    np.fill_diagonal(sim, -np.inf)
    iu = np.triu_indices(len(idx), 1)
    flat = sim[iu]
    top = np.argsort(-flat, kind="stable")[:10]
    rows = [[texts[idx[iu[0][k]]][:80], texts[idx[iu[1][k]]][:80], f"{flat[k]:.3f}"]
            for k in top]
    return [f"### Nearest caption pairs{note}", "",
            *_md_table(["caption", "caption", "cosine"], rows)]


def _duplicates(info: DatasetInfo, sp: _Splits, out: Path) -> list[str]:
    m = info.manifest
    lines = ["## Duplicates", ""]
    skipped = m.get("skipped") or {"total": 0, "by_reason": {}, "items": []}
    dropped = [s for s in skipped["items"] if s["reason"] == "duplicate-of"]
    lines += [f"**Exact duplicates dropped:** {len(dropped)} (same bytes or same pixels after "
              "resizing; the first copy in listing order is kept).", ""]
    if dropped:
        lines += _md_table(["dropped", "kept (duplicate of)"],
                           [[s["path"], s.get("of", s["detail"])] for s in dropped[:30]])
    nd = m.get("near_duplicates")
    if not nd:
        return lines + ["Near duplicates were not searched (dedupe.near_threshold: null, or a "
                        "dataset built before they existed).", ""]
    sizes = ", ".join(f"{n}×{k}" for k, n in nd["sizes"].items()) or "none"
    st = nd["straddling_splits"]
    lines += [f"**Near-duplicate groups:** {nd['groups']} holding {nd['items']} images "
              f"(pHash ≤ {nd['threshold_bits']} bits and thumbnails ≤ {nd['max_diff']} grey "
              f"levels apart); sizes (count×size): {sizes}. Each group is in one split, except "
              f"where the source's official splits separate it: {st['pairs']} pairs.", ""]
    if st["examples"]:
        lines += _md_table(["a", "split", "b", "split"],
                           [[e["a"], e["a_split"], e["b"], e["b_split"]]
                            for e in st["examples"][:10]])
    groups = [g[:6] for g in nd["list"][:8]]
    if groups:
        plt = _plt()
        samples = sp.read([x["sample_id"] for g in groups for x in g])
        cols = max(len(g) for g in groups)
        fig, axes = plt.subplots(len(groups), cols, figsize=(1.4 * cols, 1.4 * len(groups)),
                                 squeeze=False)
        for r, g in enumerate(groups):
            for c in range(cols):
                ax = axes[r][c]
                ax.axis("off")
                if c < len(g) and g[c]["sample_id"] in samples:
                    ax.imshow(samples[g[c]["sample_id"]]["image"], interpolation="nearest")
                    ax.set_title(f"{g[c]['split']} #{g[c]['sample_id']}", fontsize=6)
        fig.suptitle("largest near-duplicate groups (one row each)", fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "near_duplicates.png", dpi=100)
        plt.close(fig)
        lines += ["![near-duplicate groups](near_duplicates.png)", ""]
    return lines


def _skips(info: DatasetInfo) -> list[str]:
    m = info.manifest
    sk = m.get("skipped") or {"total": 0, "by_reason": {}, "items": []}
    lines = ["## Skipped items", "", f"{sk['total']} skipped.", ""]
    if sk["total"]:
        by: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for s in sk["items"]:
            by[s["reason"]].append(s)
        # an item by its file and the folder it is in (a DatasetDict's split, a class)
        rows = [[r, n, "; ".join(f"{'/'.join(Path(s['path']).parts[-2:])}: {s['detail']}"
                                 for s in by.get(r, [])[:3])]
                for r, n in sorted(sk["by_reason"].items())]
        lines += _md_table(["reason", "items", "examples"], rows)
    checks = m.get("caption_checks")
    if checks:
        lines += ["### Caption checks", "",
                  f"Encoder window: {checks['max_seq_length']} tokens. Counts by reason "
                  "(skipped items are also in the table above):", ""]
        rows = [[r, n, checks["skipped"].get(r, 0)] for r, n in checks["by_reason"].items()]
        lines += _md_table(["reason", "items", "of which skipped"], rows) if rows else ["none", ""]
    if m.get("split_groups"):
        g = m["split_groups"]
        lines += [f"Split groups from column `{g['column']}`: {g['values']} values over "
                  f"{g['items']} images (largest {g['largest']}).", ""]
    return lines


def run(dataset: str, out: str | None = None, per_class: int = 8, seed: int = 0) -> Path:
    """Write the report; returns its path."""
    try:
        root = local_dataset(dataset, stage=False)
        info = DatasetInfo.load(root)
    except DatasetError as e:
        raise InspectError(str(e)) from None
    if out is None:
        target = (Path.cwd() / f"inspect-{Path(dataset.rstrip('/')).name}"
                  if storage.is_uri(dataset) else root / "inspect")
    else:
        target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    sp = _Splits(info)
    if not sp.files:
        raise InspectError(f"{dataset}: no split holds any sample")
    m = info.manifest
    params = m.get("params", {})
    rows = [[s, v["samples"], len(v.get("per_class", {})) or "?"]
            for s, v in m["splits"].items()]
    lines = [f"# Dataset {dataset}", "",
             f"Source: {params.get('source', {}).get('kind', '?')} "
             f"{params.get('source', {}).get('path') or ''}; images: longer side ≤ "
             f"{params.get('image', {}).get('max_side', '?')} px, "
             f"{params.get('image', {}).get('write_mode', '?')}; "
             f"{len(info.classes)} classes; built {m.get('created', '?')}.", "",
             *_md_table(["split", "images", "classes"], rows),
             "## Samples as stored", ""]
    grid, chosen = _sample_grid(info, sp, per_class, seed, target)
    lines += grid
    lines += _class_counts(info, sp.labels, target)
    lines += _captions(info, sp, chosen, target)
    lines += _class_similarity(info, target)
    lines += _duplicates(info, sp, target)
    lines += _skips(info)
    report = target / "report.md"
    write_text(report, storage.redact("\n".join(lines) + "\n"))  # never a URI's credentials
    return report
