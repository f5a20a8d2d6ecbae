"""One embedding per image with a trained encoder, as a Parquet file (``simgraph embed``).

Two inputs, one centre view per image exactly as ``simgraph evaluate`` sees it:

* a **dataset dir** (:func:`embed_dataset`): each split's ``.beton`` through
  :class:`~components.data.reader.ViewLoader` (``train=False``, one view): FFCV's decoding, the
  evaluation centre crop of ``eval_crop_ratio`` of the shorter side resized to ``resolution``
  (:class:`~components.data.augment.resize.BilinearCenterCrop`, or FFCV's ``INTER_AREA`` one
  with ``interpolation: area``), normalised with the run's mean / std. Rows carry the sample
  id, split, label, class and — when the dataset stores the texts (``captions.json`` +
  ``caption_index.npy``) — the caption.
* a **folder of images** never preprocessed (:func:`embed_folder`): listed with the class-folder
  convention of ``source.kind: folder`` (:func:`components.data.sources.list_folder`: the
  top-level sub-folder is the class, ``name.txt`` beside ``name.png`` its caption; images at
  the folder's root have no class), decoded by the preprocessing decoder
  (:func:`components.data.images.decode_image`: RGB conversion, EXIF orientation, the longer
  side shrunk to ``max_side`` as the build does), then the *same* crop arithmetic
  (FFCV's ``get_center_crop``) and the *same* resize kernel the reader's decoder runs
  (:func:`~components.data.augment.resize.resize_crop_bilinear`, or ``libffcv.resize_crop``),
  and the reader's normalisation. An image embedded from its folder and from a raw-stored
  dataset dir built from that folder therefore gets the same features
  (``tests/export/test_embed.py`` measures the difference). Files that do not decode are
  skipped and reported.

Both go through :func:`components.training.step.extract_features` (eval mode, backbone or
projector),
batched, with a progress bar on stderr when it is a terminal.

The Parquet file (:func:`to_table`, :func:`write_parquet`, format :data:`FORMAT`): one row per
image — ``sample_id`` int64 and ``split`` (dataset dir) or ``path`` (folder), ``label`` int64,
``class``, ``caption`` (null where not known), ``embedding`` ``fixed_size_list<float32>[D]`` —
and the schema metadata key ``simgraph`` (JSON: format, run, checkpoint, feature, dimension,
input, data). Written whole or not at all (:func:`components.io.files.replacing`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import components.data  # noqa: F401  (its FFCV import hook, before any FFCV import here)
from components.config import AugmentConfig
from components.errors import SimgraphError
from components.models.encoders import Encoder

FORMAT = "simgraph-embeddings/1"
METADATA_KEY = b"simgraph"
NO_MAX_SIDE = 1 << 30  # decode_image's max_side when the images are not to be shrunk
MISSING_FILE = "missing-file"  # a listed file that cannot be read (decode reasons: images.py)


class EmbedError(SimgraphError, RuntimeError):
    """Images cannot be embedded; the message says why and what to do."""


class EmbedArgumentError(SimgraphError, ValueError):
    """A bad argument (an unknown split, ``--split`` for a folder): exit 2, as argparse's."""

    exit_code = 2


@dataclasses.dataclass(kw_only=True)
class Embedded:
    """What :func:`embed_dataset` / :func:`embed_folder` return: row ``i`` of every field is
    image ``i``."""

    embeddings: np.ndarray  # [N, D] float32
    labels: np.ndarray  # [N] int64; -1: not known
    classes: list[str]  # label i is classes[i]
    captions: list[str | None]
    sample_ids: np.ndarray | None = None  # [N] int64 (dataset dir)
    splits: list[str] | None = None  # (dataset dir)
    paths: list[str] | None = None  # (folder)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (path, reason)

    def __len__(self) -> int:
        return len(self.embeddings)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])


# ---------------------------------------------------------------------------------------------
# The device embeddings are computed on.


