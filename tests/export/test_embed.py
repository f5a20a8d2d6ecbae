"""``simgraph embed``: a dataset split's rows are its samples with ``extract_features``'
embeddings; a folder of images gets the features of the same images read from a raw-stored
dataset dir; the Parquet file's columns and metadata; bad input is a one-line error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from components.config import AugmentConfig, PretrainConfig
from components.data.images import decode_image
from components.data.reader import DatasetInfo, ViewLoader
from components.data.shards import page_size_for, write_shard
from components.export.embed import (
    FORMAT,
    NO_MAX_SIDE,
    embed_folder,
    embeddings_of,
    eval_view,
    normalise,
    read_metadata,
)
from components.export.run_embed import embed_run
from components.training.step import extract_features
from tests.support.datasets import checkpoint_encoder, run_with_checkpoint, synthetic_dataset

# Max |difference| allowed between an image's features embedded from its folder and from a
# raw-stored .beton of the same decoded image: both routes run the same crop arithmetic and
# the same resize kernel on the same pixels, then the same normalisation and encoder, so the
# difference measured is 0 (bit-identical); the allowance only covers a batch of other size
# or composition taking another BLAS path (not seen here).
FOLDER_VS_BETON = 1e-5


pytestmark = pytest.mark.usefixtures("no_jit")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_dataset(tmp_path_factory.mktemp("embed") / "ds")


def _run(dataset: Path, storage: Path, name: str, checkpoint: bool = True,
         **over: Any) -> Path:
    """A run dir with one checkpoint, BatchNorm running statistics randomised (eval mode
    matters)."""
    return run_with_checkpoint(dataset, storage, name, checkpoint, random_bn_stats=True,
                               **over)


def _encoder(run_dir: Path) -> tuple[PretrainConfig, Any]:
    """The run's encoder by the independent route (the whole training model rebuilt)."""
    return checkpoint_encoder(run_dir / "epoch_00001")


