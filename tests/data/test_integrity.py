"""Dataset integrity without Ray: content hashes, exact / near duplicates, group-aware splits,
caption checks (issue 17)."""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from components.config import ConfigError, DedupeConfig, PreprocessConfig, from_dict
from components.data import hash_search, integrity
from components.data.build import DUPLICATE_OF, plan
from components.data.images import decode_image
from components.data.sources import (
    CAPTION_EMPTY,
    CAPTION_ENCODING,
    decode_caption,
    list_folder,
    list_manifest,
)
from components.data.splits import assign_splits
from tests.support.hashes import flip_bits


def _photo(seed: int, h: int = 64, w: int = 64) -> np.ndarray:
    """A smooth random picture (blurred noise + gradient): like a photo, unlike its siblings."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC))
    return np.clip(img.astype(int) + rng.integers(-6, 7, img.shape), 0, 255).astype(np.uint8)


def _jpeg_copy(rgb: np.ndarray, side: int, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).resize((side, side), Image.Resampling.BICUBIC).save(
        buf, "JPEG", quality=quality)
    return buf.getvalue()


def _cfg(tmp: Path, src: Path, kind: str = "folder", **over: object) -> PreprocessConfig:
    data: dict = {"output": str(tmp / "out"), "source": {"kind": kind, "path": str(src)},
                  "image": {"max_side": 32, "min_side": 8}}
    for k, v in over.items():
        section, _, key = k.partition("__")
        data.setdefault(section, {})[key] = v
    return from_dict(PreprocessConfig, data)


# --------------------------------------------------------------------------- hashes


def test_phash_survives_resize_and_jpeg_but_separates_pictures() -> None:
    near, far = [], []
    default = DedupeConfig()
    for seed in range(40):
        rgb = _photo(seed)
        a = decode_image(rgb, max_side=32, min_side=8)
        b = decode_image(_jpeg_copy(rgb, 48, 80), max_side=32, min_side=8)
        other = decode_image(_photo(seed + 100), max_side=32, min_side=8)
        near.append(integrity.hamming(integrity.phash(a), integrity.phash(b)))
        far.append(integrity.hamming(integrity.phash(a), integrity.phash(other)))
        diff = np.abs(integrity.thumbnail(a).astype(int) - integrity.thumbnail(b)).mean()
        assert diff <= default.near_max_diff, diff
    assert default.near_threshold is not None and max(near) <= default.near_threshold, near
    assert min(far) > 3 * default.near_threshold, far


def _brute_pairs(hashes: np.ndarray, t: int) -> np.ndarray:
    """Every pair ``i < j`` within ``t`` bits, by comparing all n² pairs."""
    h = np.asarray(hashes, dtype=np.uint64)
    dist = np.bitwise_count(h[:, None] ^ h[None, :])
    return np.argwhere(np.triu(dist <= t, 1)).astype(np.int64).reshape(-1, 2)


def _brute_roots(n: int, pairs: np.ndarray) -> np.ndarray:
    """The smallest index reachable from every item through ``pairs``: each pair's two ends
    take the smaller of their labels until nothing changes."""
    root = np.arange(n)
    a, b = np.asarray(pairs, dtype=np.int64).reshape(-1, 2).T
    while True:
        low = np.minimum(root[a], root[b])
        new = root.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        if (new == root).all():
            return root
        root = new


def _hash_sets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    uniform = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    copies = flip_bits(uniform[rng.integers(0, 1500, 500)], 10, rng)
    planted = np.concatenate([uniform[:1500], copies])
    bases = rng.integers(0, 2**64, 8, dtype=np.uint64)
    clumpy = flip_bits(bases[rng.integers(0, 8, 800)], 9, rng)  # buckets above BIG
    same = np.repeat(bases[:4], 100)  # identical hashes, among near copies
    return {"uniform": uniform, "uniform+near copies": planted,
            "near copies of few": clumpy,
            "identical": rng.permutation(np.concatenate([same, flip_bits(same[:100], 3, rng)]))}


@pytest.mark.parametrize("name", list(_hash_sets()))
def test_near_pairs_equal_brute_force(name: str) -> None:
    hashes = _hash_sets()[name]
    for t in range(11):
        want = _brute_pairs(hashes, t)
        # the chosen scheme, the bands, and more blocks (up to ~100 keys: the test's time)
        for blocks in [None, t + 1, *(m for m in (t + 2, t + 3) if math.comb(m, t) <= 100)]:
            got = hash_search.near_pairs(hashes, t, blocks=blocks, block=48)  # big buckets
            # compared in several blocks
            assert got.dtype == np.int64 and np.array_equal(got, want), (t, blocks)
        # the buckets compared a few sorted positions at a time (a bucket is never cut: big
        # ones span many chunks)
        for chunk in (1, 37, 300):
            got = hash_search.near_pairs(hashes, t, block=48, chunk=chunk)
            assert np.array_equal(got, want), (t, chunk)
    if name != "uniform":
        assert len(_brute_pairs(hashes, 6)) > 100


@pytest.mark.parametrize("name", list(_hash_sets()))
def test_near_pairs_spread_over_tasks_equal_one_search(name: str) -> None:
    """The keys searched in groups (``map_keys``: a build's Ray tasks; here a mapper handing
    the groups' results back in reverse): every pair once, the same sorted pairs; each group's
    own pairs disjoint from the others'."""
    hashes = _hash_sets()[name]
    calls: list[int] = []

    def backwards(fn: Any, args: Any, kwargs: dict[str, Any]) -> list[np.ndarray]:
        calls.append(len(args))
        return [fn(a, **kwargs) for a in args][::-1]

    for t in (0, 3, 6):
        want = hash_search.near_pairs(hashes, t)
        m = hash_search.choose_blocks(hashes, t)
        subsets = list(itertools.combinations(range(m), m - t))
        for tasks in (2, 3, 7, 1000):
            calls.clear()
            got = hash_search.near_pairs(hashes, t, map_keys=backwards, tasks=tasks)
            assert np.array_equal(got, want), (t, tasks)
            assert calls == [min(tasks, len(subsets))]  # one call, a group per task
        parts = [hash_search.key_pairs(subsets[g::3], hashes=hashes, threshold=t, blocks=m)
                 for g in range(3)]
        codes = np.concatenate(parts)
        assert len(np.unique(codes)) == len(codes) == len(want)


def test_near_pairs_edge_sizes_and_thresholds() -> None:
    rng = np.random.default_rng(1)
    h = rng.integers(0, 2**64, 30, dtype=np.uint64)
    h = np.concatenate([h, ~h[:5], h[:3]])  # complements (64 bits apart) and copies
    for n in (0, 1, 2, len(h)):
        for t in (-3, -1, 0, 1, 6, 31, 62, 63, 64, 100):
            want = _brute_pairs(h[:n], t) if t >= 0 else np.zeros((0, 2), np.int64)
            got = hash_search.near_pairs(h[:n], t)
            assert got.shape[1] == 2 and np.array_equal(got, want), (n, t)
    assert len(hash_search.near_pairs(h, 64)) == len(h) * (len(h) - 1) // 2
    with pytest.raises(ValueError, match="blocks"):
        hash_search.near_pairs(h, 6, blocks=6)


def test_near_pairs_choose_more_blocks_for_more_hashes() -> None:
    """Uniform hashes: the bands (t + 1 blocks) below a few thousand, more blocks (longer
    keys, smaller buckets) as n grows; clumpy ones: no more keys than uniform ones of that
    size."""
    rng = np.random.default_rng(2)
    few = hash_search.choose_blocks(rng.integers(0, 2**64, 500, dtype=np.uint64), 6)
    many = hash_search.choose_blocks(rng.integers(0, 2**64, 1 << 17, dtype=np.uint64), 6)
    lots = hash_search.choose_blocks(rng.integers(0, 2**64, 1 << 20, dtype=np.uint64), 6)
    assert few <= many <= lots and 7 < lots
    clumpy = np.repeat(rng.integers(0, 2**64, 100, dtype=np.uint64), 1 << 10)
    assert hash_search.choose_blocks(clumpy, 6) <= lots


@pytest.mark.parametrize("name", list(_hash_sets()))
def test_near_duplicate_groups_equal_brute_force(name: str) -> None:
    hashes = _hash_sets()[name]
    rng = np.random.default_rng(3)
    thumbs = rng.integers(0, 3, (len(hashes), integrity.THUMB**2), dtype=np.uint8)
    thumbs[rng.random(len(hashes)) < 0.3] += 2  # some pairs fail the thumbnail check
    for t in (0, 4, 6, 9):
        pairs = _brute_pairs(hashes, t)
        diff = np.abs(thumbs[pairs[:, 0]].astype(int) - thumbs[pairs[:, 1]]).mean(axis=1)
        pairs = pairs[diff <= 1.0]
        root, got = integrity.near_duplicate_groups(hashes, thumbs, t, 1.0)
        assert np.array_equal(got, pairs), t
        assert root.dtype == np.int64 and np.array_equal(root, _brute_roots(len(hashes), pairs))


def _rss_file_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:")) / 1024


def test_thumb_diff_on_mapped_thumbnails_lets_their_pages_go(tmp_path: Path) -> None:
    """A build's thumbnails are mapped from ``content.npz``: checking candidate pairs spread
    over every page leaves none of them in the process (its RSS would otherwise grow by the
    whole file: 3 GB at 12M items), with the same differences as in memory."""
    rng = np.random.default_rng(0)
    thumbs = rng.integers(0, 256, (131_072, 256), dtype=np.uint8)  # 32 MiB
    np.save(tmp_path / "thumbs.npy", thumbs)
    mapped = np.load(tmp_path / "thumbs.npy", mmap_mode="r")
    pairs = rng.integers(0, len(thumbs), (100_000, 2))
    before = _rss_file_mib()
    got = integrity.thumb_diff(np.asarray(mapped, dtype=np.uint8), pairs)
    assert _rss_file_mib() - before < 8  # ≤ a chunk's pages, not the 32 MiB file
    np.testing.assert_array_equal(got, integrity.thumb_diff(thumbs, pairs))
    want = np.abs(thumbs[pairs[:7, 0]].astype(np.float64) - thumbs[pairs[:7, 1]]).mean(axis=1)
    np.testing.assert_allclose(got[:7], want)


def test_group_roots_transitive_smallest_index() -> None:
    roots = integrity.group_roots(6, np.array([[4, 2], [2, 5], [1, 0]]))
    assert roots.tolist() == [0, 0, 2, 3, 2, 2]
    assert integrity.groups_from_roots(roots) == [[0, 1], [2, 4, 5]]
    assert integrity.group_roots(3, np.zeros((0, 2), np.int64)).tolist() == [0, 1, 2]
    assert integrity.group_roots(0, np.zeros((0, 2), np.int64)).tolist() == []


# --------------------------------------------------------------------------- duplicates in plan


def _collection(root: Path) -> dict[str, Path]:
    """Two classes of distinct pictures, plus an exact copy under another name in another
    folder, a same-pixels re-encoding, and a resized JPEG near duplicate."""
    paths = {}
    for c, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(10):
            p = root / cls / f"{i}.png"
            Image.fromarray(_photo(10 * c + i)).save(p)
            paths[f"{cls}{i}"] = p
    (root / "dog" / "sub").mkdir()
    copy = root / "dog" / "sub" / "copy-of-cat3.png"
    copy.write_bytes(paths["cat3"].read_bytes())  # byte-identical, other name and folder
    paths["copy"] = copy
    bmp = root / "cat" / "cat4-as.bmp"
    Image.fromarray(_photo(4)).save(bmp)  # same pixels, other bytes
    paths["bmp"] = bmp
    near = root / "cat" / "z-near-cat5.jpg"
    near.write_bytes(_jpeg_copy(_photo(5), 48, 80))
    paths["near"] = near
    return paths


def test_exact_duplicates_kept_once_and_reported(tmp_path: Path) -> None:
    paths = _collection(tmp_path / "src")
    p = plan(_cfg(tmp_path, tmp_path / "src", captions__enabled=False))
    dups = {s.path: s for s in p.skipped if s.reason == DUPLICATE_OF}
    assert set(dups) == {str(paths["copy"]), str(paths["bmp"])}
    assert dups[str(paths["copy"])].of == str(paths["cat3"])
    assert "same bytes" in dups[str(paths["copy"])].detail
    assert "label 'dog' differs" in dups[str(paths["copy"])].detail
    assert dups[str(paths["bmp"])].of == str(paths["cat4"])
    assert "same pixels" in dups[str(paths["bmp"])].detail
    kept = {r.path for r in p.rows}
    assert str(paths["cat3"]) in kept and str(paths["copy"]) not in kept
    assert len(p.rows) == 21  # 20 pictures + the near duplicate; 2 exact copies dropped
    # Off: every copy is kept.
    off = plan(_cfg(tmp_path, tmp_path / "src", captions__enabled=False, dedupe__exact=False,
                    dedupe__near_threshold=None))
    assert len(off.rows) == 23 and not off.skipped and off.near_duplicates is None


def test_near_duplicate_pair_never_straddles_splits(tmp_path: Path) -> None:
    paths = _collection(tmp_path / "src")
    a, b = str(paths["cat5"]), str(paths["near"])
    for seed in range(8):
        p = plan(_cfg(tmp_path, tmp_path / "src", captions__enabled=False,
                      split__val=0.3, split__test=0.3, split__seed=seed))
        split = {r.path: r.split for r in p.rows}
        assert split[a] == split[b], seed
        nd = p.near_duplicates
        assert nd is not None and nd["groups"] >= 1 and nd["straddling_splits"]["pairs"] == 0
        listed = [{m["path"] for m in g} for g in nd["list"]]
        assert {a, b} in listed
        assert nd["sizes"].get("2", 0) >= 1
    # Without near-duplicate grouping some seed separates them (the test can fail).
    seps = 0
    for seed in range(8):
        p = plan(_cfg(tmp_path, tmp_path / "src", captions__enabled=False,
                      split__val=0.3, split__test=0.3, split__seed=seed,
                      dedupe__near_threshold=None))
        split = {r.path: r.split for r in p.rows}
        seps += split[a] != split[b]
    assert seps > 0


@pytest.mark.parametrize("dedupe", [{}, {"dedupe__exact": False,
                                          "dedupe__near_threshold": None}])
def test_group_by_column_keeps_groups_in_one_split(tmp_path: Path,
                                                   dedupe: dict[str, Any]) -> None:
    """With deduplication on or off (it was ignored with both checks off: a split that leaked
    subjects across train and test, silently)."""
    root = tmp_path / "src"
    root.mkdir()
    lines = ["path,label,subject"]
    for i in range(40):
        Image.fromarray(_photo(200 + i)).save(root / f"{i}.png")
        lines.append(f"{i}.png,{'ab'[i % 2]},s{i // 4}")
    (root / "m.csv").write_text("\n".join(lines) + "\n")
    p = plan(_cfg(tmp_path, root / "m.csv", kind="manifest", captions__enabled=False,
                  split__val=0.25, split__test=0.25, split__group_by="subject", **dedupe))
    by_subject: dict[str, set[str]] = {}
    for r in p.rows:
        by_subject.setdefault(f"s{int(Path(r.path).stem) // 4}", set()).add(r.split)
    assert all(len(s) == 1 for s in by_subject.values())
    assert {s for v in by_subject.values() for s in v} == {"train", "val", "test"}
    assert p.split_groups is not None and p.split_groups["values"] == 10
    assert p.split_groups["units"] == 10 and p.split_groups["items"] == 40


def test_group_by_is_validated() -> None:
    with pytest.raises(ConfigError, match="split.group_by='subject' needs source.kind=manifest"):
        from_dict(PreprocessConfig, {"output": "o", "source": {"kind": "fashion-mnist"},
                                     "split": {"group_by": "subject"}})
    with pytest.raises(ConfigError, match=r"dedupe.near_threshold=65 .* \[0, 16\]"):
        from_dict(PreprocessConfig, {"output": "o", "dedupe": {"near_threshold": 65},
                                     "source": {"kind": "fashion-mnist"}})
    with pytest.raises(ConfigError, match="dedupe.near_max_diff"):
        from_dict(PreprocessConfig, {"output": "o", "dedupe": {"near_max_diff": -1},
                                     "source": {"kind": "fashion-mnist"}})


def test_grouped_assignment_equals_ungrouped_for_singletons() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 300).tolist()
    for official in ([None] * 300, ["train"] * 250 + ["test"] * 50):
        assert assign_splits(labels, official, 0.1, 0.2, 5) == assign_splits(
            labels, official, 0.1, 0.2, 5, groups=list(range(300)))