def default_device() -> torch.device:
    """``cuda:0`` or ``cpu``, from this process's resources (always indexed: FFCV's loader
    thread needs it; :func:`components.data.devices.resolve_device`)."""
    from components.data.devices import resolve_device

    return resolve_device(None)


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", leave=False, file=sys.stderr,
                disable=not sys.stderr.isatty())


def _features(encoder: Encoder, images: torch.Tensor, device: torch.device,
              projector: bool) -> np.ndarray:
    """``extract_features`` of one batch ``[B, 3, H, W]`` (normalised) as float32 numpy."""
    from components.training.step import extract_features

    batch = SimpleNamespace(images=images.to(device)[:, None],
                            labels=torch.zeros(len(images), dtype=torch.long))
    f, _ = extract_features(encoder, [batch], device, projector=projector)
    return f.float().cpu().numpy()


# ---------------------------------------------------------------------------------------------
# A dataset dir.


def dataset_splits(info: Any, split: str | None) -> list[str]:
    """The splits to embed: ``split``, or every split with samples (manifest order).

    Raises:
        EmbedArgumentError: ``split`` is not one of the dataset's splits.
        EmbedError: it is, but holds no samples.
    """
    have = [s for s, n in info.splits.items() if n]
    if split is None:
        if not have:
            raise EmbedError(f"{info.root} has no samples in any split")
        return have
    if split not in info.splits:
        raise EmbedArgumentError(f"--split {split!r} is not a split of {info.root}; it has "
                                 f"{', '.join(have) or 'no samples'}")
    if not info.splits[split]:
        raise EmbedError(f"split {split!r} of {info.root} has no samples; splits with samples: "
                         f"{', '.join(have) or 'none'}")
    return [split]


def dataset_captions(info: Any) -> Callable[[np.ndarray], list[str | None]] | None:
    """Sample ids → caption texts, when the dataset stores them (``captions.json`` and
    ``caption_index.npy``, named in the manifest's ``class_files``); else ``None``."""
    files = info.manifest.get("class_files") or {}
    texts_file, index_file = files.get("captions"), files.get("caption_index")
    if not texts_file or not index_file:
        return None
    try:
        texts = json.loads((info.root / texts_file).read_text())["texts"]
        index = np.load(info.root / index_file).reshape(-1, 2)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"simgraph embed: warning: cannot read the caption texts of {info.root} ({e}); "
              "the caption column stays empty", file=sys.stderr)
        return None
    order = np.argsort(index[:, 0], kind="stable")
    ids, caption_ids = index[order, 0], index[order, 1]

    def lookup(sample_ids: np.ndarray) -> list[str | None]:
        at = np.clip(np.searchsorted(ids, sample_ids), 0, max(len(ids) - 1, 0))
        out: list[str | None] = []
        for sid, k in zip(sample_ids.tolist(), at.tolist(), strict=True):
            c = int(caption_ids[k]) if len(ids) and ids[k] == sid else -1
            out.append(texts[c] if 0 <= c < len(texts) else None)
        return out

    return lookup


def embed_dataset(
    encoder: Encoder, dataset: str | Path, augment: AugmentConfig, *, split: str | None = None,
    projector: bool = False, batch_size: int = 256, num_workers: int = 2,
    device: torch.device | None = None, jit: bool | None = None,
) -> Embedded:
    """Embed ``split`` (default: every split with samples) of a dataset dir.

    Raises:
        DatasetError: not a complete dataset dir, or an unreadable split file.
        EmbedArgumentError / EmbedError: see :func:`dataset_splits`.
    """
    from components.data.multicrop import view_of
    from components.data.reader import DatasetInfo, ViewLoader, set_jit

    info = DatasetInfo.load(dataset)
    splits = dataset_splits(info, split)
    dev = device or default_device()
    if jit is not None:
        set_jit(jit)
    encoder = encoder.to(dev)
    captions = dataset_captions(info)
    feats, labels, ids, names = [], [], [], []
    for s in splits:  # (FFCV leaves torch's thread count alone: components.data.ffcv_import)
        loader = ViewLoader(info.split_file(s), batch_size=batch_size, views=1,
                            augment=augment, train=False, device=dev,
                            num_workers=num_workers, with_captions=False)
        with _progress(info.splits[s], f"embed {s}") as bar:
            for b in loader:
                feats.append(_features(encoder, view_of(b.images, 0), dev, projector))
                labels.append(b.labels.cpu().numpy())
                ids.append(b.sample_ids.cpu().numpy())
                names += [s] * len(b.labels)
                bar.update(len(b.labels))
    sample_ids = np.concatenate(ids).astype(np.int64)
    return Embedded(
        embeddings=np.concatenate(feats).astype(np.float32, copy=False),
        labels=np.concatenate(labels).astype(np.int64),
        classes=list(info.classes),
        captions=captions(sample_ids) if captions else [None] * len(sample_ids),
        sample_ids=sample_ids, splits=names,
    )


