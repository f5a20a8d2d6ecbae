"""Issue 42: WebDataset tar shards and Parquet files as ``simgraph preprocess`` sources
(``components/data/shard_sources.py``): every bad item a counted skip, the same images give
the same split files as a class folder (a Hugging Face ``save_to_disk`` folder too:
``components/data/hf_source.py``, its other tests in test_hf_source.py), brace / glob
expansion, the config checks, and a changed shard refused on rebuild like a changed image
file."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from components.config import ConfigError, PreprocessConfig, from_dict
from components.data.build import plan
from components.data.build.source_record import item_stat
from components.data.reader import MANIFEST
from components.data.shard_files import expand_braces, shard_files
from components.data.shard_sources import (
    MISSING_IMAGE,
    MISSING_LABEL,
    UNREADABLE_SHARD,
    ShardOptions,
    list_parquet,
    list_webdataset,
)
from components.data.shards import read_samples
from components.data.sources import (
    CAPTION_EMPTY,
    CAPTION_ENCODING,
    DUPLICATE,
    UNKNOWN_LABEL,
    SourceError,
    item_file,
    list_folder,
    read_item,
    shard_item,
)
from pipelines.preprocess import PreprocessError, run
from tests.data.test_build_transactions import _images
from tests.support.hf_disk import (
    IMAGE,
    STRING,
    class_label,
    image_cell,
    save_dict_to_disk,
    save_to_disk,
)

CAPTIONS = {"cat/0": "a cat", "cat/2": "a striped cat", "dog/1": "a dog", "dog/3": "a dog"}


def _png(seed: int, side: int = 12) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar shard holding ``members`` (name, bytes) in order (the same name twice allowed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _folder_source(root: Path) -> Path:
    """The folder tests' images (``cat|dog/<k>.png``) with a caption for some of them."""
    _images(root)
    for key, text in CAPTIONS.items():
        (root / f"{key}.txt").write_text(text + "\n")
    return root


def _folder_rows(root: Path) -> list[tuple[str, bytes, str | None]]:
    """(key, image bytes, caption) in the folder source's listing order."""
    return [(f"{Path(it.path).parent.name}/{Path(it.path).stem}", Path(it.path).read_bytes(),
             it.caption) for it in list_folder(str(root)).items]


def _as_webdataset(rows: list[tuple[str, bytes, str | None]], out: Path) -> Path:
    """The rows as two shards (one per class), labels in ``.cls``, captions in ``.txt``."""
    for k, cls in enumerate(("cat", "dog")):
        members: list[tuple[str, bytes]] = []
        for key, data, caption in rows:
            if key.startswith(cls):
                members.append((f"{key}.png", data))
                if caption is not None:
                    members.append((f"{key}.txt", caption.encode()))
                members.append((f"{key}.cls", cls.encode()))
        _tar(out / f"shard-{k:05d}.tar", members)
    return out


def _as_parquet(rows: list[tuple[str, bytes, str | None]], out: Path) -> Path:
    """The rows as one Parquet file in row groups of 3, the image a Hugging Face struct."""
    out.mkdir(parents=True)
    table = pa.table({
        "key": [k for k, _, _ in rows],
        "image": [{"bytes": d, "path": f"{k}.png"} for k, d, _ in rows],
        "caption": [c for _, _, c in rows],
        "label": [k.split("/")[0] for k, _, _ in rows],
    })
    pq.write_table(table, out / "part-0.parquet", row_group_size=3)
    return out


def _as_huggingface(rows: list[tuple[str, bytes, str | None]], out: Path) -> Path:
    """The rows as a DatasetDict: ``train`` (the first five, two data files of 2-row record
    batches) and ``validation`` (no ``test`` split: no official split), labels a ClassLabel."""
    def columns(part: list[tuple[str, bytes, str | None]]) -> dict[str, list[object]]:
        return {"image": [image_cell(d, f"{k}.png") for k, d, _ in part],
                "caption": [c for _, _, c in part],
                "label": [["cat", "dog"].index(k.split("/")[0]) for k, _, _ in part]}

    features = {"image": IMAGE, "caption": STRING, "label": class_label(["cat", "dog"])}
    return save_dict_to_disk(out, {"train": columns(rows[:5]), "validation": columns(rows[5:])},
                             features, num_shards=2, batch_rows=2)