# --------------------------------------------------------------------------- captions


def test_decode_caption() -> None:
    assert decode_caption(b"\xef\xbb\xbfa cat\nmore") == ("a cat more", None)
    assert decode_caption(b"\xef\xbb\xbfa cat\nmore", first_line=True) == ("a cat", None)
    assert decode_caption(b"caf\xe9") == (None, CAPTION_ENCODING)  # Latin-1, not UTF-8
    assert decode_caption(b" \n\t ") == (None, CAPTION_EMPTY)
    assert decode_caption(None) == (None, None)


def _captioned(root: Path) -> None:
    (root / "cat").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(_photo(300 + i)).save(root / "cat" / f"{i}.png")
    (root / "cat" / "0.txt").write_text("a cat\n")
    (root / "cat" / "1.txt").write_bytes(b"un chat \xe0 rayures\n")  # Latin-1
    (root / "cat" / "2.txt").write_text("   \n")


def test_bad_captions_are_counted_skip(tmp_path: Path) -> None:
    _captioned(tmp_path / "src")
    lst = list_folder(str(tmp_path / "src"))
    assert [i.caption_issue for i in lst.items] == [None, CAPTION_ENCODING, CAPTION_EMPTY, None]
    p = plan(_cfg(tmp_path, tmp_path / "src", captions__missing="skip"))
    reasons = sorted(s.reason for s in p.skipped)
    assert reasons == ["caption-empty", "caption-encoding", "missing-caption"]
    assert [Path(r.path).name for r in p.rows] == ["0.png"]


