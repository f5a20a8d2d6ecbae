"""components.io.storage (local paths and a local moto S3) and components.data.staging."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from components.data import staging
from components.data.reader import MANIFEST, DatasetError, DatasetInfo
from components.io import storage
from components.io.storage import StorageError
from tests.support.datasets import synthetic_dataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A directory to write into: a local path, or a prefix on the moto S3."""
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_uri"))


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Paths and URIs.


@pytest.mark.parametrize(("base_", "parts", "want"), [
    ("s3://b/x?endpoint_override=h:1&scheme=http", ("run", "a.txt"),
     "s3://b/x/run/a.txt?endpoint_override=h:1&scheme=http"),
    ("s3://b/x/?region=eu-west-1", ("/run/", "a.txt"), "s3://b/x/run/a.txt?region=eu-west-1"),
    ("s3://b", ("run",), "s3://b/run"),
    ("s3://b?scheme=http", ("run",), "s3://b/run?scheme=http"),
    ("gs://b/x", (), "gs://b/x"),
    ("file:///tmp/x", ("y",), "file:///tmp/x/y"),
    ("/tmp/x", ("run", "a.txt"), "/tmp/x/run/a.txt"),
    ("rel/x", ("/run",), "rel/x/run"),
])
def test_join(base_: str, parts: tuple[str, ...], want: str) -> None:
    assert storage.join(base_, *parts) == want


def test_is_uri_and_basename() -> None:
    assert storage.is_uri("s3://b/x") and storage.is_uri("file:///x")
    assert not storage.is_uri("/a/b") and not storage.is_uri("a/s3://b")
    assert storage.basename("s3://b/data/ds1/?scheme=http") == "ds1"
    assert storage.basename("s3://bucket") == "bucket"
    assert storage.basename("/x/ds2/") == "ds2"
    assert storage.display("s3://key:secret@b/x?scheme=http") == "s3://b/x?scheme=http"


def test_resolve_local_and_file_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.fs as pafs

    monkeypatch.chdir(tmp_path)
    fs, p = storage.resolve("runs/a")
    assert isinstance(fs, pafs.LocalFileSystem) and p == str(tmp_path / "runs" / "a")
    fs, p = storage.resolve(f"file://{tmp_path}/b")
    assert isinstance(fs, pafs.LocalFileSystem) and p == f"{tmp_path}/b"
    storage.write_text(f"file://{tmp_path}/b/c.txt", "via uri")
    assert (tmp_path / "b" / "c.txt").read_text() == "via uri"


@pytest.mark.parametrize("uri", ["hdfs://nn/x", "http://host/x", "az://c/x", "mock://x"])
def test_unsupported_scheme(uri: str) -> None:
    with pytest.raises(StorageError) as e:
        storage.resolve(uri)
    msg = str(e.value)
    assert uri in msg and uri.split("://")[0] in msg
    for allowed in ("s3://", "gs://", "gcs://", "file://", "local"):
        assert allowed in msg


def test_bad_s3_option_names_uri() -> None:
    with pytest.raises(StorageError, match=r"s3://b/x\?bogus=1.*bogus"):
        storage.resolve("s3://b/x?bogus=1")


# ---------------------------------------------------------------------------------------------
# Files and directories.


def test_round_trip(base: str) -> None:
    blob = bytes(range(256)) * 3
    assert not storage.exists(base)
    assert storage.list_dir(base) == []
    storage.write_text(storage.join(base, "run", "a.txt"), "héllo\n")
    storage.write_bytes(storage.join(base, "run", "b.bin"), blob)
    storage.write_bytes(storage.join(base, "run", "empty"), b"")
    assert storage.read_text(storage.join(base, "run", "a.txt")) == "héllo\n"
    assert storage.read_bytes(storage.join(base, "run", "b.bin")) == blob
    assert storage.read_bytes(storage.join(base, "run", "empty")) == b""
    storage.write_text(storage.join(base, "run", "a.txt"), "second")  # overwrite
    assert storage.read_text(storage.join(base, "run", "a.txt")) == "second"
    assert storage.exists(base) and storage.is_dir(storage.join(base, "run"))
    assert storage.list_dir(base) == ["run"]
    assert storage.list_dir(storage.join(base, "run")) == ["a.txt", "b.bin", "empty"]
    storage.makedirs(storage.join(base, "deep", "er"))
    assert storage.is_dir(storage.join(base, "deep", "er"))

    missing = storage.join(base, "run", "nope.txt")
    assert not storage.exists(missing)
    with pytest.raises(StorageError, match=r"/run/nope\.txt(\?\S*)? not found"):
        storage.read_text(missing)
    with pytest.raises(StorageError, match="directory"):
        storage.read_bytes(storage.join(base, "run"))

    storage.delete_dir(storage.join(base, "run"))
    assert not storage.exists(storage.join(base, "run", "a.txt"))
    assert storage.list_dir(storage.join(base, "run")) == []
    storage.delete_dir(storage.join(base, "run"))  # missing: no error