# ---------------------------------------------------------------------------------------------
# A folder of images.


@dataclasses.dataclass(frozen=True)
class FolderImage:
    path: str
    label: int  # -1: at the folder's root, no class
    caption: str | None


def list_images(root: str | Path) -> tuple[list[FolderImage], list[str]]:
    """The images of a folder and its class names: class sub-folders as ``source.kind:
    folder`` lists them (every file in them but caption sidecars), plus the image files at the
    root (no class).

    Raises:
        EmbedError: not a directory, or no file with an image suffix in it.
    """
    from components.data.sources import IMAGE_SUFFIXES, decode_caption, list_folder

    base = Path(root)
    if not base.is_dir():
        raise EmbedError(f"--data {root} is neither a dataset dir (no manifest.json) nor a "
                         "folder of images")
    items: list[FolderImage] = []  # the root's images first, then each class folder's
    top = sorted(p for p in base.iterdir() if p.is_file() and not p.name.startswith("."))
    names = {p.name for p in top}
    for p in top:
        if p.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        caption = None
        if p.stem + ".txt" in names:
            caption, _ = decode_caption(p.with_suffix(".txt").read_bytes(), first_line=True)
        items.append(FolderImage(str(p), -1, caption))
    classes: list[str] = []
    if any(p.is_dir() and not p.name.startswith(".") for p in base.iterdir()):
        listing = list_folder(str(base))
        classes = listing.classes
        items += [FolderImage(it.path, it.label, it.caption) for it in listing.items]
    if not any(Path(it.path).suffix.lower() in IMAGE_SUFFIXES for it in items):
        raise EmbedError(f"--data {root} is neither a dataset dir (no manifest.json) nor a "
                         f"folder with images (no {'/'.join(sorted(IMAGE_SUFFIXES))} file in it "
                         "or in its sub-folders)")
    return items, classes


def eval_view(rgb: np.ndarray, augment: AugmentConfig) -> np.ndarray:
    """The evaluation centre view of a decoded ``[H, W, 3]`` uint8 image, ``[R, R, 3]``
    uint8: FFCV's centre-crop arithmetic (``get_center_crop``: a square of ``int(ratio *
    shorter side)``, offsets ``(H - side) // 2``, ``(W - side) // 2``) and the resize kernel
    the reader's decoder calls — the same functions, so the same pixels.

    Raises:
        ValueError: the crop is empty (an image smaller than 1 / ``eval_crop_ratio`` px).
    """
    from ffcv.fields.rgb_image import get_center_crop

    from components.data.augment.resize import resize_crop_bilinear

    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w = rgb.shape[:2]
    i, j, ch, cw = get_center_crop(h, w, None, augment.eval_crop_ratio)
    if ch < 1 or cw < 1:
        raise ValueError(f"{w}x{h} px is too small for a centre crop of ratio "
                         f"{augment.eval_crop_ratio}")
    r = augment.resolution
    out = np.empty((r, r, 3), np.uint8)
    if augment.interpolation == "bilinear":
        resize_crop_bilinear(rgb, int(i), int(i + ch), int(j), int(j + cw), out)
    else:
        from ffcv.libffcv import resize_crop

        resize_crop(rgb, int(i), int(i + ch), int(j), int(j + cw), out)
    return out