def test_bad_captions_are_counted_from_label(tmp_path: Path) -> None:
    _captioned(tmp_path / "src")
    p = plan(_cfg(tmp_path, tmp_path / "src", captions__missing="from-label"))
    assert len(p.rows) == 4 and not p.skipped
    notes = sorted((Path(n["path"]).name, n["reason"], n["action"]) for n in p.caption_notes)
    assert notes == [("1.png", "caption-encoding", "from-label"),
                     ("2.png", "caption-empty", "from-label")]


def test_csv_manifest_bad_caption_row_is_counted_not_fatal(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        Image.fromarray(_photo(400 + i)).save(root / f"{i}.png")
    (root / "m.csv").write_bytes(
        b"path,label,caption\n0.png,a,a cat\n1.png,a,caf\xe9\n2.png,a,\"  \"\n")
    lst = list_manifest(str(root / "m.csv"))
    assert [(i.caption, i.caption_issue) for i in lst.items] == [
        ("a cat", None), (None, CAPTION_ENCODING), (None, CAPTION_EMPTY)]


def test_the_content_pass_keeps_raw_sha256_digests(tmp_path: Path) -> None:
    """32 raw bytes per digest (not 64-char hex: 113 B each in memory, 256 B on disk), b"" for
    an item that could not be decoded; rows back in listing order."""
    import hashlib

    import cv2

    from components.data.build.hashing import DIGEST, Content, hash_batch
    from components.data.images import decode_image

    rgb = (np.arange(16 * 16 * 3) % 251).astype(np.uint8).reshape(16, 16, 3)
    good = tmp_path / "a.png"
    cv2.imwrite(str(good), rgb)
    bad = tmp_path / "b.png"
    bad.write_bytes(b"not an image")
    cols = hash_batch({"idx": np.array([1, 0]), "path": np.array([str(bad), str(good)], object)},
                      max_side=16, min_side=8)
    content = Content.from_columns(cols)
    assert content.bytes_sha256.dtype == DIGEST and content.pixels_sha256.dtype == DIGEST
    stored = decode_image(good.read_bytes(), max_side=16, min_side=8)
    assert content.bytes_sha256[0] == hashlib.sha256(good.read_bytes()).digest().rstrip(b"\0")
    assert content.pixels_sha256[0] == bytes.fromhex(
        integrity.pixel_digest(stored)).rstrip(b"\0")
    assert [(i, r) for i, r, _ in content.failures()] == [(1, "not-an-image")]
    assert content.bytes_sha256[1] == b"" and content.pixels_sha256[1] == b""