# The over-rides each kind needs to list the folder's labels.
LABELLED = {"webdataset": {"source__label_key": "cls"},
            "parquet": {"source__label_column": "label"},
            "huggingface": {"source__label_column": "label"}}


def _cfg(out: Path, kind: str, path: Path | str, **over: object) -> PreprocessConfig:
    source: dict[str, object] = {"kind": kind, "path": str(path)}
    source.update({k[len("source__"):]: v for k, v in over.items() if k.startswith("source__")})
    data: dict[str, object] = {
        "output": str(out), "source": source,
        "image": {"max_side": 12, "min_side": 8, "write_mode": "raw"},
        "split": {"val": 0.25, "test": 0.25, "seed": 3},
        "captions": {"enabled": False}, "shard_size": 2,
        **{k: v for k, v in over.items() if not k.startswith("source__")},
    }
    return from_dict(PreprocessConfig, data)


# --------------------------------------------------------------------------- same split files


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("same")
    folder = _folder_source(root / "folder")
    rows = _folder_rows(folder)
    return {"folder": folder, "webdataset": _as_webdataset(rows, root / "wds"),
            "parquet": _as_parquet(rows, root / "pq"),
            "huggingface": _as_huggingface(rows, root / "hf"), "root": root}


def _contents(out: Path) -> dict[str, object]:
    """What the split files hold (decoded samples) and the manifest's counts."""
    m = json.loads((out / MANIFEST).read_text())
    samples = {s: [(x["sample_id"], x["label"], x["image"].tobytes())
                   for x in read_samples(out / v["file"])]
               for s, v in m["splits"].items() if v["samples"]}
    splits = {s: {k: v[k] for k in ("samples", "per_class", "sha256")} for s, v in
              m["splits"].items()}
    return {"classes": m["classes"], "splits": splits, "samples": samples,
            "skipped": m["skipped"]["by_reason"]}


@pytest.fixture(scope="module")
def folder_build(sources: dict[str, Path], ray_local: None) -> dict[str, object]:
    out = sources["root"] / "out-folder"
    run(_cfg(out, "folder", sources["folder"]), echo=False)
    return _contents(out)


def test_plans_list_the_same_items_labels_and_captions(sources: dict[str, Path]) -> None:
    """Without Ray: the four sources plan the same rows (label, split, shard, caption)."""
    def rows(kind: str, **over: object) -> list[tuple[object, ...]]:
        p = plan(_cfg(sources["root"] / "o", kind, sources[kind], **over))
        return [(r.sample_id, r.label, r.split, r.shard, p.texts[r.caption_id])
                for r in p.rows]

    caps = {"captions": {"enabled": True, "missing": "from-label"}}
    folder = rows("folder", **caps)
    assert len(folder) == 8 and {r[2] for r in folder} == {"train", "val", "test"}
    assert rows("webdataset", source__label_key="cls", **caps) == folder
    assert rows("parquet", source__label_column="label", **caps) == folder
    assert rows("huggingface", source__label_column="label", **caps) == folder


