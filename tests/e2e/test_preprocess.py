"""``simgraph preprocess`` end to end on Ray Data: round trip, skips, resume after a kill."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.config import PreprocessConfig, from_dict
from components.data import captions as cap
from components.data.build.timing import STAGES
from components.data.images import decode_image
from components.data.shards import read_samples
from components.io.files import sha256_file as sha256
from pipelines.preprocess import PreprocessError, run
from tests.support.procs import kill_session, session_pids

ROOT = Path(__file__).resolve().parents[2]
# Manifest keys that say when a build ran and how long each stage took: two builds of the
# same source differ there only.
WHEN = {"created", "build_seconds"}


def _images(root: Path) -> dict[str, tuple[str, str | None]]:
    """A class-folder tree with every image kind and every bad kind; path -> (class, caption)."""
    rng = np.random.default_rng(0)
    made: dict[str, tuple[str, str | None]] = {}

    def save(cls: str, name: str, img: Image.Image, caption: str | None, **kw: object) -> None:
        d = root / cls
        d.mkdir(parents=True, exist_ok=True)
        img.save(d / name, **kw)
        if caption is not None:
            (d / name).with_suffix(".txt").write_text(caption + "\n")
        made[str(d / name)] = (cls, caption)

    def rgb(h: int, w: int) -> np.ndarray:  # smooth gradients + mild noise (JPEG-friendly)
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 200 / w, y * 200 / h, (x + y) * 100 / (h + w)], axis=-1)
        return np.clip(base + rng.integers(0, 16, (h, w, 3)), 0, 255).astype(np.uint8)

    save("cat", "rgb.png", Image.fromarray(rgb(20, 30)), "a striped cat")
    save("cat", "grey.png", Image.fromarray(rgb(24, 24)[:, :, 0]),
         "a grey cat")
    save("cat", "big.png", Image.fromarray(rgb(90, 45)), "a striped cat")  # same caption
    save("dog", "rgba.png", Image.fromarray(
        np.dstack([rgb(16, 16), rgb(16, 16)[:, :, 1]]), "RGBA"),
         "a dog")
    save("dog", "photo.jpg", Image.fromarray(rgb(32, 32)), None, quality=95)
    save("dog", "deep.png", Image.fromarray(
        rgb(18, 18)[:, :, 0].astype(np.uint16) * 257), "a deep dog")
    (root / "dog" / "notes.jpg").write_text("this is not an image")
    big = root / "dog" / "truncated.png"
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(big)
    big.write_bytes(big.read_bytes()[:1500])
    Image.fromarray(rgb(4, 40)).save(root / "cat" / "tiny.png")
    return made


def _cfg(tmp: Path, src: Path, **over: object) -> PreprocessConfig:
    data = {
        "output": str(tmp / "out"),
        "source": {"kind": "folder", "path": str(src)},
        "image": {"max_side": 40, "min_side": 8, "write_mode": "raw"},
        "split": {"val": 0.0, "test": 0.0},
        "shard_size": 2,
    }
    for k, v in over.items():
        section, _, key = k.partition("__")
        if key:
            data.setdefault(section, {})[key] = v  # type: ignore[index]
        else:
            data[section] = v
    return from_dict(PreprocessConfig, data)


@pytest.mark.slow
def test_round_trip_skips_and_rerun(tmp_path: Path, ray_local: None) -> None:
    src = tmp_path / "src"
    made = _images(src)
    cfg = _cfg(tmp_path, src)
    m = run(cfg, echo=False)
    out = Path(cfg.output)

    assert m["skipped"]["by_reason"] == {"not-an-image": 1, "corrupt-image": 1, "too-small": 1}
    assert m["splits"]["train"]["samples"] == len(made) == 6
    assert m["splits"]["train"]["per_class"] == {"cat": 3, "dog": 3}
    # The content pass skips the 3 bad items before the plan: 6 items in shards of 2.
    assert len(m["shards"]) == 3
    assert m["encoder"]["dim"] == 384 and m["fields"]["caption"]["dtype"] == "float16"
    check = m["encoder"]["backend_check"]  # what captions.backend: auto chose, and why
    assert m["encoder"]["backend"] == check["backend"] in ("openvino-bf16", "openvino", "torch")
    assert check["backend"] == "torch" or check["min_cosine"] >= 0.9999
    assert not list((out / "shards").glob("*.beton*"))  # merged, then removed

    # Round trip: exact pixels (raw), labels, ids; embeddings = the model's, same text same bytes.
    listed = sorted(str(p) for p in src.rglob("*") if p.suffix in (".png", ".jpg"))
    samples = read_samples(out / "train.beton")
    model = cap.load_encoder("default")
    by_caption: dict[str, bytes] = {}
    for s in samples:
        path = listed[s["sample_id"]]
        cls, caption = made[path]
        expect = decode_image(Path(path).read_bytes(), max_side=40, min_side=8)
        np.testing.assert_array_equal(s["image"], expect)
        assert m["classes"][s["label"]] == cls
        text = caption if caption is not None else f"a photo of a {cls}"
        ref = cap.embed(model, [text])[0]
        # The default backend (auto) promises the reference embeddings: cosine >= 0.9999
        # (float16 storage costs ~1e-7 of it).
        got = s["caption"].astype(np.float64)
        assert got @ ref / np.linalg.norm(got) >= 0.9999, text
        assert by_caption.setdefault(text, s["caption"].tobytes()) == s["caption"].tobytes()
    assert max(s["image"].shape[0] for s in samples) == 40  # big.png 90x45 -> 40x20
    sim = np.load(out / "class_similarity.npy")
    ce = np.load(out / "class_embeddings.npy")
    np.testing.assert_allclose(sim, ce @ ce.T, atol=1e-6)
    np.testing.assert_allclose(ce[0], cap.embed(model, ["a photo of a cat"])[0], atol=1e-5)

    # Re-run: nothing rebuilt, identical files; other parameters need --overwrite.
    before = sha256(out / "train.beton")
    stamp = (out / "train.beton").stat().st_mtime_ns
    run(cfg, echo=False)
    assert (out / "train.beton").stat().st_mtime_ns == stamp
    changed = _cfg(tmp_path, src, image__write_mode="jpg")
    with pytest.raises(PreprocessError, match="--overwrite"):
        run(changed, echo=False)
    m2 = run(changed, overwrite=True, echo=False)
    assert m2["params"]["image"]["write_mode"] == "jpg" and sha256(out / "train.beton") != before
    for s in read_samples(out / "train.beton"):
        expect = decode_image(Path(listed[s["sample_id"]]).read_bytes(), max_side=40, min_side=8)
        assert np.abs(s["image"].astype(int) - expect).mean() < 6  # JPEG quality 90


@pytest.mark.slow
def test_integrity_duplicates_captions_and_identical_rebuild(
    tmp_path: Path, ray_local: None
) -> None:
    """Issue 17: an exact copy under another name and folder is dropped and names the kept copy;
    a resized JPEG near duplicate shares its original's split; invalid UTF-8, empty and
    too-long captions are counted; a rebuild is byte-identical."""
    from tests.data.test_integrity import _collection

    src = tmp_path / "src"
    paths = _collection(src)
    (src / "cat" / "0.txt").write_bytes(b"un chat \xe0 rayures\n")  # Latin-1
    (src / "cat" / "1.txt").write_text(" \n")
    (src / "cat" / "2.txt").write_text("striped " * 300 + "\n")  # > 256 tokens
    cfg = _cfg(tmp_path, src, split={"val": 0.3, "test": 0.3, "seed": 1}, shard_size=4)
    m = run(cfg, echo=False)
    out = Path(cfg.output)

    by_reason = m["skipped"]["by_reason"]
    assert by_reason == {"duplicate-of": 2}, by_reason
    dup = {s["path"]: s for s in m["skipped"]["items"]}
    assert dup[str(paths["copy"])]["of"] == str(paths["cat3"])
    assert dup[str(paths["bmp"])]["of"] == str(paths["cat4"])
    total = sum(s["samples"] for s in m["splits"].values())
    assert total == 21
    nd = m["near_duplicates"]
    assert nd["groups"] >= 1 and nd["straddling_splits"]["pairs"] == 0
    group = next(g for g in nd["list"] if {x["path"] for x in g} >= {str(paths["cat5"])})
    assert {x["path"] for x in group} == {str(paths["cat5"]), str(paths["near"])}
    assert len({x["split"] for x in group}) == 1
    checks = m["caption_checks"]
    assert checks["by_reason"] == {"caption-encoding": 1, "caption-empty": 1,
                                   "caption-truncated": 1}, checks
    assert checks["max_seq_length"] == 256 and checks["skipped"] == {}
    texts = json.loads((out / "captions.json").read_text())
    assert max(texts["tokens"]) > 256 and len(texts["texts"]) == len(texts["tokens"])
    index = np.load(out / "caption_index.npy")
    assert index.shape == (21, 2)

    # Splits hold exactly the kept items, and the near duplicate sits with its original.
    ids = {split: {s["sample_id"] for s in read_samples(out / f"{split}.beton")}
           for split in ("train", "val", "test") if m["splits"][split]["samples"]}
    assert sum(len(v) for v in ids.values()) == 21

    # Same source, fresh dir: byte-identical files, same manifest but for when it was built
    # and each stage's seconds (every stage timed: components/data/build/timing.py).
    again = run(_cfg(tmp_path, src, split={"val": 0.3, "test": 0.3, "seed": 1}, shard_size=4,
                     output=str(tmp_path / "again")), echo=False)
    for name in sorted(p.name for p in out.iterdir() if p.is_file() and p.name != ".lock"):
        if name == "manifest.json":
            continue
        assert sha256(out / name) == sha256(tmp_path / "again" / name), name
    assert {k: v for k, v in again.items() if k not in WHEN} == {
        k: v for k, v in m.items() if k not in WHEN}
    assert list(m["build_seconds"]) == list(STAGES)
    assert all(m["build_seconds"][k] > 0 for k in ("hashing", "captions", "shards", "merge"))

    # simgraph inspect on the real thing: caption lengths, duplicates with thumbnails.
    from components.data.inspection import run as inspect

    text = inspect(str(out), per_class=3).read_text()
    for png in ("samples.png", "class_counts.png", "caption_lengths.png",
                "class_similarity.png", "near_duplicates.png"):
        assert (out / "inspect" / png).stat().st_size > 1000 and f"({png})" in text, png
    assert "1 images exceed the 256-token window" in text
    assert f"| {paths['copy']} | {paths['cat3']} |" in text
    assert "| caption-encoding | 1 | 0 |" in text


@pytest.mark.slow
def test_bad_input_error_policy_and_empty_result(tmp_path: Path, ray_local: None) -> None:
    src = tmp_path / "src"
    _images(src)
    with pytest.raises(PreprocessError, match=r"(notes|truncated|tiny)\..*bad_input=error"):
        run(_cfg(tmp_path, src, bad_input="error"), echo=False)
    bad = tmp_path / "bad" / "x"
    bad.mkdir(parents=True)
    (bad / "a.png").write_text("nope")
    with pytest.raises(PreprocessError, match="every item was skipped"):
        run(_cfg(tmp_path, tmp_path / "bad", output=str(tmp_path / "o2")), echo=False)


@pytest.mark.slow
def test_killed_run_resumes_to_identical_files(tmp_path: Path, ray_local: None) -> None:
    """SIGKILL the whole process tree mid-way, re-run: same bytes as an uninterrupted run.

    The killed build runs ``simgraph preprocess --verbose`` (nothing filtered) in a process of
    its own, through the caption actor pool before it is killed in the shard stage: its Ray core
    must not log "Actor with class name ... has constructor arguments in the object store and
    max_restarts > 0" (docs/ray-notes.md, "Ray Data"; Ray logs it once per process, so only a
    fresh process shows it)."""
    base = {"source": {"kind": "fashion-mnist", "max_per_class": 30},
            "image": {"max_side": 28, "min_side": 28}, "shard_size": 15, "keep_shards": True}
    whole = from_dict(PreprocessConfig, {**base, "output": str(tmp_path / "whole")})
    ref = run(whole, echo=False)

    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text(json.dumps({**base, "output": str(tmp_path / "killed")}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "preprocess", str(cfg_file), "--verbose"],
            cwd=ROOT, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
        )
    shards_dir = tmp_path / "killed" / "shards"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and len(list(shards_dir.glob("*.json"))) < 3:
            assert proc.poll() is None, "preprocess exited before it could be killed"
            time.sleep(0.05)
    finally:
        kill_session(proc.pid)
        proc.wait()
    assert not (tmp_path / "killed" / "manifest.json").exists(), "killed too late"
    written = len(list(shards_dir.glob("*.json")))
    assert 3 <= written < len(ref["shards"])
    assert not session_pids(proc.pid)
    said = log.read_text()
    assert (tmp_path / "killed" / "caption_embeddings.npy").exists(), said[-3000:]  # embedded
    assert "constructor arguments in the object store" not in said, said[-3000:]

    m = run(from_dict(PreprocessConfig, {**base, "output": str(tmp_path / "killed")}), echo=False)
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in ref["shards"]]
    for split in ("train", "val", "test"):
        assert m["splits"][split]["sha256"] == ref["splits"][split]["sha256"]
        assert m["splits"][split]["samples"] == ref["splits"][split]["samples"]
    assert not list(shards_dir.glob("*.tmp*"))  # the killed run's temporaries are gone


@pytest.mark.slow
def test_output_to_s3_matches_a_local_build(tmp_path: Path, ray_local: None, s3_uri: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from components.data.reader import MANIFEST, DatasetInfo
    from components.data.staging import stage_dataset
    from components.io import storage

    monkeypatch.setenv("SIMGRAPH_STAGE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    _images(src)
    local = run(_cfg(tmp_path, src), echo=False)
    uri = storage.join(s3_uri, "datasets", "cats")
    remote = run(_cfg(tmp_path, src, output=uri), echo=False)
    assert remote["splits"] == local["splits"]
    out = Path(_cfg(tmp_path, src).output)
    names = set(storage.list_dir(uri))
    assert MANIFEST in names and "shards" not in names  # merged shards are not uploaded
    for name in names - {MANIFEST}:
        assert storage.read_bytes(storage.join(uri, name)) == (out / name).read_bytes(), name
    uploaded = json.loads(storage.read_text(storage.join(uri, MANIFEST)))
    differ = {k for k in uploaded if uploaded[k] != local[k]}
    assert differ <= {*WHEN, "output"}, differ  # when / where built
    staged = stage_dataset(uri, tmp_path / "stage")
    info = DatasetInfo.load(staged)
    assert info.classes == ["cat", "dog"] and info.splits["train"] == 6


def test_a_dead_caption_actor_costs_only_the_captions_it_had_not_returned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ray does not restart caption actors (``max_restarts=0``): when one dies the stage runs
    again over the captions still missing, up to ``CAPTION_STAGE_RETRIES`` times, then fails
    with one line. Stand-in stages: batches of 2, the first run dies after one batch."""
    import ray.exceptions

    from components.data.build import embedding

    texts = [f"caption {i}" for i in range(5)]
    runs: list[list[int]] = []

    from components.data.captions import write_rows

    class Stage:  # as the actors do: rows written into the table file, ids handed back
        def __init__(self, ids: list[int], dies_after: int | None,
                     rows: tuple[str, int]) -> None:
            self.ids, self.dies_after, self.rows = ids, dies_after, rows

        def iter_batches(self, **_: object):  # type: ignore[no-untyped-def]
            for k, start in enumerate(range(0, len(self.ids), 2)):
                if k == self.dies_after:
                    raise ray.exceptions.ActorDiedError()
                ids = np.array(self.ids[start:start + 2])
                write_rows(*self.rows, ids, np.stack([np.full(3, i) for i in ids]))
                yield {"caption_id": ids}

    def stage(cfg: PreprocessConfig, texts_: list[str], ids: list[int],
              rows: tuple[str, int], placement: object) -> Stage:
        runs.append(ids)
        return Stage(ids, dies_after=1 if len(runs) == 1 else None, rows=rows)

    monkeypatch.setattr(embedding, "_embedding_stage", stage)
    cfg = _cfg(tmp_path, tmp_path / "src")  # its backend as the driver resolves auto:
    cfg = dataclasses.replace(cfg, captions=dataclasses.replace(cfg.captions, backend="torch"))
    table = embedding.embed_captions(cfg, texts, tmp_path, dim=3)
    emb = np.load(table.path)  # rows written where they belong, out of order
    assert emb.shape == (5, 3) and (table.rows, table.dim) == (5, 3)
    np.testing.assert_array_equal(emb, np.repeat(np.arange(5.0)[:, None], 3, axis=1))
    first = runs[0][:2]
    assert sorted(runs[0]) == list(range(5)) and sorted(runs[1]) == sorted(set(range(5)) -
                                                                          set(first))
    assert "a caption actor died (ActorDiedError); embedding the 3 captions left" in (
        capsys.readouterr().err)
    assert (tmp_path / "caption_embeddings.npy").exists()

    runs.clear()
    (tmp_path / "caption_embeddings.npy").unlink()
    def always_dies(cfg: PreprocessConfig, texts_: list[str], ids: list[int],
                    rows: tuple[str, int], placement: object) -> Stage:
        runs.append(ids)
        return Stage(ids, dies_after=0, rows=rows)

    monkeypatch.setattr(embedding, "_embedding_stage", always_dies)
    with pytest.raises(PreprocessError, match=r"a caption actor died \(ActorDiedError\), 4 "
                                              r"times; 0 of 5 captions were embedded"):
        embedding.embed_captions(cfg, texts, tmp_path, dim=3)
    assert len(runs) == embedding.CAPTION_STAGE_RETRIES + 1
    assert not (tmp_path / "caption_embeddings.npy").exists()
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name]  # no partial file left
