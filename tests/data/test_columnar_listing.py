"""Issue 42, item 2: a shard source is listed into columns (``ShardPaths``: a shard index and
two int64 per item; label and caption ids into tables of the distinct values), not an ``Item``
and a path str per item, and the build works from them (source record, content key, plan)
without converting back. Same items, skips (in the same order, with the same details) and
digests as the per-item listing."""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from components.data.build.listing import list_items
from components.data.build.planning import plan
from components.data.build.source_record import SourceRecord
from components.data.caption_texts import CaptionTexts
from components.data.shard_paths import ShardPaths, take_paths
from components.data.shard_sources import (
    MISSING_IMAGE,
    MISSING_LABEL,
    UNREADABLE_SHARD,
    ShardOptions,
    list_webdataset,
    webdataset_lister,
)
from components.data.sources import DUPLICATE, UNKNOWN_LABEL, ItemTable
from tests.data.test_shard_sources import _cfg, _png, _tar


def _bad_shards(src: Path) -> Path:
    _tar(src / "a-00000.tar", [
        ("k0.jpg", _png(3)), ("k0.txt", b"a cat"), ("k0.cls", b"cat"),
        ("k2.txt", b"no image"), ("k2.cls", b"cat"),                      # missing-image
        ("k6.png", _png(7)), ("k6.txt", b"unlabelled"),                   # missing-label
        ("k7.png", _png(8)), ("k7.txt", b"a bird"), ("k7.cls", b"bird"),  # unknown-label
        ("k0.png", _png(9)), ("k0.txt", b"again"), ("k0.cls", b"cat"),    # duplicate in shard
        ("k8.png", _png(1)), ("k8.txt", b"a cat"), ("k8.cls", b"dog"),
    ])
    _tar(src / "a-00001.tar", [("k8.jpg", _png(2)), ("k8.txt", b"dup"), ("k8.cls", b"dog"),
                               ("k9.jpg", _png(4)), ("k9.txt", b"a dog"), ("k9.cls", b"dog")])
    (src / "a-00002.tar").write_bytes(b"this is not a tar shard " * 40)
    return src


def test_skips_come_in_reading_order_with_the_per_item_details(tmp_path: Path) -> None:
    src = _bad_shards(tmp_path / "wds")
    a0, a1 = src / "a-00000.tar", src / "a-00001.tar"
    table = webdataset_lister(str(src), options=ShardOptions(label_key="cls")).table(
        ["cat", "dog"])
    assert isinstance(table.paths, ShardPaths)
    got = [(s.reason, s.path.split("#")[0], s.detail if s.reason == DUPLICATE else "",
            (s.of or "").split("#")[0]) for s in table.skipped]
    assert got == [
        (MISSING_IMAGE, str(a0), "", ""),
        (DUPLICATE, str(a0), f"key 'k0' listed more than once ({a0}); first kept", str(a0)),
        (DUPLICATE, str(a1), f"key 'k8' listed more than once ({a1}); first kept", str(a0)),
        (UNREADABLE_SHARD, str(src / "a-00002.tar"), "", ""),
        (MISSING_LABEL, str(a0), "", ""),
        (UNKNOWN_LABEL, str(a0), "", ""),
    ]
    # the same items as Item objects (the public listing), the columns' paths rebuilt exactly
    lst = list_webdataset(str(src), classes=["cat", "dog"], options=ShardOptions(label_key="cls"))
    assert table.items() == lst.items and table.skipped == lst.skipped
    assert [(it.label, it.caption) for it in lst.items] == [(0, "a cat"), (1, "a cat"),
                                                            (1, "a dog")]
    assert list(table.paths) == [it.path for it in lst.items] == [
        table.paths[i] for i in range(3)]
    # each distinct caption once (skipped items' too); the items point into the table
    assert len(table.captions) == len(set(table.captions))
    assert [table.captions[c] for c in table.caption_ids] == ["a cat", "a cat", "a dog"]
    assert take_paths(table.paths, np.array([2, 0]))[0] == lst.items[2].path
    assert ItemTable.of(lst).items() == lst.items