@pytest.mark.parametrize("kind", ["webdataset", "parquet", "huggingface"])
def test_split_files_equal_the_folder_builds(
    kind: str, sources: dict[str, Path], folder_build: dict[str, object], ray_local: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Same images, labels and order: byte-identical split files (sample ids, labels, pixels)
    and the same manifest counts; then one changed shard is refused on rebuild."""
    out = sources["root"] / f"out-{kind}"
    cfg = _cfg(out, kind, sources[kind], **LABELLED[kind])
    m = run(cfg, echo=False)
    assert _contents(out) == folder_build
    assert m["source"]["items"] == 8

    run(cfg)  # unchanged shards: complete
    assert "(its source is unchanged)" in capsys.readouterr().out
    shard = sorted(p for p in sources[kind].rglob("*") if p.suffix in (".tar", ".parquet",
                                                                        ".arrow"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data)  # rewritten in place (new mtime): a changed shard
    with pytest.raises(PreprocessError) as e:
        run(cfg, echo=False)
    msg = str(e.value)
    assert "\n" not in msg and f"{out} was built from another version of its source" in msg
    assert re.search(r"\d+ changed \(in " + re.escape(str(shard)) + r"\)", msg), msg


# --------------------------------------------------------------------------- bad items


def test_webdataset_bad_items_are_counted_skips(tmp_path: Path) -> None:
    good, truncated = _png(1), _png(2, side=64)[:300]
    src = tmp_path / "wds"
    _tar(src / "a-00000.tar", [
        ("k0.jpg", _png(3)), ("k0.txt", b"a cat"), ("k0.cls", b"cat"),
        ("k1.webp", truncated), ("k1.txt", b"cut short"), ("k1.cls", b"cat"),
        ("k2.txt", b"no image"), ("k2.cls", b"cat"),                  # missing-image
        ("k3.png", _png(4)), ("k3.txt", b"caf\xe9"), ("k3.cls", b"dog"),  # caption-encoding
        ("k4.png", _png(5)), ("k4.txt", b"  \n"), ("k4.cls", b"dog"),     # caption-empty
        ("k5.png", _png(6)), ("k5.cls", b"dog"),                          # missing-caption
        ("k6.png", _png(7)), ("k6.txt", b"unlabelled"),                   # missing-label
        ("k7.png", _png(8)), ("k7.txt", b"a bird"), ("k7.cls", b"bird"),  # unknown-label
        ("k0.png", _png(9)), ("k0.txt", b"again"), ("k0.cls", b"cat"),    # duplicate in shard
    ])
    _tar(src / "a-00001.tar", [("k3.jpg", good), ("k3.txt", b"dup"), ("k3.cls", b"dog")])
    (src / "a-00002.tar").write_bytes(b"this is not a tar shard " * 40)
    opts = ShardOptions(label_key="cls")
    lst = list_webdataset(str(src), classes=["cat", "dog"], options=opts)
    reasons = sorted((s.reason, Path(s.path.split("#")[0]).name) for s in lst.skipped)
    assert reasons == sorted([
        (MISSING_IMAGE, "a-00000.tar"), (MISSING_LABEL, "a-00000.tar"),
        (UNKNOWN_LABEL, "a-00000.tar"), (DUPLICATE, "a-00000.tar"),
        (DUPLICATE, "a-00001.tar"), (UNREADABLE_SHARD, "a-00002.tar")])
    dups = [s for s in lst.skipped if s.reason == DUPLICATE]
    assert all(s.of is not None and s.of.startswith(str(src / "a-00000.tar#tar:")) for s in dups)
    unreadable = next(s for s in lst.skipped if s.reason == UNREADABLE_SHARD)
    assert unreadable.path == str(src / "a-00002.tar") and "\n" not in unreadable.detail
    assert [(i.caption, i.caption_issue) for i in lst.items] == [
        ("a cat", None), ("cut short", None), (None, CAPTION_ENCODING), (None, CAPTION_EMPTY),
        (None, None)]
    assert read_item(lst.items[0].path) == _png(3)  # the first copy of k0

    # Through the build's plan: caption policy and the decode-time skip of the truncated image.
    p = plan(_cfg(tmp_path / "o", "webdataset", src, source__label_key="cls",
                  source__classes=["cat", "dog"],
                  captions={"enabled": True, "missing": "skip"}, split={"val": 0, "test": 0}))
    by_reason: dict[str, int] = {}
    for s in p.skipped:
        by_reason[s.reason] = by_reason.get(s.reason, 0) + 1
    assert by_reason == {MISSING_IMAGE: 1, MISSING_LABEL: 1, UNKNOWN_LABEL: 1, DUPLICATE: 2,
                         UNREADABLE_SHARD: 1, CAPTION_ENCODING: 1, CAPTION_EMPTY: 1,
                         "missing-caption": 1, "corrupt-image": 1}
    assert len(p.rows) == 1
    with pytest.raises(SourceError, match=re.escape(str(src / "a-00000.tar")) + "#k2: key"):
        list_webdataset(str(src), on_bad_input="error", options=opts)


def test_bad_input_error_names_the_first_problem_in_listing_order(tmp_path: Path) -> None:
    """Under ``bad_input: error`` the message names the problem ``skip`` would count first: a
    duplicate key (in its shard or across shards) or a label problem read before a missing
    image or an unreadable shard is named, not the later one; and the other way round."""
    def first(src: Path, **kw: object) -> str:
        with pytest.raises(SourceError) as e:
            list_webdataset(str(src), on_bad_input="error", **kw,  # type: ignore[arg-type]
                            options=ShardOptions(label_key="cls"))
        assert "\n" not in str(e.value)
        return str(e.value)

    img = (b"cat", _png(1))
    in_shard = _tar(tmp_path / "a" / "s-0.tar", [
        ("k0.png", img[1]), ("k0.cls", img[0]), ("k1.png", img[1]), ("k1.cls", img[0]),
        ("k0.jpg", img[1]), ("k0.cls", img[0]),        # duplicate key
        ("k2.txt", b"no image"), ("k2.cls", img[0])])  # missing image, later
    assert first(in_shard).startswith(f"{in_shard}#tar:") and "key 'k0' listed more" in first(
        in_shard)
    across = tmp_path / "b"
    _tar(across / "s-0.tar", [("k0.png", img[1]), ("k0.cls", img[0])])
    _tar(across / "s-1.tar", [("k1.png", img[1]), ("k1.cls", img[0]),
                              ("k0.png", img[1]), ("k0.cls", img[0])])  # duplicate across
    (across / "s-2.tar").write_bytes(b"not a tar shard " * 40)          # unreadable, later
    assert first(across).startswith(f"{across / 's-1.tar'}#tar:") and "'k0'" in first(across)
    labels = _tar(tmp_path / "c" / "s-0.tar", [
        ("k0.png", img[1]), ("k0.cls", b"cat"), ("k1.png", img[1]), ("k1.cls", b"bird"),
        ("k2.png", img[1]), ("k2.cls", b"cat"), ("k1.png", img[1]), ("k1.cls", b"cat"),
        ("k3.txt", b"no image")])
    assert "label 'bird' is not one of the 2 classes" in first(labels, classes=["cat", "dog"])
    no_label = _tar(tmp_path / "d" / "s-0.tar", [("k0.png", img[1]), ("k1.txt", b"x")])
    assert first(no_label) == f"{no_label}#tar:512:{len(img[1])}: no label (set bad_input=" \
        "skip to skip and count such items)"
    # the later problem is named when it comes first
    later = _tar(tmp_path / "e" / "s-0.tar", [
        ("k0.png", img[1]), ("k0.cls", img[0]), ("k2.txt", b"no image"),
        ("k0.jpg", img[1]), ("k0.cls", b"bird")])
    assert first(later).startswith(f"{later}#k2: key 'k2' has no image member")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "s-0.tar").write_bytes(b"not a tar shard " * 40)
    _tar(tmp_path / "f" / "s-1.tar", [("k0.png", img[1]), ("k0.jpg", img[1])])
    assert "not a readable uncompressed tar shard" in first(tmp_path / "f")

    # Parquet: a duplicate key before an unreadable file; Hugging Face: a missing label
    # (ClassLabel -1) before a missing image
    pq_src = tmp_path / "pq"
    pq_src.mkdir()
    pq.write_table(pa.table({"key": ["a", "b", "a"], "image": [_png(1)] * 3,
                             "label": ["cat"] * 3}), pq_src / "p-0.parquet")
    (pq_src / "p-1.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceError, match=re.escape(f"{pq_src / 'p-0.parquet'}#parquet:0:2:"
                                                    "image: key 'a' listed more than once")):
        list_parquet(str(pq_src), on_bad_input="error",
                     options=ShardOptions(label_column="label"))
    from components.data.hf_source import list_huggingface

    hf = tmp_path / "hf"
    (file,) = save_to_disk(hf, {"image": [image_cell(_png(1)), image_cell(_png(2)), None],
                                "label": [0, -1, 1]},
                           {"image": IMAGE, "label": class_label(["cat", "dog"])})
    with pytest.raises(SourceError, match=re.escape(f"{file}#arrow:0:1:image: no label")):
        list_huggingface(str(hf), on_bad_input="error",
                         options=ShardOptions(label_column="label"))


def test_webdataset_json_keys_and_integer_labels(tmp_path: Path) -> None:
    _tar(tmp_path / "s.tar", [
        ("a.jpg", _png(1)), ("a.json", json.dumps({"caption": "one", "y": 2}).encode()),
        ("b.jpg", _png(2)), ("b.json", json.dumps({"caption": "two", "y": 0}).encode()),
        ("c.jpg", _png(3)), ("c.json", b"{not json"),
    ])
    lst = list_webdataset(str(tmp_path / "s.tar"), options=ShardOptions(
        caption_key="json:caption", label_key="json:y"))
    assert lst.classes == ["0", "1", "2"]  # integer labels are indices, as in a manifest
    assert [(i.label, i.caption) for i in lst.items] == [(2, "one"), (0, "two")]
    assert [s.reason for s in lst.skipped] == [MISSING_LABEL]
    # Unlabelled by default; the default caption member (.txt) is absent: no caption.
    plain = list_webdataset(str(tmp_path / "s.tar"), options=ShardOptions())
    assert plain.classes == [] and [i.label for i in plain.items] == [-1, -1, -1]
    assert all(i.caption is None and i.caption_issue is None for i in plain.items)


def test_parquet_bad_items_are_counted_skips(tmp_path: Path) -> None:
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({
        "key": ["a", "b", "c", "d", "e", "a", "f"],
        "image": [_png(1), _png(2), None, _png(3, 64)[:300], _png(4), _png(5), _png(6)],
        "caption": [b"one", b"caf\xe9", b"three", b"four", None, b"six", b"seven"],
        "label": ["cat", "dog", "cat", "cat", None, "dog", "bird"],
    }), src / "p-0.parquet", row_group_size=4)
    (src / "p-1.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"img": [_png(7)]}), src / "p-2.parquet")
    opts = ShardOptions(label_column="label")
    lst = list_parquet(str(src), classes=["cat", "dog"], options=opts)
    reasons = sorted((s.reason, Path(s.path.split("#")[0]).name) for s in lst.skipped)
    assert reasons == [(DUPLICATE, "p-0.parquet"), (MISSING_LABEL, "p-0.parquet"),
                       (UNKNOWN_LABEL, "p-0.parquet"), (UNREADABLE_SHARD, "p-1.parquet"),
                       (UNREADABLE_SHARD, "p-2.parquet")]
    assert "has no column 'image'" in next(s.detail for s in lst.skipped
                                          if s.path.endswith("p-2.parquet"))
    assert [(i.label, i.caption, i.caption_issue) for i in lst.items] == [
        (0, "one", None), (1, None, CAPTION_ENCODING), (0, "three", None), (0, "four", None)]
    assert [shard_item(i.path)[2:4] for i in lst.items] == [  # type: ignore[index]
        (0, 0), (0, 1), (0, 2), (0, 3)]
    assert read_item(lst.items[1].path) == _png(2)
    p = plan(_cfg(tmp_path / "o", "parquet", src, source__label_column="label",
                  source__classes=["cat", "dog"], split={"val": 0, "test": 0}))
    assert sorted(s.reason for s in p.skipped if s.path.startswith(str(src / "p-0"))) == sorted(
        [DUPLICATE, MISSING_LABEL, UNKNOWN_LABEL, MISSING_IMAGE, "corrupt-image"])
    assert len(p.rows) == 2
    with pytest.raises(SourceError, match=re.escape(str(src / "p-1.parquet"))):
        list_parquet(str(src / "p-1.parquet"), on_bad_input="error", options=opts)


def test_item_paths_name_their_shard(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "s.tar", [("x.png", _png(1))])
    (item,) = list_webdataset(str(shard), options=ShardOptions()).items
    assert item_file(item.path) == str(shard)
    assert item_stat(item.path) is not None
    assert item_file("s3://b/s.tar?endpoint_override=h:1#tar:512:10") is None
    assert shard_item("/x/a#tar:1:2.png") is None and item_file("/x/a#b.png") == "/x/a#b.png"


# --------------------------------------------------------------------------- which shards


def test_brace_and_glob_expansion(tmp_path: Path) -> None:
    assert expand_braces("cc3m-{00000..00002}.tar") == [
        "cc3m-00000.tar", "cc3m-00001.tar", "cc3m-00002.tar"]
    assert expand_braces("s{8..10}-{a,b}") == ["s8-a", "s8-b", "s9-a", "s9-b", "s10-a", "s10-b"]
    assert expand_braces("{098..100}") == ["098", "099", "100"]
    for bad, why in (("a-{0..3.tar", "unbalanced"), ("a-{3..1}.tar", "runs backwards"),
                     ("a-{x}.tar", "neither a range"), ("a-}.tar", "unbalanced")):
        with pytest.raises(SourceError, match=why):
            expand_braces(bad)
    for k in range(3):
        _tar(tmp_path / f"cc-{k:05d}.tar", [("x.png", _png(k))])
    (tmp_path / "notes.txt").write_text("not a shard")
    names = [str(tmp_path / f"cc-{k:05d}.tar") for k in range(3)]
    assert shard_files(str(tmp_path), ".tar") == names
    assert shard_files(str(tmp_path / "*.tar"), ".tar") == names
    assert shard_files(str(tmp_path / "cc-{00001..00002}.tar"), ".tar") == names[1:]
    (tmp_path / "empty").mkdir()
    for nothing in (tmp_path / "*.none", tmp_path / "empty"):
        with pytest.raises(SourceError, match="matches no .tar file"):
            shard_files(str(nothing), ".tar")
    for missing in (tmp_path / "none.tar", tmp_path / "no-such-folder"):
        with pytest.raises(SourceError, match=re.escape(f"{str(missing)!r} does not exist")):
            shard_files(str(missing), ".tar")
    # A brace naming a missing shard: that shard is counted, the others listed.
    lst = list_webdataset(str(tmp_path / "cc-{00002..00003}.tar"), options=ShardOptions())
    assert len(lst.items) == 1 and [s.reason for s in lst.skipped] == [UNREADABLE_SHARD]


def test_webdataset_over_s3(tmp_path: Path, s3_uri: str) -> None:
    import pyarrow.fs as pafs

    shard = _tar(tmp_path / "s.tar", [("a.png", _png(1)), ("a.txt", b"one"),
                                      ("b.png", _png(2))])
    base, _, query = s3_uri.partition("?")
    fs, inner = pafs.FileSystem.from_uri(f"{base}/shards/s-00000.tar?{query}")
    with fs.open_output_stream(inner) as f:
        f.write(shard.read_bytes())
    for path in (f"{base}/shards?{query}", f"{base}/shards/*.tar?{query}",
                 f"{base}/shards/s-{{00000..00000}}.tar?{query}"):
        lst = list_webdataset(path, options=ShardOptions())
        assert [i.caption for i in lst.items] == ["one", None], path
        assert [read_item(i.path) for i in lst.items] == [_png(1), _png(2)]
        assert all(item_file(i.path) is None for i in lst.items)


# --------------------------------------------------------------------------- config


def test_shard_options_are_validated() -> None:
    def cfg(**source: object) -> PreprocessConfig:
        return from_dict(PreprocessConfig, {"output": "o", "source": source})

    ok = cfg(kind="webdataset", path="/d/{0..3}.tar", caption_key="json:caption",
             label_key="cls", image_extensions=["jpg"])
    assert ok.source.label_key == "cls"
    assert cfg(kind="parquet", path="/d", caption_column=None).source.caption_column is None
    for source, msg in (
        ({"kind": "webdataset"}, "source.path is required"),
        ({"kind": "webdataset", "path": "/d", "caption_key": "json:"}, "json:<field>"),
        ({"kind": "webdataset", "path": "/d", "label_key": ".cls"}, "without the dot"),
        ({"kind": "webdataset", "path": "/d", "image_extensions": []}, "image_extensions is "
         "empty"),
        ({"kind": "webdataset", "path": "/d", "image_extensions": [".jpg"]}, "without the dot"),
        ({"kind": "webdataset", "path": "/d", "image_column": "img"},
         "applies to source.kind=parquet or huggingface only"),
        ({"kind": "folder", "path": "/d", "label_key": "cls"},
         "applies to source.kind=webdataset only"),
        ({"kind": "parquet", "path": "/d", "image_column": ""}, "image_column is empty"),
        ({"kind": "parquet", "path": "/d", "label_column": ""}, "or null"),
        ({"kind": "parquet", "path": "/d", "label_depth": 2}, "label_depth=2 applies"),
    ):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            cfg(**source)
