"""The compact caption table (``components/data/caption_texts.py``): reads as the list of strs
it holds, sorts as ``sorted()`` sorts strs (Arrow on UTF-8 bytes: code-point order), and
deduplicates in order of first appearance as a dict would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.data.caption_texts import CaptionTexts, unique_texts

TEXTS = ["a dog", "", "Ünïcode café", "a", "ab", "Z", "日本語のキャプション", "emoji 🐕 dog",
         "a dog on grass", "zebra", "\u00e9", "e\u0301", "tab\tinside", "a dog"]


def test_it_reads_as_the_list_it_holds() -> None:
    t = CaptionTexts.of(TEXTS)
    assert len(t) == len(TEXTS) and list(t) == TEXTS and t == TEXTS and TEXTS == t
    assert t[2] == "Ünïcode café" and t[-1] == "a dog" and t[1:4] == TEXTS[1:4]
    assert t[::5] == TEXTS[::5]
    with pytest.raises(IndexError, match="caption 14 of 14"):
        t[14]
    assert t != TEXTS[:-1] and t != [*TEXTS[:-1], "x"]
    assert CaptionTexts.of([]) == [] and len(CaptionTexts.of([])) == 0
    assert "n=14" in repr(t)
    odd = ["ok", "a lone surrogate \ud800 from a JSON caption", "fine"]  # not valid UTF-8
    assert list(CaptionTexts.of(odd)) == odd and CaptionTexts.of(odd)[1] == odd[1]


def test_sorted_subset_sorts_as_sorted_strs_and_shares_the_bytes() -> None:
    base, _ = unique_texts(CaptionTexts.of(TEXTS))
    rng = np.random.default_rng(0)
    for _ in range(5):
        items = np.sort(rng.choice(len(base), size=int(rng.integers(1, len(base) + 1)),
                                   replace=False))
        got = base.sorted_subset(items)
        assert list(got) == sorted(base[int(i)] for i in items)
        assert got.data is base.data and sorted(got.rows.tolist()) == items.tolist()
    with pytest.raises(ValueError, match="base table"):
        got.sorted_subset(np.arange(2))


def test_unique_texts_in_order_of_first_appearance_as_a_dict_gives() -> None:
    rng = np.random.default_rng(1)
    texts = [TEXTS[int(k)] for k in rng.integers(0, len(TEXTS), 300)]
    index: dict[str, int] = {}
    want_ids = [index.setdefault(t, len(index)) for t in texts]
    uniq, ids = unique_texts(CaptionTexts.of(texts))
    assert list(uniq) == list(index) and ids.dtype == np.int32 and ids.tolist() == want_ids
    import hashlib

    table = CaptionTexts.of(texts)
    digests = np.frombuffer(b"".join(hashlib.blake2b(t.encode(), digest_size=16).digest()
                                     for t in texts), np.uint64)
    uniq, ids = unique_texts(table, digests)  # on the digests: the same answer
    assert list(uniq) == list(index) and ids.tolist() == want_ids
    distinct = CaptionTexts.of(list(index))
    same, ids = unique_texts(distinct, np.frombuffer(b"".join(
        hashlib.blake2b(t.encode(), digest_size=16).digest() for t in index), np.uint64))
    assert same is distinct and ids.tolist() == list(range(len(index)))  # no copy
    empty, none = unique_texts(CaptionTexts.of([]))
    assert len(empty) == 0 and none.tolist() == []


def test_a_spilled_table_deduplicates_sorts_and_extends_from_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spilled (the text bytes in an unlinked file of ``spill``, mapped): ``unique_texts``
    gathers the unique texts a chunk at a time into a new file, ``plus`` copies into one,
    ``sorted_subset`` shares the bytes; every result equals the in-memory table's."""
    from components.data import caption_texts
    from components.io.spill import SpillBuffer

    monkeypatch.setattr(caption_texts, "_GATHER", 2)  # several chunks of texts
    texts = [*TEXTS, *TEXTS[::-1], "Ünï", TEXTS[0]]
    buf = SpillBuffer(str(tmp_path))
    ends = [0]
    for t in texts:
        buf.append(t.encode())
        ends.append(len(buf))
    spilled = CaptionTexts(buf.array(), np.array(ends, np.int64), spill=str(tmp_path))
    held = CaptionTexts.of(texts)
    (u, ids), (want, want_ids) = unique_texts(spilled), unique_texts(held)
    assert list(u) == list(want) and ids.tolist() == want_ids.tolist()
    assert isinstance(u.data, np.memmap) and u.spill == str(tmp_path)
    sub = u.sorted_subset(np.arange(len(u)))
    assert list(sub) == sorted(want) and sub.data is u.data
    more = u.plus(["x"])
    assert list(more) == [*want, "x"] and isinstance(more.data, np.memmap)
    assert list(tmp_path.iterdir()) == []  # unlinked from the start