def test_the_build_works_from_columns_with_the_per_item_records(tmp_path: Path) -> None:
    src = _bad_shards(tmp_path / "wds")
    cfg = _cfg(tmp_path / "o", "webdataset", src, source__label_key="cls",
               source__classes=["cat", "dog"], split={"val": 0, "test": 0})
    listed = list_items(cfg)
    assert isinstance(listed.paths, ShardPaths)
    record = SourceRecord.of(listed)
    # the record as a mapping (what a per-item record held) digests the same
    same = SourceRecord(record.classes, dict(record.items), record.skipped)
    assert same.digest() == record.digest() and len(record.items) == 3
    assert record.stat_at(2) == record.stat(listed.paths[2]) is not None
    p = plan(cfg, listed)
    assert [r.path for r in p.rows] == [listed.paths[int(i)] for i in p.sample_ids]


def test_a_shard_listing_holds_tens_of_bytes_per_item(tmp_path: Path) -> None:
    n = 4000
    for k in range(2):
        _tar(tmp_path / f"shard-{k:05d}.tar",
             [m for i in range(n // 2) for m in (
                 (f"{k}{i:07d}.png", b"x"), (f"{k}{i:07d}.txt", f"caption {i % 50}".encode()),
                 (f"{k}{i:07d}.cls", str(i % 10).encode()))])
    opts = ShardOptions(label_key="cls")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = webdataset_lister(str(tmp_path), options=opts).table(None)
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert len(table) == n and len(table.captions) == 50
    # ShardPaths 20 B + label 4 + caption id 4 + issue 1 a row; the per-item listing held ~365
    assert held < 48, held


def test_grouped_splits_on_arrays_equal_the_per_group_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the plan's split assignment without official splits runs on arrays; the same result
    from components.data import integrity, splits

    monkeypatch.setattr(splits, "_CHECK", 7)  # roots checked over several chunks
    for trial in range(60):
        rng = np.random.default_rng(trial)
        n = int(rng.integers(0, 200))
        labels = rng.integers(0, 4, n).tolist()
        groups = np.arange(n)
        for _ in range(int(rng.integers(0, n + 1)) if n else 0):
            a, b = rng.integers(0, n, 2)
            groups[groups == groups[b]] = groups[a]  # joined groups, any member the root
        val, test = [(0.1, 0.2), (0.0, 0.5), (0.25, 0.25), (0.0, 0.0)][trial % 4]
        want = splits._assign_grouped_lists(labels, [None] * n, val, test, trial,
                                            groups.tolist())
        assert splits.assign_splits(labels, [None] * n, val, test, trial, groups) == want
        # as codes (the plan's form: no official splits given as None)
        codes = splits.assign_split_codes(labels, None, val, test, trial, groups)
        assert codes.dtype == np.int8 and [splits.SPLITS[c] for c in codes.tolist()] == want
        # the same groups named by their first member (the plan's roots): units without a sort
        roots = integrity.group_roots(n, np.stack([np.arange(n), groups], axis=1))
        units = splits._root_units(roots)
        assert units is not None
        _, heads, inverse = np.unique(roots, return_index=True, return_inverse=True)
        assert units[0].tolist() == heads.tolist() and units[1].tolist() == inverse.tolist()
        if n and bool(np.any(groups > np.arange(n))):
            assert splits._root_units(groups) is None  # not roots: np.unique's way
        by_roots = splits.assign_split_codes(labels, None, val, test, trial, roots)
        assert [splits.SPLITS[c] for c in by_roots.tolist()] == splits._assign_grouped_lists(
            labels, [None] * n, val, test, trial, roots.tolist())
        official = [None if k % 3 else "test" for k in range(n)]  # and the per-item paths
        for grouped in (None, groups):
            names = splits.assign_splits(labels, official, val, test, trial, grouped)
            got = splits.assign_split_codes(labels, official, val, test, trial, grouped)
            assert [splits.SPLITS[c] for c in got.tolist()] == names
            free = splits.assign_split_codes(labels, None, val, test, trial, grouped)
            assert [splits.SPLITS[c] for c in free.tolist()] == splits.assign_splits(
                labels, [None] * n, val, test, trial, grouped)
    with pytest.raises(ValueError, match=r"split.val=0.6 and split.test=0.5"):
        splits.assign_split_codes([0], None, 0.6, 0.5, 0, np.zeros(1, int))