def _reference(run_dir: Path, beton: Path, projector: bool = False,
               batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """extract_features over the evaluation reader, as `simgraph evaluate` computes them:
    (features, labels, sample ids) in file order."""
    cfg, encoder = _encoder(run_dir)
    cpu = torch.device("cpu")
    loader = ViewLoader(beton, batch_size=batch_size or cfg.data.batch_size, views=1,
                        augment=cfg.data.augment, train=False, num_workers=1,
                        with_captions=False)
    batches = list(loader)
    f, y = extract_features(encoder, batches, cpu, projector=projector)
    ids = torch.cat([b.sample_ids for b in batches])
    return f.numpy(), y.numpy(), ids.numpy()


def test_dataset_split_rows_are_its_samples(dataset: Path, tmp_path: Path) -> None:
    run = _run(dataset, tmp_path, "r", model__projector_dim=24)
    out = tmp_path / "val.parquet"
    got = embed_run(str(run), str(dataset), str(out), split="val")
    table = pq.read_table(out)
    f, y, ids = _reference(run, dataset / "val.beton")
    assert got["rows"] == table.num_rows == DatasetInfo.load(dataset).splits["val"] == 32
    assert table.column_names == ["sample_id", "split", "label", "class", "caption",
                                  "embedding"]
    assert table.column("sample_id").to_pylist() == ids.tolist()
    assert table.column("label").to_pylist() == y.tolist()
    assert table.column("class").to_pylist() == [f"class{c}" for c in y]
    assert set(table.column("split").to_pylist()) == {"val"}
    assert table.column("caption").null_count == 32  # the synthetic set stores no texts
    emb = embeddings_of(table)
    assert emb.dtype == np.float32 and emb.shape == (32, 16)  # convnet width 8, 2 blocks
    kind = table.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(kind) and kind.list_size == 16
    assert kind.value_type == pa.float32()
    np.testing.assert_allclose(emb, f, rtol=0, atol=1e-6)
    meta = read_metadata(out)
    assert meta["format"] == FORMAT and meta["feature"] == "backbone" and meta["dim"] == 16
    assert meta["epoch"] == 1 and meta["data"]["splits"] == ["val"]
    assert meta["input"]["resolution"] == 16 and meta["checkpoint"].endswith("epoch_00001")

    # --projector: the projector's width and outputs
    got = embed_run(str(run), str(dataset), str(out), split="val", projector=True)
    emb = embeddings_of(pq.read_table(out))
    fp, _, _ = _reference(run, dataset / "val.beton", projector=True)
    assert got["dim"] == emb.shape[1] == 24 and read_metadata(out)["feature"] == "projector"
    np.testing.assert_allclose(emb, fp, rtol=0, atol=1e-6)

    # default: every split with samples, in manifest order
    got = embed_run(str(run), str(dataset), str(out))
    table = pq.read_table(out)
    ft, _, ids_t = _reference(run, dataset / "train.beton")
    assert table.num_rows == 160 and got["data"]["splits"] == ["train", "val"]
    assert table.column("split").to_pylist() == ["train"] * 128 + ["val"] * 32
    assert table.column("sample_id").to_pylist() == ids_t.tolist() + ids.tolist()
    np.testing.assert_allclose(embeddings_of(table), np.concatenate([ft, f]), rtol=0,
                               atol=1e-6)


def test_captions_when_the_dataset_stores_them(dataset: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    texts = ["a zebra", "stripes, diagonal"]
    # caption_index: [sample id, caption id]; -1: no caption; ids not in file order
    index = np.array([[129, 1], [128, 0], [130, -1]], dtype=np.int64)
    (ds / "captions.json").write_text(json.dumps({"texts": texts, "tokens": [3, 4]}))
    np.save(ds / "caption_index.npy", index)
    m = json.loads((ds / "manifest.json").read_text())
    m["class_files"].update(captions="captions.json", caption_index="caption_index.npy")
    (ds / "manifest.json").write_text(json.dumps(m))
    run = _run(ds, tmp_path, "c")
    embed_run(str(run), str(ds), str(tmp_path / "e.parquet"), split="val")
    t = pq.read_table(tmp_path / "e.parquet").to_pydict()
    caption = dict(zip(t["sample_id"], t["caption"], strict=True))
    assert caption[128] == "a zebra" and caption[129] == "stripes, diagonal"
    assert caption[130] is None and caption[140] is None


def _png(path: Path, rgb: np.ndarray, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(rgb)
    if mode == "L":
        img = img.convert("L")
    elif mode == "RGBA":
        img = img.convert("RGBA")
    img.save(path)


def _folder(root: Path) -> list[Path]:
    """PNGs of several sizes and modes in two class folders and at the root, a caption
    sidecar and a file that is not an image; returns the image paths in listing order."""
    rng = np.random.default_rng(3)
    sizes = [(16, 16), (20, 24), (31, 17), (9, 40), (64, 48), (16, 16)]
    paths = [root / "top.png"]
    paths += [root / "cat" / f"{i}.png" for i in range(3)]
    paths += [root / "dog" / f"{i}.png" for i in range(2)]
    for p, (h, w), mode in zip(paths, sizes, ["RGB", "RGB", "L", "RGBA", "RGB", "RGB"],
                               strict=True):
        _png(p, rng.integers(0, 256, (h, w, 3), dtype=np.uint8), mode)
    (root / "cat" / "1.txt").write_text("a grey cat\n")
    (root / "dog" / "notes.md").write_text("not an image")
    return paths


def test_folder_matches_a_beton_of_the_same_images(dataset: Path, tmp_path: Path) -> None:
    run = _run(dataset, tmp_path, "f")
    cfg, encoder = _encoder(run)
    paths = _folder(tmp_path / "imgs")
    got = embed_folder(encoder, tmp_path / "imgs", cfg.data.augment, batch_size=4,
                       num_workers=2, device=torch.device("cpu"))
    assert got.paths == [str(p) for p in paths]
    assert got.classes == ["cat", "dog"]
    assert got.labels.tolist() == [-1, 0, 0, 0, 1, 1]
    assert got.captions == [None, None, "a grey cat", None, None, None]
    assert got.skipped == [(str(tmp_path / "imgs" / "dog" / "notes.md"), "not-an-image")]

    # The same images decoded as preprocessing decodes them, stored raw with write_shard.
    images = [decode_image(p.read_bytes(), max_side=NO_MAX_SIDE, min_side=1) for p in paths]
    beton = tmp_path / "imgs.beton"
    write_shard(beton, images, np.zeros(len(images), np.int64), np.arange(len(images)), None,
                write_mode="raw", jpeg_quality=90, page_size=page_size_for(64, 0))
    ref, _, _ = _reference(run, beton, batch_size=4)
    diff = float(np.abs(got.embeddings - ref).max())
    assert diff <= FOLDER_VS_BETON, diff

    # also through the pipeline: a Parquet file with path / label / class / caption
    embed_run(str(run), str(tmp_path / "imgs"), str(tmp_path / "f.parquet"))
    t = pq.read_table(tmp_path / "f.parquet")
    assert t.column_names == ["path", "label", "class", "caption", "embedding"]
    assert t.column("class").to_pylist() == [None, "cat", "cat", "cat", "dog", "dog"]
    # numbered as the run's dataset numbers its classes: cat and dog are not among its four
    # (class0 ... class3), so they come after them (test_a_folders_labels_are_numbered_...)
    assert t.column("label").to_pylist() == [None, 4, 4, 4, 5, 5]
    meta = read_metadata(tmp_path / "f.parquet")
    assert meta["data"]["kind"] == "folder" and meta["data"]["skipped"] == 1
    assert meta["data"]["max_side"] is None  # the synthetic manifest does not record it
    assert float(np.abs(embeddings_of(t) - ref).max()) <= FOLDER_VS_BETON


def test_folder_images_are_shrunk_as_the_runs_dataset_was_built(dataset: Path,
                                                                 tmp_path: Path) -> None:
    """The manifest's image.max_side: the folder route shrinks larger images to it first,
    as the build did (decode_image), before the evaluation crop."""
    ds = tmp_path / "ds"
    shutil.copytree(dataset, ds)
    m = json.loads((ds / "manifest.json").read_text())
    m["fields"]["image"] = {"type": "RGBImageField", "write_mode": "raw", "max_side": 20}
    (ds / "manifest.json").write_text(json.dumps(m))
    run = _run(ds, tmp_path, "m")
    paths = _folder(tmp_path / "imgs")
    got = embed_run(str(run), str(tmp_path / "imgs"), str(tmp_path / "m.parquet"))
    assert got["data"]["max_side"] == 20
    cfg, encoder = _encoder(run)
    images = [decode_image(p.read_bytes(), max_side=20, min_side=1) for p in paths]
    assert max(max(im.shape[:2]) for im in images) == 20  # the 64x48 image was shrunk
    ref = _features_of(encoder, images, cfg.data.augment)
    emb = embeddings_of(pq.read_table(tmp_path / "m.parquet"))
    assert float(np.abs(emb - ref).max()) <= FOLDER_VS_BETON
    full = embed_folder(encoder, tmp_path / "imgs", cfg.data.augment,
                        device=torch.device("cpu"))
    assert float(np.abs(full.embeddings - emb).max()) > 1e-3  # it matters


def _features_of(encoder: Any, images: list[np.ndarray], augment: AugmentConfig
                     ) -> np.ndarray:
    x = normalise(np.stack([eval_view(im, augment) for im in images]), augment)
    f, _ = extract_features(encoder, [SimpleNamespace(images=x[:, None],
                                                      labels=torch.zeros(len(x)))],
                            torch.device("cpu"))
    return f.numpy()


@pytest.mark.parametrize("interpolation", ["bilinear", "area"])
@pytest.mark.parametrize("ratio", [1.0, 0.875])
def test_folder_views_are_the_readers_pixels(tmp_path: Path, interpolation: str,
                                             ratio: float) -> None:
    """eval_view + normalise give exactly the reader's normalised centre views."""
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
              for h, w in [(16, 16), (20, 24), (31, 17), (9, 40), (64, 48)]]
    beton = tmp_path / "v.beton"
    write_shard(beton, images, np.zeros(5, np.int64), np.arange(5), None, write_mode="raw",
                jpeg_quality=90, page_size=page_size_for(64, 0))
    augment = AugmentConfig(resolution=12, eval_crop_ratio=ratio, interpolation=interpolation)
    loader = ViewLoader(beton, batch_size=5, views=1, augment=augment, train=False,
                        num_workers=1, with_captions=False)
    (batch,) = list(loader)
    ours = normalise(np.stack([eval_view(im, augment) for im in images]), augment)
    assert torch.equal(batch.images[:, 0], ours)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("simgraph embed: "), err
    return err


def test_errors_are_one_line(dataset: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.cli import main as cli

    run = _run(dataset, tmp_path, "e")
    out = str(tmp_path / "o.parquet")
    (tmp_path / "plain").mkdir()
    assert cli(["embed", str(tmp_path / "plain"), "--data", str(dataset), "--out", out]) == 1
    assert "is not a run dir" in _one_line(capsys)
    empty = _run(dataset, tmp_path, "empty", checkpoint=False)
    assert cli(["embed", str(empty), "--data", str(dataset), "--out", out]) == 1
    assert "has no complete checkpoint" in _one_line(capsys)
    (tmp_path / "half").mkdir()
    assert cli(["embed", str(run), "--data", str(dataset), "--checkpoint",
                str(tmp_path / "half"), "--out", out]) == 1
    assert "not a complete checkpoint" in _one_line(capsys)
    assert cli(["embed", str(run), "--data", str(tmp_path / "nowhere"), "--out", out]) == 1
    assert "is neither a dataset dir" in _one_line(capsys)
    (tmp_path / "texts" / "a").mkdir(parents=True)
    (tmp_path / "texts" / "a" / "x.txt").write_text("hello")
    assert cli(["embed", str(run), "--data", str(tmp_path / "texts"), "--out", out]) == 1
    assert "nor a folder with images" in _one_line(capsys)
    assert cli(["embed", str(run), "--data", str(dataset), "--split", "tset",
                "--out", out]) == 2
    err = _one_line(capsys)
    assert "'tset'" in err and "train, val" in err
    _folder(tmp_path / "imgs")
    assert cli(["embed", str(run), "--data", str(tmp_path / "imgs"), "--split", "val",
                "--out", out]) == 2
    assert "applies to a dataset dir" in _one_line(capsys)
    assert not Path(out).exists()
    assert cli(["embed", str(run), "--data", str(dataset), "--split", "val", "--out", out,
                "--checkpoint", str(run / "epoch_00001")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == out and "32 images, 16-d backbone features" in lines[0]
    assert pq.read_table(out).num_rows == 32
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.")] == []  # no temp


def test_a_folders_labels_are_numbered_as_the_runs_classes() -> None:
    """``embed --data <folder>`` numbered labels by the folder's own sorted sub-folders: a
    folder holding only red_square/ and yellow_cross/ gave red_square label 0, where the run's
    dataset (and ``embed --data <dataset>``) says 3 — joining the two tables went wrong."""
    from components.export.embed import run_classes

    run = ["blue_circle", "green_tri", "purple_star", "red_square", "yellow_cross"]
    labels, classes = run_classes([0, 1, -1, 2], ["red_square", "yellow_cross", "zebra"], run)
    assert labels == [3, 4, -1, 5] and classes == [*run, "zebra"]
    assert [classes[x] for x in labels if x >= 0] == ["red_square", "yellow_cross", "zebra"]
    assert run_classes([1, 0], ["a", "b"], None) == ([1, 0], ["a", "b"])  # no run classes
