"""Issue 39, item 4: a dataset is complete only for the source content it was built from.

``source.json.gz`` (``components/data/build/source_record.py``) records every listed item's
path, label, caption and file metadata; a re-run of ``preprocess`` lists the source again and
refuses a dataset whose source changed — naming what was added, removed or changed — instead
of saying "already complete"; ``--overwrite`` rebuilds it. A shard of a killed build, and a
complete ``--overwrite`` build waiting to be swapped in, are reused only while the files they
were made from are unchanged.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.data.build import driver, transaction
from components.data.build.source_record import SOURCE_FILE, SourceRecord
from components.data.reader import MANIFEST
from pipelines.preprocess import PreprocessError, run
from tests.data.test_build_transactions import NEXT, _assert_usable, _cfg, _dataset, _files, _images


def _same_size_new_content(path: Path) -> None:
    """Replace ``path``'s pixels with others of the same encoded size, restoring its mtime
    (what ``rsync -t`` or ``tar`` does): only the inode / ctime say it changed."""
    st = path.stat()
    pixels = np.asarray(Image.open(path)).copy()
    data = path.read_bytes()
    for seed in range(100):
        pixels[0, 0] = np.random.default_rng(seed).integers(0, 256, 3)
        tmp = path.with_suffix(".new.png")
        Image.fromarray(pixels).save(tmp)
        if tmp.stat().st_size == len(data) and tmp.read_bytes() != data:
            os.replace(tmp, path)
            break
        tmp.unlink()
    else:
        raise AssertionError("no same-size variant found")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_changed_source_is_refused_naming_what_changed_and_overwrite_rebuilds_it(
    tmp_path: Path, ray_local: None, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    first = run(_cfg(out, src), echo=False)
    assert first["source"]["items"] == 8 and (out / SOURCE_FILE).exists()
    record = SourceRecord.read(out)
    assert record is not None and record.digest() == first["source"]["digest"]
    assert sorted(record.items) == sorted(str(p) for p in src.rglob("*.png"))

    run(_cfg(out, src))  # unchanged: complete, and says it compared the source
    assert "already complete and verified (its source is unchanged)" in capsys.readouterr().out
    before = _files(out)

    # The case: images added to the source after the build.
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(src / "cat" / "new.png")
    added = src / "cat" / "new.png"
    with pytest.raises(PreprocessError) as e:
        run(_cfg(out, src), echo=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"{out} was built from another version of its source: 1 added ({added})" in msg
    assert "pass --overwrite" in msg
    assert _files(out) == before  # nothing was touched
    _assert_usable(out, first)
    added.unlink()

    # Removed, and changed with size and mtime kept (rsync -t / tar restore both).
    (src / "dog" / "3.png").unlink()
    _same_size_new_content(src / "cat" / "1.png")
    with pytest.raises(PreprocessError,
                       match=re.escape(f"1 removed ({src / 'dog' / '3.png'}); 1 changed "
                                       f"({src / 'cat' / '1.png'})")):
        run(_cfg(out, src), echo=False)
    assert _files(out) == before

    # A new class folder: named as added items and as a class list change.
    (src / "bird").mkdir()
    for k in range(5):
        Image.fromarray(np.full((12, 12, 3), k, np.uint8)).save(src / "bird" / f"{k}.png")
    with pytest.raises(PreprocessError, match=r"5 added \(.*bird/0.png, .*, and 2 more\).*"
                                              r"classes \['cat', 'dog'\] -> \['bird'"):
        run(_cfg(out, src), echo=False)
    assert _files(out) == before

    # --overwrite rebuilds from the source as it is now; a re-run then finds it unchanged.
    new = run(_cfg(out, src), overwrite=True, echo=False)
    assert new["source"]["items"] == 12 and new["source"]["digest"] != first["source"]["digest"]
    assert new["classes"] == ["bird", "cat", "dog"]
    _assert_usable(out, new)
    run(_cfg(out, src))
    assert "(its source is unchanged)" in capsys.readouterr().out


def test_a_dataset_without_a_source_record_or_without_its_source_is_used_saying_so(
    tmp_path: Path, ray_local: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Built before sources were recorded: used, saying it was not compared; its source not
    here (a dataset copied to another machine): used, saying why it was not compared."""
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    manifest = run(_cfg(out, src), echo=False)

    old = {k: v for k, v in manifest.items() if k != "source"}  # an older build's manifest
    (out / MANIFEST).write_text(json.dumps(old))
    (out / SOURCE_FILE).unlink()
    run(_cfg(out, src))
    assert "built before simgraph recorded its source: not compared with it" in \
        capsys.readouterr().out

    run(_cfg(out, src), overwrite=True, echo=False)  # records it
    before = _files(out)
    src.rename(tmp_path / "elsewhere")
    run(_cfg(out, src))
    printed = capsys.readouterr().out
    assert "already complete and verified (its source was not compared:" in printed
    assert str(src) in printed
    assert _files(out) == before


