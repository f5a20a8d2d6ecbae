"""Step 3: caption embeddings. The unique captions are embedded by a Ray Data actor pool (one
text encoder per actor, batches streamed to it; :func:`embed_captions`, cached in
``captions.npz``); on the driver, ``classes.json`` with the class embeddings and similarity
(:func:`write_class_files`), and ``captions.json`` / ``caption_index.npy`` with the manifest's
``caption_checks`` (:func:`caption_files`). The encoder itself: ``components/data/captions.py``."""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from components.config import PreprocessConfig
from components.data import captions as cap
from components.data.build.common import LISTED_MAX, PreprocessError, _digest
from components.data.build.planning import Plan
from components.data.caption_backend import AUTO, reference_or
from components.io.files import replacing, write_json

CAPTION_TRUNCATED = "caption-truncated"


# Caption actors are not restarted by Ray (``max_restarts=0``, see :func:`_embedding_stage`):
# when one dies (OOM kill, a lost node) the stage runs again over the captions not yet
# embedded, on new actors, at most this many times; then the build fails with one line.
CAPTION_STAGE_RETRIES = 3


def embed_captions(cfg: PreprocessConfig, texts: list[str], out: Path) -> np.ndarray:
    """``[len(texts), E]`` float32 rows, one per unique text; cached in ``captions.npz``.

    Raises:
        PreprocessError: caption actors died more than ``CAPTION_STAGE_RETRIES`` times.
    """
    import ray

    if cfg.captions.backend == AUTO:  # the driver resolves it (caption_backend.choose)
        raise ValueError("embed_captions needs a resolved captions.backend, not 'auto'")
    cache = out / "captions.npz"
    key = _digest({"texts": texts, "model": cfg.captions.model,
                   **({} if cfg.captions.backend == "torch" else
                      {"backend": cfg.captions.backend})})
    if cache.exists():
        with np.load(cache) as z:
            if str(z["key"]) == key:
                return np.asarray(z["embeddings"])
    # Shortest first: each actor batch then holds captions of similar length, so the encoder
    # pads little (the table itself is sorted alphabetically); caption_id maps rows back.
    by_length = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    emb: np.ndarray | None = None
    done = np.zeros(len(texts), dtype=bool)
    for attempt in range(CAPTION_STAGE_RETRIES + 1):
        todo = [i for i in by_length if not done[i]]
        if not todo:
            break
        try:
            for batch in _embedding_stage(cfg, texts, todo).iter_batches(
                    batch_size=None, batch_format="numpy"):
                ids, rows = batch["caption_id"], np.asarray(batch["embedding"], np.float32)
                if emb is None:
                    emb = np.zeros((len(texts), rows.shape[1]), dtype=np.float32)
                emb[ids] = rows
                done[ids] = True
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
            what = f"a caption actor died ({type(e).__name__})"
            if attempt == CAPTION_STAGE_RETRIES:
                raise PreprocessError(
                    f"{what}, {attempt + 1} times; {int(done.sum())} of {len(texts)} captions "
                    "were embedded. If they ran out of memory, lower captions.batch_size or "
                    "captions.actors; then run the same command again") from None
            print(f"simgraph preprocess: {what}; embedding the {len(texts) - int(done.sum())} "
                  "captions left on new actors", file=sys.stderr, flush=True)
    assert emb is not None and done.all()
    with replacing(cache) as tmp:
        np.savez(tmp, key=np.array(key), embeddings=emb)
    return emb


def _embedding_stage(cfg: PreprocessConfig, texts: list[str], ids: list[int]) -> Any:
    """The Ray Data actor pool that embeds ``texts[i]`` for ``i`` in ``ids`` (batched in that
    order): ``{caption_id, text}`` rows → ``{caption_id, embedding}`` batches.

    ``max_restarts=0``: Ray Data hands every pool actor its context and the batch function as
    object refs, and Ray's core logs an error-level line for any restartable actor built from
    object-store arguments ("has constructor arguments in the object store and max_restarts >
    0"; docs/ray-notes.md, "Ray Data"). :func:`embed_captions` re-runs the captions a dead
    actor left instead of Ray restarting it."""
    import ray
    from ray.util.annotations import RayDeprecationWarning

    # The ONNX backends run on CPU (the same encoder as the driver's class embeddings).
    use_gpu = cfg.captions.backend == "torch" and ray.cluster_resources().get("GPU", 0) > 0
    items = ray.data.from_items([{"caption_id": i, "text": texts[i]} for i in ids])
    with warnings.catch_warnings():
        # Ray 2.60's map_batches has no named max_restarts yet: it goes through the extra
        # remote arguments, which it says are deprecated (a TypeError once they are removed).
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated",
                                RayDeprecationWarning)
        return items.map_batches(
            cap.CaptionEmbedder,
            fn_constructor_kwargs={"model": cfg.captions.model,
                                   "device": "cuda" if use_gpu else "cpu",
                                   "backend": cfg.captions.backend},
            batch_size=cfg.captions.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=cfg.captions.actors),
            num_gpus=1 if use_gpu else 0,
            num_cpus=1,
            max_restarts=0,
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
    data = {"model": cfg.captions.model, "max_seq_length": limit, "texts": plan_.texts,
            "tokens": tokens}
    write_json(out / "captions.json", data)
    index = np.stack([plan_.sample_ids.astype(np.int64),
                      plan_.caption_ids.astype(np.int64)], axis=1)
    with replacing(out / "caption_index.npy") as tmp:
        np.save(tmp, index.reshape(-1, 2))
    over = np.array([t > limit for t in tokens] + [False], dtype=bool)  # [-1]: no caption
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


def _stored_dim(out: Path) -> int:
    cache = out / "captions.npz"
    if cache.exists():
        with np.load(cache) as z:
            return int(z["embeddings"].shape[1])
    return 0
