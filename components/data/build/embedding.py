"""Step 3: caption embeddings. The unique captions are embedded by a Ray Data actor pool (one
text encoder per actor, batches streamed to it; :func:`embed_captions`) into
``caption_embeddings.npy`` row by row (:class:`CaptionTable`: never whole in memory; each shard
task reads its own rows), cached under ``caption_embeddings.json``'s key; on the driver,
``classes.json`` with the class embeddings and similarity (:func:`write_class_files`), and
``captions.json`` (written piece by piece) / ``caption_index.npy`` with the manifest's
``caption_checks`` (:func:`caption_files`). The encoder itself: ``components/data/captions.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from components.config import PreprocessConfig
from components.data import captions as cap
from components.data.build.common import LISTED_MAX, PreprocessError, _read_json
from components.data.build.placement import ANYWHERE, Placement
from components.data.build.planning import Plan
from components.data.build.source_record import _chunks
from components.data.caption_backend import AUTO, reference_or
from components.data.caption_texts import CaptionTexts
from components.io.files import atomic_open, replacing, write_json

CAPTION_TRUNCATED = "caption-truncated"


# Caption actors are not restarted by Ray (``max_restarts=0``, see :func:`_embedding_stage`):
# when one dies (OOM kill, a lost node) the stage runs again over the captions not yet
# embedded, on new actors, at most this many times; then the build fails with one line.
CAPTION_STAGE_RETRIES = 3


EMBEDDINGS = "caption_embeddings.npy"  # [U, E] float32, row = caption id
EMBEDDINGS_KEY = "caption_embeddings.json"  # {"key": the cache key, "shape": [U, E]}
OLD_CACHE = "captions.npz"  # before 2026-11-27: {"key", "embeddings"}, read when its key matches


@dataclasses.dataclass(frozen=True)
class CaptionTable:
    """The build's caption embeddings on disk (``caption_embeddings.npy``), one row per unique
    caption text: never held whole in memory (CC12M's 12M captions × 384 float32 are 18 GB);
    each shard task reads the rows of its own items."""

    path: Path
    rows: int
    dim: int

    def take(self, ids: np.ndarray) -> np.ndarray:
        """``[len(ids), E]`` float32: the rows ``ids`` (a copy)."""
        table = np.load(self.path, mmap_mode="r")
        return np.asarray(table[np.asarray(ids, dtype=np.int64)], dtype=np.float32)


def caption_cache_key(cfg: PreprocessConfig, texts: Sequence[str]) -> str:
    """The embeddings cache's key: sha256 of ``{"backend"?, "model", "texts"}`` as
    ``json.dumps(..., sort_keys=True)`` writes it (what ``_digest`` gave for the dict, so
    caches of earlier builds still match), fed piece by piece — never one text of every
    caption."""
    head: dict[str, str] = {"model": cfg.captions.model}
    if cfg.captions.backend != "torch":
        head["backend"] = cfg.captions.backend
    h = hashlib.sha256(json.dumps(head, sort_keys=True)[:-1].encode())  # up to the last "}"
    h.update(b', "texts": [')
    for chunk in _chunks(_joined((json.dumps(t) for t in texts), ", ")):
        h.update(chunk)
    h.update(b"]}")
    return h.hexdigest()


def _joined(items: Iterable[str], sep: str) -> Iterator[str]:
    """``items`` with ``sep`` between them (a JSON list's separator), piece by piece."""
    for k, item in enumerate(items):
        yield item if k == 0 else sep + item


def cached_table(out: Path, key: str | None = None) -> CaptionTable | None:
    """The embeddings in ``out`` when complete (and built for ``key``, when given); an old
    build's ``captions.npz`` of that key is converted to the new file first."""
    meta = _read_json(out / EMBEDDINGS_KEY)
    path = out / EMBEDDINGS
    if meta and path.exists() and (key is None or meta.get("key") == key):
        rows, dim = (int(v) for v in meta["shape"])
        if np.load(path, mmap_mode="r").shape == (rows, dim):
            return CaptionTable(path, rows, dim)
    old = out / OLD_CACHE
    if old.exists():
        with np.load(old) as z:
            if key is None or str(z["key"]) == key:
                emb = np.asarray(z["embeddings"], dtype=np.float32)
                with replacing(path) as tmp:
                    np.save(tmp, emb)
                write_json(out / EMBEDDINGS_KEY, {"key": str(z["key"]),
                                                  "shape": list(emb.shape)})
                old.unlink()
                return CaptionTable(path, int(emb.shape[0]), int(emb.shape[1]))
    return None


def _table_file(f: IO[bytes], rows: int, dim: int) -> int:
    """Start ``f`` as a ``[rows, dim]`` float32 ``.npy`` file at its full size (unwritten rows
    read as zeros, sparse on disk); returns the header's length: row ``i`` is at ``offset + i *
    dim * 4``."""
    np.lib.format.write_array_header_1_0(f, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
        "fortran_order": False, "shape": (rows, dim)})
    f.flush()
    offset = f.tell()
    f.truncate(offset + rows * dim * 4)
    return offset


def embed_captions(cfg: PreprocessConfig, texts: Sequence[str], out: Path, *,
                   dim: int, placement: Placement = ANYWHERE) -> CaptionTable:
    """Embed the unique captions ``texts`` into ``caption_embeddings.npy`` (row ``i`` =
    ``texts[i]``, ``dim`` float32 values: the model's embedding width; with
    ``caption_embeddings.json`` its cache key): a re-run with the same texts, model and backend
    reuses it. The caption actors write their rows into the file themselves
    (:func:`components.data.captions.write_rows`) and hand back only the caption ids, so the
    table never passes through the driver or the object store.

    Raises:
        PreprocessError: caption actors died more than ``CAPTION_STAGE_RETRIES`` times.
    """
    import ray

    if cfg.captions.backend == AUTO:  # the driver resolves it (caption_backend.choose)
        raise ValueError("embed_captions needs a resolved captions.backend, not 'auto'")
    key = caption_cache_key(cfg, texts)
    cached = cached_table(out, key)
    if cached is not None:
        return cached
    n = len(texts)
    # Shortest first: each actor batch then holds captions of similar length, so the encoder
    # pads little (the table itself is sorted alphabetically); caption_id maps rows back.
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    by_length = np.argsort(lengths, kind="stable")
    del lengths
    done = np.zeros(n, dtype=bool)
    target = out / EMBEDDINGS
    with replacing(target) as tmp:
        with open(tmp, "wb") as f:
            offset = _table_file(f, n, dim)
        for attempt in range(CAPTION_STAGE_RETRIES + 1):
            todo = by_length[~done[by_length]]
            if not len(todo):
                break
            try:
                for batch in _embedding_stage(cfg, texts, todo, (str(tmp), offset),
                                                  placement).iter_batches(
                        batch_size=None, batch_format="numpy"):
                    done[np.asarray(batch["caption_id"], dtype=np.int64)] = True
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
                what = f"a caption actor died ({type(e).__name__})"
                if attempt == CAPTION_STAGE_RETRIES:
                    raise PreprocessError(
                        f"{what}, {attempt + 1} times; {int(done.sum())} of {n} captions were "
                        "embedded. If they ran out of memory, lower captions.batch_size or "
                        "captions.actors; then run the same command again") from None
                print(f"simgraph preprocess: {what}; embedding the {n - int(done.sum())} "
                      "captions left on new actors", file=sys.stderr, flush=True)
        assert done.all()
    write_json(out / EMBEDDINGS_KEY, {"key": key, "shape": [n, dim]})
    return CaptionTable(target, n, dim)


# Rows per Arrow block handed to the caption actors: the input is built block by block from
# the texts (no Python dict per caption on the driver).
STAGE_BLOCK_ROWS = 65_536


def _embedding_stage(cfg: PreprocessConfig, texts: Sequence[str], ids: np.ndarray,
                     rows: tuple[str, int], placement: Placement = ANYWHERE) -> Any:
    """The Ray Data actor pool that embeds ``texts[i]`` for ``i`` in ``ids`` (batched in that
    order) into the table file ``rows`` (path, header bytes): ``{caption_id, text}`` rows →
    ``{caption_id}`` batches of the rows written.

    ``max_restarts=0``: Ray Data hands every pool actor its context and the batch function as
    object refs, and Ray's core logs an error-level line for any restartable actor built from
    object-store arguments ("has constructor arguments in the object store and max_restarts >
    0"; docs/ray-notes.md, "Ray Data"). :func:`embed_captions` re-runs the captions a dead
    actor left instead of Ray restarting it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import ray
    from ray.util.annotations import RayDeprecationWarning

    # The ONNX backends run on CPU (the same encoder as the driver's class embeddings).
    use_gpu = cfg.captions.backend == "torch" and placement.gpus() > 0
    ids = np.asarray(ids, dtype=np.int64)
    # Each block goes into the object store as it is made (ray.put) and the driver's copy is
    # let go: the driver never holds every text as Arrow, and Arrow's work is on the system
    # allocator (its default keeps freed blocks in the driver's RSS).
    pool = pa.system_memory_pool()
    compact = texts if isinstance(texts, CaptionTexts) else None  # taken by Arrow: no strs
    base = compact.arrow() if compact is not None else None
    refs: list[Any] = []
    for s in range(0, len(ids), STAGE_BLOCK_ROWS):
        part = ids[s:s + STAGE_BLOCK_ROWS]
        if compact is not None:
            at = part if compact.rows is None else compact.rows[part]
            text = pc.take(base, pa.array(at), memory_pool=pool)
            compact.release()  # the block is a copy: its spilled pages can go
        else:
            text = pa.array([texts[i] for i in part.tolist()], pa.large_string(),
                            memory_pool=pool)
        refs.append(ray.put(pa.table({"caption_id": pa.array(part, memory_pool=pool),
                                      "text": text})))
        del text
    items = ray.data.from_arrow_refs(refs)
    with warnings.catch_warnings():
        # Ray 2.60's map_batches has no named max_restarts yet: it goes through the extra
        # remote arguments, which it says are deprecated (a TypeError once they are removed).
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated",
                                RayDeprecationWarning)
        return items.map_batches(
            cap.CaptionEmbedder,
            fn_constructor_kwargs={"model": cfg.captions.model,
                                   "device": "cuda" if use_gpu else "cpu",
                                   "backend": cfg.captions.backend,
                                   "rows_file": rows[0], "rows_offset": rows[1]},
            batch_size=cfg.captions.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cfg.captions.actors),
            num_gpus=1 if use_gpu else 0,
            num_cpus=1,
            max_restarts=0,
            **placement.actor_options(use_gpu),
        )


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
    if model is None:  # auto: class texts are few, the reference embeds them
        model = cap.load_encoder(cfg.captions.model, backend=reference_or(cfg.captions.backend))
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
    write_caption_texts(out / "captions.json", cfg.captions.model, limit, plan_.texts, tokens)
    index = np.stack([plan_.sample_ids.astype(np.int64),
                      plan_.caption_ids.astype(np.int64)], axis=1)
    with replacing(out / "caption_index.npy") as tmp:
        np.save(tmp, index.reshape(-1, 2))
    over = np.append(tokens > limit, False)  # [-1]: no caption
    long = np.flatnonzero(over[plan_.caption_ids])
    notes = list(plan_.caption_notes) + [
        {"path": plan_.paths[i], "reason": CAPTION_TRUNCATED,
         "detail": f"{tokens[c]} tokens; the text encoder reads the first {limit}",
         "action": "truncated"}
        for i, c in sorted(zip(plan_.sample_ids[long].tolist(),
                               plan_.caption_ids[long].tolist(), strict=True))
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


def write_caption_texts(target: Path, model: str, limit: int, texts: Sequence[str],
                        tokens: np.ndarray) -> None:
    """``captions.json``: ``{"model", "max_seq_length", "texts", "tokens"}`` byte for byte as
    ``json.dumps(..., indent=1)`` writes it (the format readers and earlier builds have),
    written piece by piece: never one text of every caption (CC12M: 12M of them)."""

    def items(f: IO[str], values: Iterable[str], n: int) -> None:
        if not n:
            f.write("[]")
            return
        f.write("[\n  ")
        f.writelines(_joined(values, ",\n  "))
        f.write("\n ]")

    with atomic_open(target, "w", encoding="utf-8") as f:
        f.write(f'{{\n "model": {json.dumps(model)},\n "max_seq_length": {json.dumps(limit)},'
                '\n "texts": ')
        items(f, (json.dumps(t) for t in texts), len(texts))
        f.write(',\n "tokens": ')
        items(f, (str(int(t)) for t in tokens), len(tokens))
        f.write("\n}\n")


def _stored_dim(out: Path) -> int:
    table = cached_table(out)
    return table.dim if table is not None else 0