def test_exact_duplicates_of_a_digest_array_equal_the_dict_walk() -> None:
    from components.data import integrity

    rng = np.random.default_rng(0)
    pool = [rng.bytes(32) for _ in range(40)] + [b"\x01" * 31 + b"\x00", b"\x01" * 32]
    digests = [pool[int(i)] for i in rng.integers(0, len(pool), 500)]
    want = integrity.exact_duplicates(digests)
    assert len(want) > 400
    assert integrity.exact_duplicates(np.array(digests, dtype="S32")) == want
    assert integrity.exact_duplicates(np.array(digests, dtype="S32"), chunk=7) == want
    assert integrity.exact_duplicates(np.array(digests[:1], dtype="S32")) == {}


def test_exact_duplicates_compare_whole_digests_where_their_first_bytes_agree(
    tmp_path: Path,
) -> None:
    """The sort is on each digest's first 8 bytes: digests that share them and differ after
    are not duplicates; ``rows`` picks items without copying them out; a mapped array (as a
    build holds content.npz's) gives the same answer."""
    from components.data import integrity

    rng = np.random.default_rng(1)
    head = rng.bytes(8)
    pool = [head + rng.bytes(24) for _ in range(6)] + [rng.bytes(32) for _ in range(30)]
    pool += [b"\x07" * 3 + b"\x00" * 29, b"\x07" * 3 + b"\x00" * 28 + b"\x01"]  # NUL-padded
    digests = [pool[int(i)] for i in rng.integers(0, len(pool), 700)]
    arr = np.array(digests, dtype="S32")
    assert integrity.exact_duplicates(arr, chunk=64) == integrity.exact_duplicates(digests)
    rows = np.sort(rng.choice(700, 300, replace=False))
    want = integrity.exact_duplicates([digests[i] for i in rows.tolist()])
    assert integrity.exact_duplicates(arr, rows=rows, chunk=50) == want
    assert integrity.exact_duplicates(digests, rows=rows) == want
    np.save(tmp_path / "d.npy", arr)
    mapped = np.load(tmp_path / "d.npy", mmap_mode="r")
    assert integrity.exact_duplicates(mapped, rows=rows, chunk=50) == want
    # distinct digests that share their first 8 bytes only
    assert integrity.exact_duplicates(np.array(pool[:6], dtype="S32")) == {}
    assert integrity.exact_duplicates(np.array([b"ab", b"abc", b"ab"], dtype="S3")) == {2: 0}


