"""Preprocessing pieces without Ray: image conversion, sources, splits, caption policy, merge."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.config import PreprocessConfig, from_dict
from components.data import captions as cap
from components.data.build import PreprocessError, plan
from components.data.images import (
    CORRUPT,
    NOT_AN_IMAGE,
    TOO_SMALL,
    ImageError,
    decode_image,
)
from components.data.shards import merge_shards, page_size_for, read_samples, write_shard
from components.data.sources import (
    DUPLICATE,
    UNKNOWN_LABEL,
    SourceError,
    list_folder,
    list_manifest,
    list_source,
    read_item,
)
from components.data.splits import assign_splits


def _encode(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


# --------------------------------------------------------------------------- image conversion


def test_grey_is_replicated() -> None:
    g = np.arange(64, dtype=np.uint8).reshape(8, 8)
    out = decode_image(_encode(Image.fromarray(g, "L")), max_side=64, min_side=1)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    assert all(np.array_equal(out[:, :, c], g) for c in range(3))


def test_rgba_is_composited_on_white() -> None:
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200  # red channel
    rgba[0, 0, 3] = 0  # fully transparent -> white
    rgba[1, 1, 3] = 255  # opaque -> (200, 0, 0)
    rgba[2, 2, 3] = 128  # half -> blend
    out = decode_image(_encode(Image.fromarray(rgba, "RGBA")), max_side=64, min_side=1)
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[1, 1]) == (200, 0, 0)
    a = 128 / 255
    white = 255 * (1 - a)
    np.testing.assert_allclose(out[2, 2], [200 * a + white, white, white], atol=1)


def test_palette_with_transparency_and_cmyk() -> None:
    p = Image.new("P", (4, 4), 0)
    p.putpalette([10, 20, 30, 0, 0, 0] + [0] * 762)
    p.putpixel((1, 1), 1)
    p.info["transparency"] = 1
    out = decode_image(_encode(p), max_side=64, min_side=1)
    assert tuple(out[0, 0]) == (10, 20, 30) and tuple(out[1, 1]) == (255, 255, 255)
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # pure red in CMYK
    out = decode_image(_encode(cmyk, "JPEG"), max_side=64, min_side=1)
    assert out[..., 0].min() > 200 and out[..., 1:].max() < 60


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    arr = np.array([[0, 32768], [65535, 257]], dtype=np.uint16)
    img = Image.fromarray(arr)  # mode I;16
    out = decode_image(_encode(img), max_side=64, min_side=1)
    np.testing.assert_array_equal(out[:, :, 0], [[0, 128], [255, 1]])


def test_float_image_is_scaled() -> None:
    out = decode_image(
        _encode(Image.fromarray(np.array([[0.0, 0.5], [1.0, 0.25]], np.float32), "F"), "TIFF"),
        max_side=64, min_side=1,
    )
    np.testing.assert_array_equal(out[:, :, 1], [[0, 128], [255, 64]])


def test_resize_keeps_aspect_and_never_enlarges() -> None:
    big = Image.fromarray(np.zeros((100, 50, 3), np.uint8))
    assert decode_image(_encode(big), max_side=40, min_side=1).shape == (40, 20, 3)
    assert decode_image(_encode(big), max_side=400, min_side=1).shape == (100, 50, 3)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"hello, I am text", NOT_AN_IMAGE),
        (_encode(Image.fromarray(
            np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)))[:2000],
         CORRUPT),
        (_encode(Image.fromarray(np.zeros((3, 40, 3), np.uint8))), TOO_SMALL),
    ],
    ids=["text", "truncated", "tiny"],
)
def test_bad_images_raise_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ImageError) as e:
        decode_image(data, max_side=64, min_side=8)
    assert e.value.reason == reason


# --------------------------------------------------------------------------- sources


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for c, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(3):  # distinct pixels: exact duplicates would be dropped
            Image.fromarray(np.full((16, 16, 3), i + 100 * c, np.uint8)).save(
                root / cls / f"{i}.png")
        (root / cls / "0.txt").write_text(f"a small {cls}\nsecond line\n")
    return root


def test_folder_listing_with_caption_sidecars(tmp_path: Path) -> None:
    lst = list_folder(str(_folder(tmp_path)))
    assert lst.classes == ["cat", "dog"]
    assert len(lst.items) == 6
    caps = {Path(i.path).parent.name + Path(i.path).stem: i.caption for i in lst.items}
    assert caps["cat0"] == "a small cat" and caps["dog1"] is None


def test_folder_class_outside_list_is_skipped_or_error(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    lst = list_folder(str(root), classes=["cat"])
    assert len(lst.items) == 3 and {s.reason for s in lst.skipped} == {UNKNOWN_LABEL}
    assert len(lst.skipped) == 3
    with pytest.raises(SourceError, match="not in source.classes"):
        list_folder(str(root), classes=["cat"], on_bad_input="error")


def _tree(root: Path, files: list[str]) -> Path:
    for i, rel in enumerate(files):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((16, 16, 3), i, np.uint8)).save(root / rel)
        (root / rel).with_suffix(".txt").write_text(f"stamp {i}\n")
    return root


TREE = ["animals/birds/owl.png", "animals/birds/sparrow/one.png", "animals/fish/cod.png",
        "medical/pill.png", "top.png"]


@pytest.mark.parametrize("kind", ["folder", "tuxpaint"])
def test_label_depth_names_classes_by_folder_path(tmp_path: Path, kind: str) -> None:
    """Depth 1: the top-level folder; depth 2: two levels (deeper files take their first two,
    shallower ones what they have); a file at the root has no class."""
    from components.evaluation.labels import load_label_map

    root = _tree(tmp_path / "src", TREE)
    labels = {}
    for depth in (1, 2, 3):
        lst = list_source(kind, str(root), label_depth=depth)
        labels[depth] = {Path(i.path).name: lst.classes[i.label] for i in lst.items}
        assert all(i.caption and i.caption.startswith("stamp") for i in lst.items)
    assert labels[1] == {"owl.png": "animals", "one.png": "animals", "cod.png": "animals",
                         "pill.png": "medical"}
    assert labels[2] == {"owl.png": "animals/birds", "one.png": "animals/birds",
                         "cod.png": "animals/fish", "pill.png": "medical"}
    assert labels[3]["one.png"] == "animals/birds/sparrow"
    fine = list_source(kind, str(root), label_depth=2)
    assert fine.classes == ["animals/birds", "animals/fish", "medical"]
    groups, index = load_label_map("depth:1", fine.classes)  # evaluate --labels depth:1
    assert groups == ["animals", "medical"] and index.tolist() == [0, 0, 1]


def test_label_depth_errors(tmp_path: Path) -> None:
    from components.config import ConfigError, SourceConfig
    from components.evaluation.labels import LabelMapError, load_label_map

    with pytest.raises(ConfigError, match="source.label_depth=2 applies to folder and tuxpaint"):
        SourceConfig(kind="fashion-mnist", label_depth=2)
    with pytest.raises(ConfigError, match="source.label_depth"):
        SourceConfig(kind="folder", path="x", label_depth=0)
    with pytest.raises(SourceError, match="label_depth=2 applies to folder and tuxpaint"):
        list_source("manifest", str(tmp_path / "m.csv"), label_depth=2)
    with pytest.raises(LabelMapError, match="whole number >= 1"):
        load_label_map("depth:x", ["a/b", "c/d"])
    with pytest.raises(LabelMapError, match="gives 2 groups.*deeper source.label_depth"):
        load_label_map("depth:1", ["a", "c"])  # depth-1 classes: nothing to group


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_manifest_formats_labels_duplicates(tmp_path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    _folder(tmp_path)
    rows = [
        {"path": "imgs/cat/0.png", "label": "cat", "caption": "a cat"},
        {"path": "imgs/dog/1.png", "label": "dog", "caption": None},
        {"path": "imgs/cat/0.png", "label": "cat", "caption": "again"},  # duplicate
        {"path": "imgs/dog/2.png", "label": "horse", "caption": "x"},  # unknown label
    ]
    path = tmp_path / f"m.{fmt}"
    if fmt == "csv":
        pcsv.write_csv(pa.Table.from_pylist(rows), path)
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("\n".join(json.dumps(r) for r in rows))
    lst = list_manifest(str(path), classes=["cat", "dog"])
    assert [(Path(i.path).name, i.label, i.caption) for i in lst.items] == [
        ("0.png", 0, "a cat"), ("1.png", 1, None)
    ]
    assert sorted(s.reason for s in lst.skipped) == sorted([DUPLICATE, UNKNOWN_LABEL])
    assert Path(lst.items[0].path).is_absolute() and read_item(lst.items[0].path)[:4] == b"\x89PNG"
    # bad_input: error names the first problem in row order: the duplicate (row 3), not the
    # unknown label after it
    with pytest.raises(SourceError, match=r"0\.png: listed more than once; first kept"):
        list_manifest(str(path), classes=["cat", "dog"], on_bad_input="error")


def test_manifest_without_path_column(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text("file,label\na.png,1\n")
    with pytest.raises(SourceError, match="'path' column is required"):
        list_manifest(str(p))


def test_missing_builtin_names_the_apt_package(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="apt-get install dataset-fashion-mnist"):
        list_source("fashion-mnist", str(tmp_path / "nope"))
    with pytest.raises(SourceError, match="tuxpaint-stamps-default"):
        list_source("tuxpaint", str(tmp_path / "nope"))


# --------------------------------------------------------------------------- splits


def test_splits_are_stratified_and_deterministic() -> None:
    labels = [0] * 100 + [1] * 50 + [2] * 10
    a = assign_splits(labels, [None] * 160, 0.1, 0.2, seed=3)
    assert a == assign_splits(labels, [None] * 160, 0.1, 0.2, seed=3)
    assert a != assign_splits(labels, [None] * 160, 0.1, 0.2, seed=4)
    for cls, n in ((0, 100), (1, 50), (2, 10)):
        got = [s for s, y in zip(a, labels, strict=True) if y == cls]
        assert got.count("test") == round(0.2 * n) and got.count("val") == round(0.1 * n)


def test_official_test_split_is_kept() -> None:
    official = ["train"] * 20 + ["test"] * 10
    a = assign_splits([0] * 30, official, 0.25, 0.5, seed=0)
    assert a[20:] == ["test"] * 10 and a[:20].count("val") == 5 and "test" not in a[:20]


# --------------------------------------------------------------------------- caption policy


def test_caption_policy(tmp_path: Path) -> None:
    root = _folder(tmp_path)

    def cfg(missing: str) -> PreprocessConfig:
        return from_dict(PreprocessConfig, {
            "output": str(tmp_path / "out"),
            "source": {"kind": "folder", "path": str(root)},
            "captions": {"missing": missing},
        })

    with pytest.raises(PreprocessError, match="has no caption"):
        plan(cfg("error"))
    p = plan(cfg("skip"))
    assert len(p.rows) == 2 and len(p.skipped) == 4 and p.texts == ["a small cat", "a small dog"]
    p = plan(cfg("from-label"))
    assert len(p.rows) == 6 and not p.skipped
    assert p.texts == ["a photo of a cat", "a photo of a dog", "a small cat", "a small dog"]
    assert sorted(r.sample_id for r in p.rows) == list(range(6))


def test_from_label_reuses_a_listed_caption_equal_to_the_template(tmp_path: Path) -> None:
    """An item without a caption takes its class template; where a listed caption already has
    that text the item gets its id (one pass over the table, no dict of every caption), else
    the template is appended once, whoever needs it."""
    from components.data.build.listing import _caption_texts
    from components.data.sources import ItemTable

    table = ItemTable(paths=[f"{i}.png" for i in range(5)],
                      labels=np.array([0, 1, 0, 1, 1], np.int32),
                      caption_ids=np.array([0, -1, -1, 1, -1], np.int32),
                      captions=["a photo of a cat", "a dog"],
                      caption_issues=np.zeros(5, np.int8), official=None, groups=None,
                      classes=["cat", "dog"], skipped=[])
    cfg = from_dict(PreprocessConfig, {"output": str(tmp_path), "source": {
        "kind": "fashion-mnist"}, "captions": {"missing": "from-label"}})
    out, captions = _caption_texts(cfg, table, [], [])
    assert captions == ["a photo of a cat", "a dog", "a photo of a dog"]
    assert out.caption_ids.tolist() == [0, 2, 0, 1, 2]
    assert table.captions == ["a photo of a cat", "a dog"]  # the listing's table untouched


def test_class_texts_and_descriptions(tmp_path: Path) -> None:
    assert cap.class_texts(["a", "b"], ["x {}", "y {}"]) == [["x a", "y a"], ["x b", "y b"]]
    desc = tmp_path / "d.yaml"
    desc.write_text("a: an apple\nb: [a bee, a bug]\n")
    d = cap.load_descriptions(str(desc))
    assert cap.class_texts(["a", "b"], ["{}"], d) == [["an apple"], ["a bee", "a bug"]]
    with pytest.raises(cap.CaptionError, match="'c' has no entry"):
        cap.class_texts(["a", "c"], ["{}"], d)


def test_text_encoder_is_offline_and_deterministic() -> None:
    model = cap.load_encoder("default")
    e = cap.embed(model, ["a photo of a dog", "a cat", "a photo of a dog"])
    assert e.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(e[0], e[2], atol=1e-6)
    with pytest.raises(cap.CaptionError, match="nothing is downloaded"):
        cap.load_encoder("/nonexistent/model-folder")


# --------------------------------------------------------------------------- shards


def test_ffcv_imports_without_compiling_a_typed_dict() -> None:
    """components.data.ffcv_import: FFCV's image-mode table is a plain dict with FFCV's items,
    and importing FFCV in a fresh process compiles no numba function (the hook is why)."""
    import subprocess
    import sys

    code = (
        "import components.data, numba.core.dispatcher as d\n"
        "compiled = []\n"
        "orig = d.Dispatcher._compile_for_args\n"
        "def spy(self, *a, **k):\n"
        "    compiled.append(self.py_func.__qualname__)\n"
        "    return orig(self, *a, **k)\n"
        "d.Dispatcher._compile_for_args = spy\n"
        "import ffcv, ffcv.fields.rgb_image as r\n"
        "print(type(r.IMAGE_MODES).__name__, sorted(r.IMAGE_MODES.items()), compiled)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split("\n")
    assert out[-2] == "dict [('jpg', 0), ('raw', 1)] []"


def test_ffcv_leaves_torch_threads_alone(tmp_path: Path) -> None:
    """FFCV's Compiler.set_num_threads set torch's process-wide thread count to 1 on import
    and to data.num_workers at every Loader build, iteration and pipeline-thread start, so a
    step trained on the reader's thread count; now every batch of an epoch, and after it,
    sees the process's own count, while FFCV's numba side still gets num_workers."""
    import subprocess
    import sys

    from tests.support.datasets import synthetic_dataset

    data = synthetic_dataset(tmp_path / "ds", size=16)
    code = (
        "import sys, torch\n"
        "torch.set_num_threads(3)\n"
        "import components.data\n"
        "from components.data.reader import ViewLoader, set_jit\n"
        "set_jit(False)\n"
        "from ffcv.pipeline.compiler import Compiler\n"
        "seen = []\n"
        "loader = ViewLoader(sys.argv[1], batch_size=4, views=2, num_workers=1, train=True)\n"
        "for epoch in range(2):\n"
        "    loader.set_epoch(epoch)\n"
        "    for b in loader:\n"
        "        seen.append(torch.get_num_threads())\n"
        "print(sorted(set(seen)), len(seen), torch.get_num_threads(), Compiler.num_threads)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(data / "train.beton")],
                         capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split("\n")
    assert out[-2] == "[3] 64 3 1", out


def test_merge_equals_concatenation(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    parts, images, ids, caps = [], [], [], []
    for k, n in enumerate([3, 130, 11]):
        imgs = [rng.integers(0, 256, (int(rng.integers(8, 40)), int(rng.integers(8, 40)), 3),
                             dtype=np.uint8) for _ in range(n)]
        sid = np.arange(n) + 1000 * k
        c = rng.standard_normal((n, 6)).astype(np.float16)
        write_shard(tmp_path / f"{k}.beton", imgs, rng.integers(0, 5, n), sid, c,
                    write_mode="raw", jpeg_quality=90, page_size=page_size_for(40, 12))
        parts.append(tmp_path / f"{k}.beton")
        images += imgs
        ids += sid.tolist()
        caps.append(c)
    assert merge_shards(parts, tmp_path / "all.beton") == 144
    got = read_samples(tmp_path / "all.beton")
    allcaps = np.concatenate(caps)
    for i, s in enumerate(got):
        np.testing.assert_array_equal(s["image"], images[i])
        assert s["sample_id"] == ids[i]
        np.testing.assert_array_equal(s["caption"], allcaps[i])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["0.beton", "1.beton", "2.beton", "all.beton"]  # no temporary left


def test_merge_stage_verifies_shard_checksums(tmp_path: Path) -> None:
    """The build's merge task re-hashes every shard against its sidecar before merging (the
    driver no longer re-reads just-written shards): a changed shard is an error, not a merge."""
    from components.data.build import PreprocessError, merge_split
    from components.io.files import sha256_file

    rng = np.random.default_rng(2)
    parts, sums = [], []
    for k in range(2):
        imgs = [rng.integers(0, 256, (10, 10, 3), dtype=np.uint8) for _ in range(5)]
        write_shard(tmp_path / f"{k}.beton", imgs, np.zeros(5, int), np.arange(5) + 5 * k,
                    None, write_mode="raw", jpeg_quality=90, page_size=page_size_for(10, 0))
        parts.append(str(tmp_path / f"{k}.beton"))
        sums.append(sha256_file(parts[-1]))
    row = {"split": "train", "target": str(tmp_path / "m"), "parts": parts, "sha256": sums}
    assert merge_split(row) == sha256_file(tmp_path / "m")
    assert len(read_samples(tmp_path / "m")) == 10
    (tmp_path / "m").unlink()
    with open(parts[1], "r+b") as f:  # flip one byte of the second shard's last page
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(PreprocessError, match=r"1\.beton changed since it was written"):
        merge_split(row)
    assert not (tmp_path / "m").exists()


def test_merged_file_reads_through_ffcv_loader(tmp_path: Path) -> None:
    from ffcv.fields.decoders import IntDecoder, NDArrayDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline.compiler import Compiler

    rng = np.random.default_rng(1)
    imgs = [rng.integers(0, 256, (12, 12, 3), dtype=np.uint8) for _ in range(50)]
    for k in range(2):
        write_shard(tmp_path / f"{k}.beton", imgs[25 * k : 25 * k + 25], np.zeros(25, int),
                    np.arange(25) + 25 * k, np.ones((25, 3), np.float32) * k,
                    write_mode="raw", jpeg_quality=90, page_size=page_size_for(12, 12))
    merge_shards([tmp_path / "0.beton", tmp_path / "1.beton"], tmp_path / "m.beton")
    Compiler.set_enabled(False)
    try:
        loader = Loader(str(tmp_path / "m.beton"), batch_size=10, num_workers=1,
                        order=OrderOption.SEQUENTIAL, os_cache=False, drop_last=False, pipelines={
                            "image": [SimpleRGBImageDecoder()], "label": [IntDecoder()],
                            "sample_id": [IntDecoder()], "caption": [NDArrayDecoder()]})
        seen = []
        for im, _, sid, c in loader:
            for j in range(len(sid)):
                i = int(sid[j, 0])
                np.testing.assert_array_equal(im[j], imgs[i])
                assert c[j, 0] == (i >= 25)
                seen.append(i)
    finally:
        Compiler.set_enabled(True)
    assert seen == list(range(50))