def test_local_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "metrics.json"
    storage.write_text(str(target), "old")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(StorageError, match="metrics.json.*disk full"):
        storage.write_text(str(target), "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["metrics.json"]  # no temporary file left behind


def test_missing_bucket_is_a_storage_error(s3_uri: str) -> None:
    query = s3_uri.split("?", 1)[1]
    uri = f"s3://no-such-bucket/x/a.txt?{query}"
    with pytest.raises(StorageError, match="s3://no-such-bucket/x/a.txt"):
        storage.write_text(uri, "x")
    with pytest.raises(StorageError, match="not found"):
        storage.read_text(uri)


def test_upload_download_dir(base: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    rng = np.random.default_rng(0)
    (src / "a.bin").write_bytes(rng.bytes(300_000))
    (src / "sub" / "b.txt").write_text("b")
    (src / "sub" / "deeper" / "c.npy").write_bytes(rng.bytes(1000))
    dest = storage.join(base, "tree")
    storage.upload_dir(src, dest)
    assert storage.list_dir(dest) == ["a.bin", "sub"]
    assert storage.read_text(storage.join(dest, "sub", "b.txt")) == "b"
    back = tmp_path / "back"
    storage.download_dir(dest, back)
    assert _tree(back) == _tree(src)

    sha = storage.download_file(storage.join(dest, "a.bin"), tmp_path / "one" / "a.bin")
    assert sha == _sha(src / "a.bin") == _sha(tmp_path / "one" / "a.bin")
    assert os.listdir(tmp_path / "one") == ["a.bin"]
    with pytest.raises(StorageError, match="not found"):
        storage.download_dir(storage.join(base, "nothing"), tmp_path / "x")
    with pytest.raises(StorageError, match="not a local directory"):
        storage.upload_dir(tmp_path / "nothing", dest)


def test_mirror_local_dest_is_used_directly(tmp_path: Path) -> None:
    with storage.LocalMirror(str(tmp_path / "run")) as m:
        assert m.local == tmp_path / "run" and not m.remote
        (m.local / "metrics.csv").write_text("epoch\n")
        assert m.sync() == []
    assert (tmp_path / "run" / "metrics.csv").read_text() == "epoch\n"


def test_mirror_syncs_changed_files(s3_uri: str, tmp_path: Path) -> None:
    dest = storage.join(s3_uri, "run")
    m = storage.LocalMirror(dest, cache_dir=tmp_path / "cache")
    assert m.remote and m.local.parent == tmp_path / "cache"
    (m.local / "metrics.csv").write_text("epoch,loss\n0,1.0\n")
    (m.local / "tb").mkdir()
    (m.local / "tb" / "events.out").write_bytes(b"\x00\x01")
    assert m.sync() == ["metrics.csv", "tb/events.out"]
    assert m.sync() == []  # nothing changed
    with open(m.local / "metrics.csv", "a") as f:
        f.write("1,0.5\n")
    assert m.sync() == ["metrics.csv"]
    assert storage.read_text(storage.join(dest, "metrics.csv")) == "epoch,loss\n0,1.0\n1,0.5\n"
    assert storage.read_bytes(storage.join(dest, "tb", "events.out")) == b"\x00\x01"
    (m.local / "report.md").write_text("# r")
    m.close()  # final sync, temporary dir removed
    assert not m.local.exists()
    assert storage.read_text(storage.join(dest, "report.md")) == "# r"

    with storage.LocalMirror(dest, pull=True) as again:  # a resumed run appends
        assert (again.local / "metrics.csv").read_text().endswith("1,0.5\n")
        assert again.sync() == []
        with open(again.local / "metrics.csv", "a") as f:
            f.write("2,0.25\n")
    assert storage.read_text(storage.join(dest, "metrics.csv")).endswith("1,0.5\n2,0.25\n")


# ---------------------------------------------------------------------------------------------
# Staging.


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small dataset dir with the manifest fields preprocessing writes (sha256, digest)."""
    root = synthetic_dataset(tmp_path_factory.mktemp("src") / "tiny", classes=2,
                             train_per_class=6, val_per_class=2, size=8, caption_dim=4)
    m = json.loads((root / MANIFEST).read_text())
    for split in m["splits"].values():
        split["sha256"] = _sha(root / split["file"])
    m["splits"]["test"] = {"file": "test.beton", "samples": 0, "sha256": None}  # no file
    m["params_digest"] = hashlib.sha256(b"tiny params").hexdigest()
    (root / MANIFEST).write_text(json.dumps(m))
    return root


@pytest.fixture
def src_copy(dataset: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(dataset, tmp_path / "tiny"))


def _check_staged(staged: Path, src: Path) -> None:
    want = _tree(src)
    got = {k: v for k, v in _tree(staged).items() if k != staging.MARKER}
    assert got == want
    info = DatasetInfo.load(staged)
    assert info.root == staged and info.splits == {"train": 12, "val": 4, "test": 0}
    assert info.split_file("train") == staged / "train.beton"
    sim = info.class_similarity()
    assert sim is not None and sim.shape == (2, 2)


def test_stage_local(dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    r = staging.stage_dataset_report(str(dataset), cache)
    digest = json.loads((dataset / MANIFEST).read_text())["params_digest"]
    assert r.path == cache / f"tiny-{digest[:12]}"
    assert r.copied and r.files == 4
    assert r.bytes_copied == sum(len(b) for b in _tree(dataset).values())
    _check_staged(r.path, dataset)

    mtime = (r.path / "train.beton").stat().st_mtime_ns
    again = staging.stage_dataset_report(dataset, cache)
    assert again.path == r.path and not again.copied and again.bytes_copied == 0
    assert (r.path / "train.beton").stat().st_mtime_ns == mtime
    assert staging.stage_dataset(dataset, cache) == r.path


def test_stage_default_cache_dir(dataset: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(staging.STAGE_ENV, str(tmp_path / "node"))
    assert staging.stage_dataset(dataset).parent == tmp_path / "node"


def test_stage_from_s3(dataset: Path, s3_uri: str, tmp_path: Path) -> None:
    src = storage.join(s3_uri, "datasets", "tiny")
    storage.upload_dir(dataset, src)
    r = staging.stage_dataset_report(src, tmp_path / "cache")
    assert r.copied and r.path.name.startswith("tiny-")
    _check_staged(r.path, dataset)
    assert not staging.stage_dataset_report(src, tmp_path / "cache").copied


def test_dataset_info_reads_only_the_manifest_of_a_uri(dataset: Path, s3_uri: str,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from components.data.reader import DatasetInfo

    monkeypatch.setenv(staging.STAGE_ENV, str(tmp_path / "cache"))
    src = storage.join(s3_uri, "datasets", "tiny")
    storage.upload_dir(dataset, src)
    remote, local = staging.dataset_info(src), DatasetInfo.load(dataset)
    assert (remote.classes, remote.splits, remote.caption_dim) == (
        local.classes, local.splits, local.caption_dim)
    np.testing.assert_array_equal(remote.class_similarity(), local.class_similarity())
    fetched = {p.name for p in remote.root.iterdir()}
    assert not any(n.endswith(".beton") for n in fetched), fetched  # no split was copied
    assert staging.local_dataset(dataset, stage=False) == dataset  # a local dir: in place
    assert staging.local_dataset(src, stage=False).parent == tmp_path / "cache"  # URI: staged


def test_stage_redoes_incomplete_copy(dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = staging.stage_dataset(dataset, cache)
    (path / staging.MARKER).unlink()  # a copy killed before its marker
    (path / "val.beton").unlink()
    r = staging.stage_dataset_report(dataset, cache)
    assert r.copied and r.path == path
    _check_staged(path, dataset)

    with open(path / "train.beton", "r+b") as f:  # a file cut short after staging
        f.truncate(100)
    assert staging.stage_dataset_report(dataset, cache).copied
    _check_staged(path, dataset)


def test_stage_recopies_a_staged_file_rewritten_with_its_size_and_mtime(
        dataset: Path, tmp_path: Path) -> None:
    """Issue 39 item 4: a staged train.beton changed in place with the same size (and its mtime
    put back, as rsync -t / tar do) is not trained on: the copy is redone and verified."""
    import os
    import time

    cache = tmp_path / "cache"
    path = staging.stage_dataset(dataset, cache)
    f = path / "train.beton"
    st, data = f.stat(), bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    time.sleep(0.01)
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    r = staging.stage_dataset_report(dataset, cache)
    assert r.copied and r.path == path
    _check_staged(path, dataset)  # the source's bytes again
    assert not staging.stage_dataset_report(dataset, cache).copied  # and reused from then on


def test_stage_recopies_when_source_manifest_changes(src_copy: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = staging.stage_dataset(src_copy, cache)
    m = json.loads((src_copy / MANIFEST).read_text())
    m["created"] = "later"  # same params_digest, another manifest
    (src_copy / MANIFEST).write_text(json.dumps(m))
    r = staging.stage_dataset_report(src_copy, cache)
    assert r.copied and r.path == first
    assert json.loads((first / MANIFEST).read_text())["created"] == "later"


def test_stage_corrupted_source_names_file(dataset: Path, s3_uri: str, tmp_path: Path) -> None:
    src = storage.join(s3_uri, "tiny")
    storage.upload_dir(dataset, src)
    beton = storage.join(src, "train.beton")
    data = bytearray(storage.read_bytes(beton))
    data[len(data) // 2] ^= 0xFF
    storage.write_bytes(beton, bytes(data))
    want = _sha(dataset / "train.beton")
    got = hashlib.sha256(data).hexdigest()
    with pytest.raises(DatasetError) as e:
        staging.stage_dataset(src, tmp_path / "cache")
    msg = str(e.value)
    assert "train.beton" in msg and want in msg and got in msg
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []  # the partial copy is gone


def test_stage_refuses_unfinished_dataset(src_copy: Path, tmp_path: Path) -> None:
    m = json.loads((src_copy / MANIFEST).read_text())
    m["complete"] = False
    (src_copy / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(DatasetError, match="not a complete"):
        staging.stage_dataset(src_copy, tmp_path / "cache")
    (src_copy / MANIFEST).unlink()
    with pytest.raises(DatasetError, match="has no manifest.json"):
        staging.stage_dataset(src_copy, tmp_path / "cache")
    with pytest.raises(DatasetError, match="has no manifest.json"):
        staging.stage_dataset(tmp_path / "does-not-exist", tmp_path / "cache")


def test_stage_missing_file_named(src_copy: Path, tmp_path: Path) -> None:
    (src_copy / "class_similarity.npy").unlink()
    with pytest.raises(DatasetError, match="class_similarity.npy.*not found"):
        staging.stage_dataset(src_copy, tmp_path / "cache")


_WORKER = """
import json, os, sys, time
from pathlib import Path
from components.data import staging
Path(sys.argv[3]).touch()  # imported: ready
while not os.path.exists(sys.argv[4]):
    time.sleep(0.005)
r = staging.stage_dataset_report(sys.argv[1], sys.argv[2])
print(json.dumps({"path": str(r.path), "copied": r.copied, "bytes": r.bytes_copied}))
"""


@pytest.mark.slow  # three interpreters importing torch: 6 s on 2 idle cores
def test_stage_concurrent_processes_copy_once(dataset: Path, s3_uri: str, tmp_path: Path) -> None:
    src = storage.join(s3_uri, "tiny")
    storage.upload_dir(dataset, src)
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, src, str(cache),
                          str(tmp_path / f"ready{i}"), str(go)],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for i in range(3)
    ]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(3)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        go.touch()  # all three call stage_dataset together
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["copied"] for r in reports) == [False, False, True]
    assert len({r["path"] for r in reports}) == 1
    assert sum(r["bytes"] for r in reports) == sum(len(b) for b in _tree(dataset).values())
    _check_staged(Path(reports[0]["path"]), dataset)
