"""The caption table at web scale (components/data/build/embedding.py): the cache key and
``captions.json`` streamed byte for byte as the whole-document versions wrote them, the
embeddings written row by row to a file (out of order) and read back per shard, and an earlier
build's ``captions.npz`` taken over when its key matches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from components.config import PreprocessConfig, from_dict
from components.data.build import embedding
from components.data.build.common import _digest

TEXTS = ["a cat", 'a "quoted" dog', "ünïcödé ☃ caption", "back\\slash\nnewline", ""]


def _cfg(tmp_path: Path, backend: str) -> PreprocessConfig:
    return from_dict(PreprocessConfig, {"output": str(tmp_path), "source": {
        "kind": "fashion-mnist"}, "captions": {"backend": backend}})


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("texts", [TEXTS, [], ["one"]], ids=["five", "none", "one"])
def test_the_streamed_cache_key_is_the_whole_documents_digest(tmp_path: Path, backend: str,
                                                              texts: list[str]) -> None:
    """The key earlier builds stored for their ``captions.npz``: a re-run still matches."""
    cfg = _cfg(tmp_path, backend)
    want = _digest({"texts": texts, "model": cfg.captions.model,
                    **({} if backend == "torch" else {"backend": backend})})
    assert embedding.caption_cache_key(cfg, texts) == want
    assert embedding.caption_cache_key(cfg, [*texts, "more"]) != want


@pytest.mark.parametrize("texts", [TEXTS, [], ["one"]], ids=["five", "none", "one"])
def test_captions_json_is_written_as_json_dumps_wrote_it(tmp_path: Path,
                                                         texts: list[str]) -> None:
    tokens = np.arange(len(texts), dtype=np.int64) + 2
    data = {"model": "default", "max_seq_length": 256, "texts": texts,
            "tokens": tokens.tolist()}
    embedding.write_caption_texts(tmp_path / "captions.json", "default", 256, texts, tokens)
    assert (tmp_path / "captions.json").read_text(encoding="utf-8") == json.dumps(
        data, indent=1) + "\n"


def test_rows_land_where_they_belong_out_of_order(tmp_path: Path) -> None:
    """The stage returns rows in length order, in batches: each goes to its caption id's row of
    a ``.npy`` file, and a shard reads back only its own."""
    from components.data.captions import write_rows

    want = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    with open(tmp_path / "t.npy", "wb") as f:
        offset = embedding._table_file(f, 7, 4)
    assert np.load(tmp_path / "t.npy").shape == (7, 4)  # full size from the start (zeros)
    for ids in ([5, 0], [3], [6, 1, 4, 2]):  # as caption actors write them, each its own
        write_rows(str(tmp_path / "t.npy"), offset, np.array(ids), want[ids])
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), want)
    table = embedding.CaptionTable(tmp_path / "t.npy", 7, 4)
    np.testing.assert_array_equal(table.take(np.array([4, 4, 0])), want[[4, 4, 0]])


def test_an_earlier_builds_npz_is_taken_over_when_its_key_matches(tmp_path: Path) -> None:
    emb = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.savez(tmp_path / "captions.npz", key=np.array("k1"), embeddings=emb)
    assert embedding.cached_table(tmp_path, "other") is None  # another key: left alone
    assert (tmp_path / "captions.npz").exists()
    table = embedding.cached_table(tmp_path, "k1")
    assert table is not None and (table.rows, table.dim) == (3, 2)
    np.testing.assert_array_equal(np.load(table.path), emb)
    assert not (tmp_path / "captions.npz").exists()
    assert json.loads((tmp_path / embedding.EMBEDDINGS_KEY).read_text()) == {
        "key": "k1", "shape": [3, 2]}
    assert embedding.cached_table(tmp_path, "k1") == table  # now from the new file
    assert embedding.cached_table(tmp_path, "k2") is None
    assert embedding._stored_dim(tmp_path) == 2