def test_a_damaged_source_record_is_named(tmp_path: Path, ray_local: None) -> None:
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    run(_cfg(out, src), echo=False)
    (src / "cat" / "0.png").unlink()
    with gzip.open(out / SOURCE_FILE, "wt") as f:
        f.write("[1, 2]")
    before = _files(out)
    with pytest.raises(PreprocessError,
                       match=re.escape(f"{out / SOURCE_FILE} cannot be read as simgraph's "
                                       "source record")):
        run(_cfg(out, src), echo=False)
    assert _files(out) == before


def test_shards_and_a_waiting_overwrite_build_are_reused_only_for_unchanged_files(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A killed in-place build resumed after a file changed rewrites that file's shard (and
    keeps the others); a complete ``--overwrite`` build killed before its swap is built again
    when the source changed since."""
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    cfg = _cfg(out, src, keep_shards=True)

    def fail(*args: object, **kwargs: object) -> None:
        raise PreprocessError("injected: the merge failed")

    with monkeypatch.context() as m:
        m.setattr(driver, "merge_splits", fail)
        with pytest.raises(PreprocessError, match="injected"):
            run(cfg, echo=False)
    shards = {p.name: p.read_bytes() for p in (out / "shards").glob("*.beton")}
    assert len(shards) == 4
    _same_size_new_content(src / "cat" / "1.png")
    manifest = run(cfg, echo=False)
    after = {p.name: p.read_bytes() for p in (out / "shards").glob("*.beton")}
    rewritten = sorted(n for n in shards if after[n] != shards[n])
    assert len(rewritten) == 1  # the shard holding cat/1.png; the other three were reused
    _assert_usable(out, manifest)

    # An --overwrite build complete in .next, killed before its swap; then the source changes.
    with monkeypatch.context() as m:
        def killed(path: Path) -> None:
            raise OSError("injected: killed before the swap")

        m.setattr(transaction, "_swap", killed)
        with pytest.raises(OSError, match="injected"):
            run(cfg, overwrite=True, echo=False)
    assert (out / NEXT / MANIFEST).exists()
    before = _dataset(out)
    (src / "dog" / "0.png").unlink()
    capsys.readouterr()
    new = run(cfg, overwrite=True)
    assert "made from another version of the source; building it again" in \
        capsys.readouterr().out
    assert new["source"]["items"] == 7 and _dataset(out) != before
    _assert_usable(out, new)


def test_a_source_changed_while_the_build_reads_it_is_not_called_complete(
    tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file rewritten after the listing, while the shards are written (a sync job, an
    img2dataset run still writing), may be read half old, half new: the build checks the
    source's files again before it writes its manifest and stops naming the changed file; the
    re-run rebuilds what it touched and completes."""
    src = _images(tmp_path / "src")
    out = tmp_path / "out"
    cfg = _cfg(out, src)
    merge = driver.merge_splits

    def merge_after_a_rewrite(*args: object, **kwargs: object) -> object:
        _same_size_new_content(src / "dog" / "2.png")  # mid-build: only ctime / inode say so
        return merge(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(driver, "merge_splits", merge_after_a_rewrite)
        with pytest.raises(PreprocessError) as e:
            run(cfg, echo=False)
    msg = str(e.value)
    assert "changed while the build read it" in msg and str(src / "dog" / "2.png") in msg
    assert "re-run" in msg
    assert not (out / MANIFEST).exists()  # not complete
    manifest = run(cfg, echo=False)
    assert manifest["source"]["items"] == 8
    _assert_usable(out, manifest)


def test_a_changed_shard_is_named_by_its_file_not_its_items_offsets() -> None:
    """One image edited in a tar shard moves every later item's offset: the refusal said
    "50 added (…#tar:105472:2696, …); 50 removed (…)" — places in the shard nobody can map to
    a member. Shard items are named by their shard."""
    from components.data.build.source_record import SourceChanges

    a, b = "/d/shard-00000.tar", "/d/shard-00001.tar"
    changes = SourceChanges(
        added=[f"{a}#tar:{512 * k}:100" for k in range(50)],
        removed=[f"{a}#tar:{512 * k + 1}:100" for k in range(49)] + [f"{b}#tar:512:9"],
        changed=["/d/folder/x.png"], classes=None, skipped=None)
    assert changes.describe() == (
        f"50 added (in {a}); 50 removed (in {a}, {b}); 1 changed (/d/folder/x.png)")


def test_changed_files_names_a_rewritten_shard_once(tmp_path: Path) -> None:
    """A shard source's record is checked per shard: one rewritten shard (same bytes, a new
    inode and ctime) is named once, whatever number of items it holds."""
    from components.data.build.listing import list_items
    from tests.data.test_shard_sources import _cfg as shard_cfg
    from tests.data.test_shard_sources import _png, _tar

    src = tmp_path / "wds"
    for k in range(2):
        _tar(src / f"{k:05d}.tar", [(f"{k}-{i}.png", _png(10 * k + i)) for i in range(3)])
    listed = list_items(shard_cfg(tmp_path / "o", "webdataset", src))
    record = SourceRecord.of(listed)
    assert record.changed_files(listed) == []
    again = src / "00001.tar"
    data = again.read_bytes()
    again.unlink()
    again.write_bytes(data)
    assert record.changed_files(listed) == [str(again)]