def test_groups_from_roots_on_arrays_equal_the_dict_of_lists() -> None:
    from components.data import integrity

    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 50, 400):
        pairs = rng.integers(0, max(n, 1), (n // 3, 2)) if n else np.zeros((0, 2), np.int64)
        root = integrity.group_roots(n, pairs)
        want: dict[int, list[int]] = {}
        for i, r in enumerate(root.tolist()):
            want.setdefault(r, []).append(i)
        assert integrity.groups_from_roots(root) == [g for _, g in sorted(want.items())
                                                     if len(g) > 1]
        # on the paired items only (pairs with an item twice: a self-loop, a group of one)
        assert integrity.pair_groups(pairs) == integrity.groups_from_roots(root)
        assert integrity.pair_groups(pairs) == [g for _, g in sorted(want.items())
                                                if len(g) > 1]


def test_collected_content_is_the_parts_columns_with_thumbnails_mapped_from_the_cache(
    tmp_path: Path,
) -> None:
    from components.data.build.hashing import DIGEST, Content, collect, npz_member

    rng = np.random.default_rng(2)
    n = 2500
    cols = {"idx": np.arange(n), "reason": np.array([""] * n, object),
            "detail": np.array([""] * n, object),
            "bytes_sha256": np.array([rng.bytes(32) for _ in range(n)], DIGEST),
            "pixels_sha256": np.array([rng.bytes(32) for _ in range(n)], DIGEST),
            "phash": rng.integers(0, 2**63, n, dtype=np.uint64),
            "thumb": rng.integers(0, 256, (n, 256), dtype=np.uint8)}
    cols["reason"][7], cols["detail"][7] = "corrupt-image", "cannot identify image file"
    bounds = [0, 1000, 1700, n]
    parts = [{k: v[a:b] for k, v in cols.items()} for a, b in itertools.pairwise(bounds)]
    cache = tmp_path / "content.npz"
    got = collect(reversed(parts), n, cache, "k")  # any order
    for k, col in (("thumbs", "thumb"), ("bytes_sha256", "bytes_sha256"),
                   ("pixels_sha256", "pixels_sha256")):  # mapped from the file, not held
        assert isinstance(getattr(got, k), np.memmap) and (getattr(got, k) == cols[col]).all()
    assert (got.phash == cols["phash"]).all()
    assert list(got.failures()) == [(7, "corrupt-image", "cannot identify image file")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["content.npz"]  # no scratch left
    with np.load(cache, allow_pickle=False) as z:  # the layout np.savez writes
        assert str(z["key"]) == "k" and z["failed_detail"].dtype == np.dtype("<U26")
        assert (z["thumbs"] == cols["thumb"]).all() and list(z["failed"]) == [7]
        assert (z["pixels_sha256"] == cols["pixels_sha256"]).all()
        assert list(z["failed_reason"]) == ["corrupt-image"]
    assert (npz_member(cache, "phash") == cols["phash"]).all()
    again = Content.read(cache, "k")
    assert again is not None and Content.read(cache, "another key") is None
    assert list(again.failures()) == list(got.failures())
    assert (again.bytes_sha256 == cols["bytes_sha256"]).all() and isinstance(
        again.bytes_sha256, np.memmap)
    # the tasks' columns in this process (hash_local) give the same failures
    assert list(Content.from_columns(cols).failures()) == list(got.failures())


def test_web_captions_spilled_to_the_build_dir_are_not_held(tmp_path: Path) -> None:
    """Every caption distinct and long (web captions): with ``spill`` (the build dir) their
    UTF-8 bytes sit in a mapped, unlinked file there — the driver's heap holds offsets, not
    ~150 B of text an item — and the listing reads the same as one held in memory."""
    n, src, build = 3000, tmp_path / "wds", tmp_path / "build"
    src.mkdir()
    build.mkdir()
    _tar(src / "shard-00000.tar",
         [m for i in range(n) for m in (
             (f"{i:07d}.png", b"x"),
             (f"{i:07d}.txt", f"caption {i:05d}: {'a long web caption ' * 7}".encode()))])
    cfg = _cfg(tmp_path / "o", "webdataset", src, captions={"enabled": True})
    want = list_items(cfg)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    got = list_items(cfg, spill=build)
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    assert isinstance(got.captions, CaptionTexts) and isinstance(got.captions.data, np.memmap)
    assert list(got.captions) == list(want.captions) and len(got.captions) == n
    assert got.caption_ids.tolist() == want.caption_ids.tolist()
    assert list(build.iterdir()) == []
    # paths 20 B, label / caption id / issue 9, offsets 8 an item; held, the texts were 161 more
    assert held < 64, held