def normalise(views: np.ndarray, augment: AugmentConfig) -> torch.Tensor:
    """``[B, R, R, 3]`` uint8 → ``[B, 3, R, R]`` float32, as the reader normalises:
    ``(x - 255·mean) / (255·std)``."""
    x = torch.from_numpy(np.ascontiguousarray(views)).permute(0, 3, 1, 2).contiguous()
    mean = torch.tensor(augment.mean).view(1, 3, 1, 1) * 255
    std = torch.tensor(augment.std).view(1, 3, 1, 1) * 255
    return (x.float() - mean) / std


def _decode_view(path: str, augment: AugmentConfig, max_side: int) -> np.ndarray | str:
    """The centre view of the image at ``path``, or the reason it was skipped."""
    from components.data.images import TOO_SMALL, ImageError, decode_image
    from components.data.sources import read_item

    try:
        data = read_item(path)
    except OSError:
        return MISSING_FILE
    try:
        return eval_view(decode_image(data, max_side=max_side, min_side=1), augment)
    except ImageError as e:
        return e.reason
    except ValueError:  # eval_view: no pixel left to crop
        return TOO_SMALL


def _chunks(seq: Sequence[FolderImage], n: int) -> Iterator[Sequence[FolderImage]]:
    for start in range(0, len(seq), n):
        yield seq[start:start + n]


def run_classes(labels: Sequence[int], folder_classes: Sequence[str],
                run: Sequence[str] | None) -> tuple[list[int], list[str]]:
    """A folder's labels and classes numbered as the run's dataset numbers them: a class
    sub-folder named like one of the run's classes takes its index (``red_square`` is label 3
    in the folder's embedding as in the dataset's, whatever other sub-folders there are), the
    other names come after the run's classes; ``run`` ``None`` / empty: the folder's own
    numbering (its sorted sub-folders). ``-1`` (no class) stays."""
    if not run:
        return list(labels), list(folder_classes)
    order = list(run) + [c for c in folder_classes if c not in run]
    at = {c: i for i, c in enumerate(order)}
    return [at[folder_classes[x]] if x >= 0 else -1 for x in labels], order


def embed_folder(
    encoder: Encoder, folder: str | Path, augment: AugmentConfig, *, projector: bool = False,
    max_side: int | None = None, batch_size: int = 256, num_workers: int = 2,
    device: torch.device | None = None, classes_of_run: Sequence[str] | None = None,
) -> Embedded:
    """Embed every image of a folder (see the module docstring). ``max_side``: shrink the
    longer side to this first, as the preprocessing of the dataset the run trained on did
    (``None``: decode at full size). ``classes_of_run``: the run's dataset's classes, which
    number the folder's labels (:func:`run_classes`).

    Raises:
        EmbedError: no image in it (:func:`list_images`), or none of its files decodes.
    """
    items, classes = list_images(folder)
    import ffcv.fields.rgb_image  # noqa: F401  (once, before the decoding threads need it)
    dev = device or default_device()
    encoder = encoder.to(dev)
    side = max_side or NO_MAX_SIDE
    feats: list[np.ndarray] = []
    kept: list[FolderImage] = []
    skipped: list[tuple[str, str]] = []
    chunks = list(_chunks(items, batch_size))
    with ThreadPoolExecutor(max(1, num_workers)) as pool, \
            _progress(len(items), "embed images") as bar:
        def decode(k: int) -> list[Future[np.ndarray | str]]:
            return [pool.submit(_decode_view, it.path, augment, side) for it in chunks[k]]

        pending = decode(0) if chunks else []
        for k, chunk in enumerate(chunks):
            got = [f.result() for f in pending]
            # the next chunk decodes while this one runs through the encoder
            pending = decode(k + 1) if k + 1 < len(chunks) else []
            views = []
            for it, view in zip(chunk, got, strict=True):
                if isinstance(view, str):
                    skipped.append((it.path, view))
                else:
                    views.append(view)
                    kept.append(it)
            if views:
                feats.append(_features(encoder, normalise(np.stack(views), augment), dev,
                                       projector))
            bar.update(len(chunk))
    if not kept:
        reasons = sorted({r for _, r in skipped})
        raise EmbedError(f"no image in {folder} could be decoded ({len(skipped)} files: "
                         f"{', '.join(reasons)})")
    labels, classes = run_classes([it.label for it in kept], classes, classes_of_run)
    return Embedded(
        embeddings=np.concatenate(feats).astype(np.float32, copy=False),
        labels=np.array(labels, dtype=np.int64),
        classes=classes,
        captions=[it.caption for it in kept],
        paths=[it.path for it in kept],
        skipped=skipped,
    )


