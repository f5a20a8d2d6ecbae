"""Issue 42, item 2: the source record's digest and the content cache key are fed to sha256
piece by piece instead of being one JSON text per build (557 / 390 B per item at 40k), and are
the same digests as before — so an existing dataset dir resumes and compares as unchanged and
its ``content.npz`` is reused. Golden values computed with the whole-text implementation."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from components.data.build.common import _digest
from components.data.build.hashing import HASH_VERSION, _content_key
from components.data.build.source_record import SOURCE_FILE, SourceRecord, item_stat
from components.data.shard_sources import ShardOptions, list_webdataset
from tests.data.test_shard_sources import _png, _tar

STAT = (4096, 1700000000123456789, 42, 1700000000987654321)
ITEMS = {
    "/d/shard-00000.tar#tar:512:1855": (0, "0123456789abcdef", STAT),
    "/d/shard-00000.tar#tar:3072:77": (1, None, STAT),
    '/d/caf\u00e9/"q".png': (-1, "fedcba9876543210", None),
    "s3://b/k.png": (2, None, None),
}
RECORD = SourceRecord(["a", "b\u00e9", 'c"d'], ITEMS,
                      {"/d/x.png": "missing-caption", "/d/a.tar": "unreadable-shard"})
CFG: Any = SimpleNamespace(image=SimpleNamespace(max_side=64, min_side=8))


def _old_record_json(r: SourceRecord) -> dict[str, Any]:
    """The record's JSON as the whole-text implementation built it."""
    return {"format": 1, "classes": r.classes,
            "items": [[p, *v[:2], None if v[2] is None else list(v[2])]
                      for p, v in sorted(r.items.items())],
            "skipped": sorted(r.skipped.items())}


def _old_record_digest(r: SourceRecord) -> str:
    text = json.dumps(_old_record_json(r), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _old_content_key(paths: list[str], stat: Any) -> str:
    stats = [(p, *(stat(p) or (None,) * 4)) for p in paths]
    return _digest({"items": stats, "image": [64, 8], "hash": HASH_VERSION})


def test_golden_digests_of_the_whole_text_implementation() -> None:
    assert RECORD.digest() == "f03c24fb9031e5469ba68c9a1074fc2d84d6f83b01244e1b2d404dfe38ca1162"
    assert SourceRecord([], {}, {}).digest() == (
        "331f5d49bdff75b2df89b3e81ff574442ff2a161f0c8f13471aa13ebb3076b5f")
    paths = list(ITEMS)
    # hash version /3 (content.npz's failures stored sparse, its digests mapped): new keys
    assert _content_key(CFG, paths, lambda i: RECORD.stat(paths[i])) == (
        "896cc90d8cf7d8645cb86fef68fbbf451c65c0b349fd11549f88d60a7de1c344")
    assert _content_key(CFG, [], RECORD.stat_at) == (
        "6515257cca8fa0f0fadaa76d2b73bb78adc1243924120b25cbeead6eee780ad3")


def test_streamed_digests_equal_the_whole_text_ones_on_a_shard_source(tmp_path: Path) -> None:
    # 5,000 members over two shards: several hash chunks (64 KiB / 4,096 items each)
    for k in range(2):
        _tar(tmp_path / f"shard-{k:05d}.tar",
             [m for i in range(2500) for m in ((f"k{k}-{i:05d}.png", _png(i % 7)),
                                              (f"k{k}-{i:05d}.txt", f"caption {i % 13}".encode()))])
    lst = list_webdataset(str(tmp_path), options=ShardOptions())
    assert len(lst.items) == 5000
    cache: dict[str, Any] = {}
    record = SourceRecord(lst.classes,
                          {it.path: (it.label, "c" + str(len(it.path)), item_stat(it.path, cache))
                           for it in lst.items}, {"gone.tar": "unreadable-shard"})
    assert record.digest() == _old_record_digest(record)
    paths = [it.path for it in lst.items]
    assert _content_key(CFG, paths, lambda i: record.stat(paths[i])) == _old_content_key(
        [it.path for it in lst.items], record.stat)
    # source.json.gz: written piece by piece, the same JSON as before, read back equal
    record.write(tmp_path)
    old_text = json.dumps(_old_record_json(record), separators=(",", ":"))
    assert gzip.decompress((tmp_path / SOURCE_FILE).read_bytes()).decode() == old_text
    # the very bytes the whole-text implementation wrote
    assert (tmp_path / SOURCE_FILE).read_bytes() == gzip.compress(old_text.encode(), mtime=0)
    back = SourceRecord.read(tmp_path)
    assert back is not None and back.digest() == record.digest()
    (tmp_path / "again").mkdir()
    record.write(tmp_path / "again")
    assert (tmp_path / "again" / SOURCE_FILE).read_bytes() == (
        tmp_path / SOURCE_FILE).read_bytes()  # deterministic bytes


def test_caption_keys_are_the_16_hex_digits_held_as_8_bytes() -> None:
    from components.data.build.source_record import CaptionKeys, _caption_key

    texts = ["a cat", "ünïcödé", "", "a dog"]
    keys = CaptionKeys(texts)
    assert len(keys) == 4 and keys._raw.nbytes == 32
    assert [keys[i] for i in range(4)] == [_caption_key(t) for t in texts]
    assert keys[1:3] == [_caption_key(t) for t in texts[1:3]] and keys[-1] == _caption_key("a dog")
    assert len(CaptionKeys([])) == 0