def test_plus_appends_templates_to_a_new_table() -> None:
    t = CaptionTexts.of(TEXTS[:3])
    more = t.plus(["a photo of a dog", "Ünï"])
    assert list(more) == [*TEXTS[:3], "a photo of a dog", "Ünï"] and list(t) == TEXTS[:3]
    assert t.plus([]) is t
    sub = unique_texts(CaptionTexts.of(TEXTS))[0].sorted_subset(np.arange(3))
    assert list(sub.plus(["x"])) == [*sorted(TEXTS[:3]), "x"]


@pytest.mark.parametrize("spilled", [False, True])
@pytest.mark.parametrize("recent", [1, 3, 1 << 16])
def test_the_reader_gives_every_item_its_decoded_caption_whatever_it_remembers(
    recent: int, spilled: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """CaptionReader decodes a raw value again once its dict of recent ones was emptied (web
    captions: no dict of them all); the table it finishes with is the same — distinct texts in
    order of first appearance, each item's text and issue as ``decode_caption`` gives them —
    with its text bytes held or spilled to a mapped file (``spill``: nothing left in the
    folder)."""
    from components.data.caption_texts import CaptionReader
    from components.data.sources import CAPTION_ISSUES, decode_caption

    monkeypatch.setattr(CaptionReader, "RECENT", recent)
    raws: list[bytes | str | None] = [
        b"a dog\nsecond line", "a dog", None, b"\xff\xfe bad", b"  ", "caf\u00e9",
        b"caf\xc3\xa9", b"\xef\xbb\xbfa dog", None, b"zebra", "a dog", b"\xff\xfe bad",
        "lone \ud800 surrogate", b"zebra", "caf\u00e9"]
    reader = CaptionReader(decode_caption, CAPTION_ISSUES, str(tmp_path) if spilled else None)
    entries = [reader.add(r) for r in raws]
    texts, text_of, issue_of = reader.finish()
    assert isinstance(texts.data, np.memmap) == spilled and list(tmp_path.iterdir()) == []
    want = [decode_caption(r) for r in raws]
    distinct = list(dict.fromkeys(t for t, _ in want if t is not None))
    assert list(texts) == distinct == [  # a caption's lines joined: a text of its own
        "a dog second line", "a dog", "café", "zebra", "lone \ud800 surrogate"]
    got = [(None if text_of[e] < 0 else texts[int(text_of[e])],
            CAPTION_ISSUES[int(issue_of[e])]) for e in entries]
    assert got == want
    assert text_of.dtype == np.int32 and issue_of.dtype == np.int8
    if recent == 1 << 16:  # remembered: each distinct raw value is one entry
        assert max(entries) + 1 == len(set(raws))
    with pytest.raises(RuntimeError, match="once"):
        reader.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        reader.add(b"more")


def _rss_file_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_a_spilled_table_read_through_keeps_a_chunks_pages_not_the_files(
    tmp_path: Path,
) -> None:
    """Iterating, sorting and slicing a spilled table (as the build's caption stage does) lets
    go of the file's pages as it goes (``release``): this process's file-backed RSS does not
    grow by the table (32 MB here), which stays in the page cache."""
    from components.io.spill import SpillBuffer

    text = "a long web caption " * 8
    buf, ends = SpillBuffer(str(tmp_path)), [0]
    for i in range(200_000):
        buf.append(f"{i:07d} {text}".encode())
        ends.append(len(buf))
    spilled = CaptionTexts(buf.array(), np.array(ends, np.int64), spill=str(tmp_path))
    assert len(spilled.data) > 30_000_000
    list(CaptionTexts.of(TEXTS))  # Arrow's conversions warmed (their libraries' pages)
    before = _rss_file_kib()
    assert sum(1 for _ in spilled) == 200_000
    sub = spilled.sorted_subset(np.arange(len(spilled)))
    assert sub[:2] == [f"0000000 {text}", f"0000001 {text}"]
    grown_mib = (_rss_file_kib() - before) / 1024
    assert grown_mib < 8, grown_mib  # without release: ~32 MiB
