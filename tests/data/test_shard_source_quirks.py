"""What real shard data holds that the first shard tests did not: a label of the other kind
among integer class indices, multi-line captions, compressed tar shards, Hugging Face
Parquet exports with ClassLabel names, a DatasetDict's official validation split, a caption
setting that matches nothing, and a build whose every item is skipped (found by trying the
sources as a CC3M / ImageNet user would; each test feeds the mistake and checks the message and
that nothing is dropped silently)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.data.build import plan
from components.data.build.common import PreprocessError
from components.data.labels import label_names
from components.data.shard_files import shard_files
from components.data.shard_sources import (
    UNREADABLE_SHARD,
    ShardOptions,
    list_parquet,
    list_webdataset,
)
from components.data.sources import UNKNOWN_LABEL, decode_caption
from components.data.splits import assign_splits
from tests.data.test_shard_sources import _cfg, _png, _tar
from tests.support.hf_disk import IMAGE, STRING, class_label, image_cell, save_dict_to_disk

# ----------------------------------------------------------------------------------- labels


def test_a_name_among_integer_labels_is_one_skip_not_every_item() -> None:
    # ImageNet-style .cls indices with one corrupt value: the indices stay indices
    names, index = label_names([0, 1, "n/a", 2, 1], None)
    assert names == ["0", "1", "2"] and index == {0: 0, 1: 1, 2: 2}
    # names with one stray integer: names stay names, the integer is not one of them
    names, index = label_names(["cat", "dog", 3, "cat"], None)
    assert names == ["cat", "dog"] and index == {"cat": 0, "dog": 1}
    # with source.classes, an index and a name both resolve
    names, index = label_names([0, "dog", 1], ["cat", "dog"])
    assert names == ["cat", "dog"] and index == {0: 0, 1: 1, "cat": 0, "dog": 1}


def test_webdataset_cls_with_one_corrupt_value(tmp_path: Path) -> None:
    members: list[tuple[str, bytes]] = []
    for i in range(12):
        members += [(f"{i:09d}.png", _png(i)), (f"{i:09d}.cls", b"n/a" if i == 11
                                                 else str(i % 3).encode())]
    shard = _tar(tmp_path / "00000.tar", members)
    lst = list_webdataset(str(shard), options=ShardOptions(label_key="cls"))
    assert lst.classes == ["0", "1", "2"]
    assert [i.label for i in lst.items] == [i % 3 for i in range(11)]
    (skip,) = lst.skipped
    assert skip.reason == UNKNOWN_LABEL
    assert "'n/a'" in skip.detail and "class indices" in skip.detail
    assert "source.classes" in skip.detail


# --------------------------------------------------------------------------------- captions


def test_a_multi_line_caption_is_kept_whole() -> None:
    text = "A red car parked on a street.\nPhoto 3 by someone, licensed CC-BY."
    assert decode_caption(text) == (
        "A red car parked on a street. Photo 3 by someone, licensed CC-BY.", None)
    assert decode_caption(b"\r\n  one line\r\n\r\n  and another \n") == (
        "one line and another", None)
    assert decode_caption("a single line\n") == ("a single line", None)
    assert decode_caption(" \n\t\n") == (None, "caption-empty")
    # a sidecar file beside an image: its first line (Tux Paint's next lines: translations)
    assert decode_caption("A red apple.\nfr.utf8=Une pomme rouge.\n", first_line=True) == (
        "A red apple.", None)


def test_a_caption_setting_that_matches_nothing_is_reported(tmp_path: Path) -> None:
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"image": [_png(i) for i in range(6)],
                             "caption": [f"photo {i}" for i in range(6)],
                             "label": ["cat", "dog"] * 3}), src / "part-0.parquet")
    cfg = _cfg(tmp_path / "o", "parquet", src, source__caption_column="text",
               source__label_column="label", captions={"enabled": True},
               split={"val": 0, "test": 0})
    p = plan(cfg)
    assert len(p.rows) == 6  # captions.missing=from-label: each takes its class template
    (note,) = [n for n in p.caption_notes if n["reason"] == "no-caption-from-source"]
    assert "source.caption_column='text'" in note["detail"]
    assert "6 items" in note["detail"] and "class template" in note["detail"]
    assert "'caption'" in note["detail"]  # the columns the files do have
    # the same mistake in a webdataset's JSON field, with captions.missing=skip: the build
    # that has nothing left to write says why
    members = [m for i in range(3) for m in ((f"{i}.png", _png(i)),
               (f"{i}.json", json.dumps({"caption": f"photo {i}"}).encode()))]
    _tar(tmp_path / "wds" / "00000.tar", members)
    with pytest.raises(PreprocessError) as e:
        plan(_cfg(tmp_path / "o2", "webdataset", tmp_path / "wds",
                  source__caption_key="json:text",
                  captions={"enabled": True, "missing": "skip"}))
    assert "missing-caption: 3" in str(e.value)
    assert "none of the 3 items has a caption from source.caption_key='json:text'" in str(
        e.value)


# ----------------------------------------------------------------------------------- shards


def test_compressed_tar_shards_in_a_folder_are_named_skips(tmp_path: Path) -> None:
    src = tmp_path / "wds"
    plain = _tar(src / "00000.tar", [("a.png", _png(1)), ("b.png", _png(2))])
    for name in ("00001.tar.gz", "00002.tgz"):
        (src / name).write_bytes(gzip.compress(plain.read_bytes()))
    assert [Path(f).name for f in shard_files(str(src), ".tar")] == [
        "00000.tar", "00001.tar.gz", "00002.tgz"]
    lst = list_webdataset(str(src), options=ShardOptions())
    assert len(lst.items) == 2
    skips = sorted((Path(s.path).name, s.reason) for s in lst.skipped)
    assert skips == [("00001.tar.gz", UNREADABLE_SHARD), ("00002.tgz", UNREADABLE_SHARD)]
    assert all("compressed" in s.detail and "gunzip" in s.detail for s in lst.skipped)


def test_a_build_whose_every_item_is_skipped_says_why(tmp_path: Path) -> None:
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"jpg": [_png(1), _png(2)], "caption": ["a", "b"]}),
                   src / "00000.parquet")  # img2dataset names its image column "jpg"
    with pytest.raises(PreprocessError) as e:
        plan(_cfg(tmp_path / "o", "parquet", src))
    msg = str(e.value)
    assert "every item was skipped" in msg and "unreadable-shard: 1" in msg
    assert "has no column 'image'" in msg and "set source.image_column" in msg


# ------------------------------------------------------------------------ Hugging Face data


def test_hugging_face_parquet_classlabel_names_are_the_classes(tmp_path: Path) -> None:
    src = tmp_path / "pq"
    src.mkdir()
    features = {"image": IMAGE, "label": class_label(["airplane", "bird", "cat"])}
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("label", pa.int64())], metadata=meta)
    pq.write_table(pa.table({"image": [image_cell(_png(i), f"{i}.png") for i in range(5)],
                             "label": [2, 0, 1, -1, 7]}, schema=schema), src / "train.parquet")
    lst = list_parquet(str(src), options=ShardOptions(label_column="label"))
    assert lst.classes == ["airplane", "bird", "cat"]
    assert [i.label for i in lst.items] == [2, 0, 1]
    assert sorted((s.reason, s.detail) for s in lst.skipped) == [
        ("missing-label", "no label"),
        (UNKNOWN_LABEL, "ClassLabel index 7 is outside its 3 names")]
    narrowed = list_parquet(str(src), classes=["cat", "airplane"],
                            options=ShardOptions(label_column="label"))
    assert narrowed.classes == ["cat", "airplane"]
    assert [i.label for i in narrowed.items] == [0, 1]


def test_a_dataset_dicts_validation_split_is_the_val_split(tmp_path: Path) -> None:
    def part(k: int, n: int) -> dict[str, list[object]]:
        return {"image": [image_cell(_png(100 * k + i)) for i in range(n)],
                "caption": [f"{k} {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}

    src = save_dict_to_disk(
        tmp_path / "dd", {"train": part(0, 8), "validation": part(1, 4), "test": part(2, 4)},
        {"image": IMAGE, "caption": STRING, "label": class_label(["cat", "dog"])})
    p = plan(_cfg(tmp_path / "o", "huggingface", src, source__label_column="label",
                  split={"val": 0.25, "test": 0.25}))
    where: dict[str, set[str]] = {}
    for r in p.rows:
        where.setdefault(Path(r.path).parent.name, set()).add(r.split)
    # the published validation split is val; none is drawn from train beside it
    assert where == {"train": {"train"}, "validation": {"val"}, "test": {"test"}}


def test_an_official_val_split_is_kept_and_no_other_val_is_drawn() -> None:
    official = ["train"] * 6 + ["val"] * 2 + ["test"] * 2
    labels = [0, 1] * 5
    assert assign_splits(labels, official, 0.25, 0.25, seed=1) == official
    grouped = assign_splits(labels, official, 0.25, 0.25, seed=1, groups=list(range(10)))
    assert grouped == official
    # without an official val, val is still drawn from the official train
    no_val = ["train"] * 8 + ["test"] * 2
    drawn = assign_splits(labels, no_val, 0.25, 0.25, seed=1)
    assert drawn.count("val") == 2 and drawn[8:] == ["test", "test"]


def test_a_truncated_tar_shard_says_how_much_of_it_was_listed(tmp_path: Path) -> None:
    """Cut inside a member's data (tarfile: "unexpected end of data"), or on a 512-byte
    boundary — where an interrupted copy of 4 KiB blocks stops, and where tarfile sees a
    complete archive: the items before the cut are kept and the shard is one named skip."""
    whole = _tar(tmp_path / "whole.tar", [(f"{i}.png", _png(i, side=32)) for i in range(8)])
    data = whole.read_bytes()
    (tmp_path / "wds").mkdir()
    for at, why in ((len(data) // 3, "unexpected end of data"),
                    (20480, "ends at byte 20,480 without tar's end-of-archive blocks")):
        cut = tmp_path / "wds" / "00001.tar"
        cut.write_bytes(data[:at])
        lst = list_webdataset(str(cut), options=ShardOptions())
        (skip,) = lst.skipped
        assert skip.reason == UNREADABLE_SHARD and skip.path == str(cut)
        assert why in skip.detail, skip.detail
        assert f"its first {len(lst.items)} items were listed" in skip.detail
        assert "the rest of the shard is lost" in skip.detail and 0 < len(lst.items) < 8
    # a whole shard (its end-of-archive blocks there) is no skip
    assert not list_webdataset(str(whole), options=ShardOptions()).skipped


def test_a_label_setting_that_gives_no_item_a_label_is_named(tmp_path: Path) -> None:
    """A mistyped ``label_key``: every item a ``missing-label`` "no label" named by its byte
    offset; the skip now names the setting and the members the items have."""
    shard = _tar(tmp_path / "00000.tar", [m for i in range(3) for m in (
        (f"{i}.png", _png(i)), (f"{i}.cls", b"1"), (f"{i}.txt", b"a cat"))])
    lst = list_webdataset(str(shard), options=ShardOptions(label_key="clss"))
    assert len(lst.skipped) == 3 and {s.reason for s in lst.skipped} == {"missing-label"}
    assert lst.skipped[0].detail == (
        "no label: source.label_key='clss' gives none for any item (the first item's "
        "members: .cls, .png, .txt)")
    # one item without a label among labelled ones stays "no label"
    _tar(shard, [("0.png", _png(0)), ("0.cls", b"1"), ("1.png", _png(1))])
    (skip,) = list_webdataset(str(shard), options=ShardOptions(label_key="cls")).skipped
    assert skip.detail == "no label"
