"""Issue 42: a Hugging Face ``save_to_disk`` folder as a ``simgraph preprocess`` source
(``source.kind: huggingface``, ``components/data/hf_source.py``), without Ray: every bad item
and unreadable data file a counted skip, a DatasetDict's splits (which are read, which become
the official split), ClassLabel names as the class list, and the config checks. The build
whose split files equal a class folder's is in test_shard_sources.py (its module's folder
build is reused)."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from components.config import ConfigError, PreprocessConfig, from_dict
from components.data.build import plan
from components.data.build.source_record import item_stat
from components.data.hf_source import hf_splits, list_huggingface
from components.data.shard_paths import CodedColumn, ShardPaths
from components.data.shard_sources import MISSING_IMAGE, MISSING_LABEL, UNREADABLE_SHARD
from components.data.shard_sources import ShardOptions as Options
from components.data.sources import (
    CAPTION_EMPTY,
    CAPTION_ENCODING,
    UNKNOWN_LABEL,
    ItemTable,
    Skip,
    SourceError,
    item_file,
    list_source_table,
    read_item,
    shard_item,
)
from tests.data.test_shard_sources import _cfg, _png
from tests.support.hf_disk import (
    BINARY,
    IMAGE,
    STRING,
    class_label,
    image_cell,
    save_dict_to_disk,
    save_to_disk,
)

FEATURES = {"image": IMAGE, "caption": STRING, "label": class_label(["cat", "dog"])}


def _reasons(skipped: list[Skip]) -> list[tuple[str, str]]:
    return sorted((s.reason, Path(s.path.split("#")[0]).name) for s in skipped)


def test_bad_items_and_files_are_counted_skips(tmp_path: Path) -> None:
    src = tmp_path / "ds"
    files = save_to_disk(src, {
        "image": [image_cell(_png(1), "a.png"), image_cell(_png(2)), None,
                  image_cell(None, "/gone/d.png"), image_cell(_png(4)), image_cell(_png(5)),
                  image_cell(_png(6, 64)[:300]), image_cell(_png(7)), image_cell(b"")],
        "caption": ["one", "  ", "three", "four", "five", "six", "seven", None, "nine"],
        "label": [0, 1, 0, 0, -1, 7, 0, None, 1],
    }, FEATURES, num_shards=2, batch_rows=3)
    # Two more data files in state.json: one is not an Arrow stream, one is missing.
    (src / "data-00002-of-00004.arrow").write_bytes(b"not an arrow stream " * 20)
    state = json.loads((src / "state.json").read_text())
    state["_data_files"] += [{"filename": "data-00002-of-00004.arrow"},
                             {"filename": "gone.arrow"}]
    (src / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    opts = Options(label_column="label")
    lst = list_huggingface(str(src), options=opts)
    assert lst.classes == ["cat", "dog"]
    first, second = files[0].name, files[1].name
    assert _reasons(lst.skipped) == sorted([
        (MISSING_IMAGE, first), (MISSING_IMAGE, first), (MISSING_IMAGE, second),
        (MISSING_LABEL, first), (MISSING_LABEL, second), (UNKNOWN_LABEL, second),
        (UNREADABLE_SHARD, "data-00002-of-00004.arrow"), (UNREADABLE_SHARD, "gone.arrow")])
    details = {s.path: s.detail for s in lst.skipped}
    assert "it names only the file '/gone/d.png'" in details[f"{files[0]}#arrow:1:0:image"]
    assert "ClassLabel index 7 is outside its 2 names" in details[f"{files[1]}#arrow:0:0:image"]
    assert all("\n" not in d for d in details.values())
    assert [(Path(i.path).name, i.label, i.caption, i.caption_issue) for i in lst.items] == [
        (f"{first}#arrow:0:0:image", 0, "one", None),
        (f"{first}#arrow:0:1:image", 1, None, CAPTION_EMPTY),
        (f"{second}#arrow:0:1:image", 0, "seven", None)]
    assert all(i.official_split is None for i in lst.items)
    assert read_item(lst.items[0].path) == _png(1) and read_item(lst.items[1].path) == _png(2)
    assert shard_item(lst.items[1].path) == (str(files[0]), "arrow", 0, 1, "image")
    assert item_file(lst.items[2].path) == str(files[1]) and item_stat(lst.items[2].path)

    # Through the build's plan: the truncated image is skipped when decoded.
    p = plan(_cfg(tmp_path / "o", "huggingface", src, source__label_column="label",
                  split={"val": 0, "test": 0}))
    assert sorted(s.reason for s in p.skipped if s.reason not in (
        MISSING_IMAGE, MISSING_LABEL, UNKNOWN_LABEL, UNREADABLE_SHARD)) == ["corrupt-image"]
    assert len(p.rows) == 2
    with pytest.raises(SourceError, match=re.escape(f"{files[0]}#arrow:0:2:image: row 2 of "
                                                    "record batch 0 has no image bytes")):
        list_huggingface(str(src), on_bad_input="error", options=opts)


def test_columns_captions_and_labels(tmp_path: Path) -> None:
    # Unlabelled by default; binary and list captions; no dataset_info.json (the features
    # come from the files' schema metadata).
    src = tmp_path / "a"
    save_to_disk(src, {"img": [image_cell(_png(1)), image_cell(_png(2))],
                       "text": [[b"caf\xe9"], [b"first", b"second"]],
                       "y": [1, 0]},
                 {"img": IMAGE, "text": {"feature": BINARY, "_type": "List"},
                  "y": class_label(["a", "b"])}, info=False)
    plain = list_huggingface(str(src), options=Options(image_column="img"))
    assert plain.classes == [] and [i.label for i in plain.items] == [-1, -1]
    assert all(i.caption is None and i.caption_issue is None for i in plain.items)
    lst = list_huggingface(str(src), options=Options(image_column="img", caption_column="text",
                                                     label_column="y"))
    assert lst.classes == ["a", "b"]
    assert [(i.label, i.caption, i.caption_issue) for i in lst.items] == [
        (1, None, CAPTION_ENCODING), (0, "first", None)]
    # source.classes re-orders and narrows ClassLabel names; a string column's names sort.
    narrowed = list_huggingface(str(src), classes=["b"], options=Options(
        image_column="img", label_column="y"))
    assert [i.label for i in narrowed.items] == [0] and narrowed.skipped[0].reason == (
        UNKNOWN_LABEL)
    save_to_disk(tmp_path / "s", {"image": [image_cell(_png(1)), image_cell(_png(2))],
                                  "label": ["zebra", "ant"]},
                 {"image": IMAGE, "label": STRING})
    named = list_huggingface(str(tmp_path / "s"), options=Options(label_column="label"))
    assert named.classes == ["ant", "zebra"] and [i.label for i in named.items] == [1, 0]
    # A missing image or label column: the file is unreadable; a caption column that is not
    # text is a mistake in the config.
    for opts, why in ((Options(), "has no column 'image'"),
                      (Options(image_column="img", label_column="lab"), "has no column 'lab'")):
        with pytest.raises(SourceError, match=re.escape(why)):
            list_huggingface(str(src), options=opts, on_bad_input="error")
        bad = list_huggingface(str(src), options=opts)
        assert [s.reason for s in bad.skipped] == [UNREADABLE_SHARD]
    with pytest.raises(SourceError, match=r"source.caption_column='y' holds int64"):
        list_huggingface(str(src), options=Options(image_column="img", caption_column="y"))


def _dict(root: Path, names: dict[str, list[str]] | None = None) -> Path:
    """A DatasetDict of train (4 rows), validation (2) and test (2)."""
    def part(seed: int, n: int) -> dict[str, list[object]]:
        return {"image": [image_cell(_png(seed + k)) for k in range(n)],
                "caption": [f"item {seed + k}" for k in range(n)],
                "label": [k % 2 for k in range(n)]}

    splits = {"train": part(10, 4), "validation": part(20, 2), "test": part(30, 2)}
    save_dict_to_disk(root, splits, FEATURES)
    for split, other in (names or {}).items():  # another ClassLabel in one split
        save_to_disk(root / split, splits[split], {**FEATURES, "label": class_label(other)},
                     split=split)
    return root


def test_dataset_dict_splits(tmp_path: Path) -> None:
    src = _dict(tmp_path / "dd")
    assert [s.name for s in hf_splits(str(src))] == ["train", "validation", "test"]
    lst = list_huggingface(str(src), options=Options(label_column="label"))
    official = [(Path(i.path).parent.name, i.official_split) for i in lst.items]
    # validation is val beside an official train and test (tests/data/test_shard_source_quirks)
    assert official == [("train", "train")] * 4 + [("validation", "val")] * 2 + [
        ("test", "test")] * 2
    # Without both train and test, no split is official: all are split by the fractions.
    for split in (("train", "validation"), ("test",)):
        part = list_huggingface(str(src), options=Options(split=split))
        assert {Path(i.path).parent.name for i in part.items} == set(split)
        assert all(i.official_split is None for i in part.items)
    # The build keeps the official test split and draws val from train.
    p = plan(_cfg(tmp_path / "o", "huggingface", src, source__label_column="label",
                  source__split=["test", "train"], split={"val": 0.5, "test": 0.25}))
    where = {Path(r.path).parent.name: set() for r in p.rows}
    for r in p.rows:
        where[Path(r.path).parent.name].add(r.split)
    assert where == {"test": {"test"}, "train": {"train", "val"}}
    one = plan(_cfg(tmp_path / "o1", "huggingface", src, source__split="validation",
                    split={"val": 0, "test": 0}))
    assert len(one.rows) == 2

    for split, why in ((["train", "dev"], "source.split='dev' is not a split of"),):
        with pytest.raises(SourceError, match=re.escape(why)):
            list_huggingface(str(src), options=Options(split=tuple(split)))
    with pytest.raises(SourceError, match="is a single Dataset"):
        list_huggingface(str(src / "train"), options=Options(split=("train",)))
    other = _dict(tmp_path / "other", {"test": ["cat", "dog", "bird"]})
    with pytest.raises(SourceError, match=r"ClassLabel with other names in .*test"):
        list_huggingface(str(other), options=Options(label_column="label"))
    for path, why in ((tmp_path / "none", "is not a folder written by"),
                      (tmp_path, "has no state.json"),
                      ("s3://bucket/dd", "read from a local folder")):
        with pytest.raises(SourceError, match=re.escape(why)):
            list_huggingface(str(path), options=Options())


def test_a_dataset_dict_is_listed_into_columns(tmp_path: Path) -> None:
    """The build's listing of a huggingface source holds columns (ShardPaths, the official
    split one int8 an item), not an Item and a path str per item: the same items, splits and
    skips as the Item listing, tens of bytes an item."""
    src = _dict(tmp_path / "dd")
    opts = Options(label_column="label")
    table = list_source_table("huggingface", str(src), shard_options=opts)
    assert isinstance(table.paths, ShardPaths) and isinstance(table.official, CodedColumn)
    lst = list_huggingface(str(src), options=opts)
    assert table.items() == lst.items and table.classes == lst.classes == ["cat", "dog"]
    assert list(table.official) == ItemTable.of(lst).official == [
        "train"] * 4 + ["val"] * 2 + ["test"] * 2
    part = table.take(np.array([7, 0, 5]))
    assert isinstance(part.official, CodedColumn)
    assert list(part.official) == ["test", "train", "val"] and part.official[1] == "train"
    # without both train and test: no official column, as the Item listing
    train = list_source_table("huggingface", str(src), shard_options=Options(split=("train",)))
    assert train.official is None and len(train) == 4

    n = 4000
    save_to_disk(tmp_path / "big", {
        "image": [image_cell(b"x") for _ in range(n)],
        "caption": [f"caption {i % 50}" for i in range(n)],
        "label": [i % 2 for i in range(n)]}, FEATURES, num_shards=2, batch_rows=100)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    big = list_source_table("huggingface", str(tmp_path / "big"), shard_options=opts)
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert len(big) == n and len(big.captions) == 50
    assert held < 48, held  # the Item listing held a few hundred


def test_huggingface_options_are_validated() -> None:
    def cfg(**source: object) -> PreprocessConfig:
        return from_dict(PreprocessConfig, {"output": "o", "source": source})

    ok = cfg(kind="huggingface", path="/d", split=["train", "test"], label_column="label",
             image_column="img", caption_column=None)
    assert ok.source.split == ["train", "test"] and ok.source.image_column == "img"
    assert cfg(kind="huggingface", path="/d", split="train").source.split == "train"
    for source, msg in (
        ({"kind": "huggingface"}, "source.path is required"),
        ({"kind": "huggingface", "path": "/d", "split": []}, "source.split is an empty list"),
        ({"kind": "huggingface", "path": "/d", "split": ["a", "a"]}, "names a split twice"),
        ({"kind": "huggingface", "path": "/d", "split": ["../x"]}, "entry '../x' is not "
         "allowed"),
        ({"kind": "huggingface", "path": "/d", "split": 3}, "source.split=3 matches none"),
        ({"kind": "huggingface", "path": "/d", "label_key": "cls"},
         "source.label_key='cls' applies to source.kind=webdataset only"),
        ({"kind": "parquet", "path": "/d", "split": "train"},
         "source.split='train' applies to source.kind=huggingface only"),
        ({"kind": "huggingface", "path": "/d", "label_depth": 2}, "label_depth=2 applies"),
    ):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            cfg(**source)


def test_params_leave_out_other_kinds_settings(tmp_path: Path) -> None:
    """A folder build's parameters hold no huggingface setting (datasets built before it
    existed keep their identity); a huggingface build's hold its split and columns."""
    from components.data.build.planning import _params

    folder = _params(_cfg(tmp_path, "folder", tmp_path))["source"]
    assert "split" not in folder and "image_column" not in folder
    hf = _params(_cfg(tmp_path, "huggingface", tmp_path, source__split=["train"]))["source"]
    assert hf["split"] == ["train"] and hf["image_column"] == "image"
    assert "label_key" not in hf