# ---------------------------------------------------------------------------------------------
# The Parquet file.


def _classes_of(labels: np.ndarray, classes: Sequence[str]) -> list[str | None]:
    return [classes[y] if 0 <= y < len(classes) else None for y in labels.tolist()]


def to_table(e: Embedded, metadata: dict[str, Any] | None = None) -> Any:
    """The rows as a ``pyarrow.Table`` (columns in the module docstring), ``metadata`` under
    the schema key :data:`METADATA_KEY` (with ``format`` and ``dim`` added)."""
    import pyarrow as pa

    n, d = e.embeddings.shape
    flat = pa.array(np.ascontiguousarray(e.embeddings, dtype=np.float32).reshape(-1),
                    type=pa.float32())
    columns: dict[str, Any] = {}
    if e.sample_ids is not None:
        columns["sample_id"] = pa.array(e.sample_ids, type=pa.int64())
    if e.splits is not None:
        columns["split"] = pa.array(e.splits, type=pa.string())
    if e.paths is not None:
        columns["path"] = pa.array(e.paths, type=pa.string())
    known = e.labels >= 0
    columns["label"] = pa.array(e.labels, type=pa.int64(), mask=~known)
    columns["class"] = pa.array(_classes_of(e.labels, e.classes), type=pa.string())
    columns["caption"] = pa.array(e.captions, type=pa.string())
    columns["embedding"] = pa.FixedSizeListArray.from_arrays(flat, d)
    table = pa.table(columns)
    meta = {"format": FORMAT, "rows": n, "dim": d, **(metadata or {})}
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})


def write_parquet(table: Any, out: str) -> None:
    """Write ``table`` to ``out`` (a path or URI) whole or not at all."""
    import pyarrow.parquet as pq

    from components.io import storage
    from components.io.files import replacing

    if storage.is_uri(out):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="simgraph-embed-") as d:
            local = Path(d) / "embeddings.parquet"
            pq.write_table(table, local)
            storage.upload_file(local, out)
        return
    with replacing(out) as tmp:
        pq.write_table(table, tmp)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``simgraph`` schema metadata of an embeddings file."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return dict(json.loads(meta.get(METADATA_KEY, b"{}")))


def embeddings_of(table: Any) -> np.ndarray:
    """The ``embedding`` column as ``[N, D]`` float32."""
    col = table.column("embedding").combine_chunks()
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False),
                      dtype=np.float32).reshape(len(col), -1)


def describe_input(augment: AugmentConfig) -> dict[str, Any]:
    """The metadata's ``input``: the evaluation view the embeddings were computed from."""
    return {"resolution": augment.resolution, "eval_crop_ratio": augment.eval_crop_ratio,
            "interpolation": augment.interpolation, "mean": list(augment.mean),
            "std": list(augment.std)}


__all__ = ["EmbedArgumentError", "EmbedError", "Embedded", "FORMAT", "embed_dataset",
           "embed_folder", "embeddings_of", "eval_view", "list_images",
           "normalise", "read_metadata", "to_table", "write_parquet"]
