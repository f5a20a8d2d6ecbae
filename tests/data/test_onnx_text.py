"""``captions.backend`` onnx / onnx-int8 / openvino / openvino-bf16
(components/data/onnx_text.py): the exported encoder agrees with the sentence-transformers
reference — float32 to 1e-4 in cosine, int8 to 0.99 mean / 0.95 min cosine, bfloat16 to 0.999
for every caption, and X-CLR's caption target rows to a small KL — tokenizes exactly as
transformers does, exports once into its cache and then loads without torch, and refuses
pipelines it cannot reproduce, slow-only tokenizers and bfloat16 on CPUs without it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from components.data import captions as cap
from components.data.onnx_text import OnnxEncoderError, _check_pipeline, cache_dir

ROOT = Path(__file__).resolve().parents[2]


def _has_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")

# Captions of the kind users bring (Tux Paint stamps' style; not installed in CI).
CAPTIONS = [
    "A US 25 cent piece called a quarter.", "A red apple.", "A bunch of yellow bananas.",
    "A brown horse running in a field.", "A small grey mouse.", "A black and white cow.",
    "A green frog sitting on a lily pad.", "A blue whale, the largest animal on earth.",
    "An orange cat sleeping.", "A dog wagging its tail.", "A pair of blue jeans.",
    "A woolly winter hat.", "A red sports car.", "A yellow school bus.", "A steam locomotive.",
    "A sailing boat on the sea.", "An airplane in the sky.", "A hot air balloon.",
    "A slice of pepperoni pizza.", "A chocolate birthday cake with candles.",
    "A cup of hot coffee.", "A loaf of bread.", "A carrot.", "A head of broccoli.",
    "A snowman with a carrot nose.", "A lightning bolt.", "A tornado.", "A rainbow.",
    "A sunflower.", "A pine tree.", "A red rose.", "A cactus in the desert.",
    "A soccer ball.", "A tennis racket.", "A guitar.", "A violin.", "A drum.",
    "A hammer.", "A screwdriver.", "A star.", "A heart.", "The flag of Canada.",
    "A stethoscope.", "A bandage.", "A knight in armour.", "A castle with towers.",
    "An astronaut on the moon.", "A rocket taking off.", "The planet Saturn with its rings.",
    "A penguin on the ice.",
]


def _target_rows(e: np.ndarray, tau_s: float) -> np.ndarray:
    g = e @ e.T / tau_s
    np.fill_diagonal(g, -np.inf)
    g -= g.max(1, keepdims=True)
    p = np.exp(g)
    return p / p.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return cap.embed(cap.load_encoder(cap.DEFAULT_MODEL), CAPTIONS)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMGRAPH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("backend, mean_cos, min_cos, max_kl", [
    ("onnx", 0.9999, 0.9999, 1e-4),
    ("onnx-int8", 0.99, 0.95, 0.02),  # measured on 805 Tux Paint captions: 0.992 / 0.963 / 0.008
    ("openvino", 0.9999, 0.9999, 1e-4),
    ("openvino-bf16", 0.999, 0.999, 1e-3),  # measured: 1.0000 / 0.9999 / 0.0000
])
def test_fast_backend_agrees_with_the_reference(reference: np.ndarray, backend: str,
                                                mean_cos: float, min_cos: float,
                                                max_kl: float) -> None:
    if backend == "openvino-bf16" and not _has_bf16():
        pytest.skip("this CPU has no bfloat16 instructions (AVX512_BF16 or AMX)")
    model = cap.load_encoder(cap.DEFAULT_MODEL, backend=backend)
    assert cap.embedding_dim(model) == 384
    got = cap.embed(model, CAPTIONS, batch_size=16)  # several length-sorted batches
    assert got.shape == reference.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = (got * reference).sum(1)
    assert cos.mean() >= mean_cos and cos.min() >= min_cos, (cos.mean(), cos.min())
    p, q = _target_rows(reference, 0.1), _target_rows(got, 0.1)
    kl = np.where(p > 0, p * (np.log(np.maximum(p, 1e-30)) - np.log(np.maximum(q, 1e-30))),
                  0.0).sum(1)
    assert kl.mean() <= max_kl, kl.mean()
    # the same texts in another order and batch size: the same rows in float32; int8 scales
    # its activations per batch (dynamic quantisation), so a row moves a little with its batch
    again = cap.embed(model, CAPTIONS[::-1], batch_size=7)[::-1]
    if backend in ("onnx", "openvino"):
        np.testing.assert_allclose(again, got, atol=1e-5)
    else:
        assert (again * got).sum(1).min() >= (0.98 if backend == "onnx-int8" else 0.999)
    assert cap.token_counts(model, ["a cat"]).tolist() == [4]  # [CLS] a cat [SEP]


def test_export_is_cached() -> None:
    cap.load_encoder(cap.DEFAULT_MODEL, backend="onnx")
    files = sorted(f for name in ("model.onnx", "tokenizer.json", "encoder.json")
                   for f in cache_dir().rglob(name))
    assert len(files) >= 3, f"no complete cached export: {files}"
    stamp = {f: f.stat().st_mtime_ns for f in files}
    cap.load_encoder(cap.DEFAULT_MODEL, backend="onnx")
    assert {f: f.stat().st_mtime_ns for f in files} == stamp
    assert not [f for f in files[0].parent.iterdir() if "float32" in f.name or ".tmp" in f.name]


# Empty, accented, CJK, emoji, and longer than the 256-token window (truncated).
TOKENIZER_TEXTS = [*CAPTIONS[:5], "", "Ünïcödé café — naïve résumé", "日本語のキャプション",
                   "a cat 🐈 on a mat", "a very long caption " * 80, "word " * 300]


def test_tokens_are_those_of_the_reference_tokenizer() -> None:
    """The ONNX encoder tokenizes with ``tokenizers`` alone: the same ids, mask and type ids as
    sentence-transformers' ``tokenizer(texts, padding=True, truncation=True,
    max_length=max_seq_length)``, and the same untruncated counts."""
    ref = cap.load_encoder(cap.DEFAULT_MODEL)
    model = cap.load_encoder(cap.DEFAULT_MODEL, backend="onnx")
    assert model.max_seq_length == ref.max_seq_length == 256
    want = ref.tokenizer(TOKENIZER_TEXTS, padding=True, truncation=True,
                         max_length=ref.max_seq_length, return_tensors="np")
    got = model._tokenizer.encode_batch(TOKENIZER_TEXTS)
    assert len(got[0].ids) == 256  # padded to the longest, which was truncated to the window
    for key, attr in (("input_ids", "ids"), ("attention_mask", "attention_mask"),
                      ("token_type_ids", "type_ids")):
        np.testing.assert_array_equal(np.array([getattr(e, attr) for e in got]), want[key])
    counts = cap.token_counts(model, TOKENIZER_TEXTS, batch_size=3).tolist()  # batched
    assert counts == cap.token_counts(ref, TOKENIZER_TEXTS).tolist()
    assert counts[5] == 2 and counts[-1] == 302  # [CLS] [SEP]; 300 words, not truncated


def test_a_cached_export_loads_without_torch() -> None:
    """A caption actor starting from the cache imports neither torch nor transformers (the
    seconds that made up most of an actor's start-up), and embeds as the first load did."""
    first = cap.embed(cap.load_encoder(cap.DEFAULT_MODEL, backend="onnx"), CAPTIONS[:4])
    code = ("import sys, numpy as np; from components.data import captions as cap; "
            "m = cap.load_encoder(cap.DEFAULT_MODEL, backend='onnx'); "
            "np.save(sys.argv[1], cap.embed(m, sys.argv[2:])); "
            "print(sorted(k for k in ('torch', 'transformers', 'sentence_transformers') "
            "if k in sys.modules))")
    out = Path(cache_dir()) / "embedded.npy"
    got = subprocess.run([sys.executable, "-c", code, str(out), *CAPTIONS[:4]],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "SIMGRAPH_CACHE_DIR": str(cache_dir())})
    assert got.stdout.strip() == "[]", got.stdout + got.stderr
    np.testing.assert_allclose(np.load(out), first, atol=1e-6)


def test_the_caption_actor_runs_an_onnx_backend(reference: np.ndarray) -> None:
    """What each Ray Data caption actor does (``build.embed_captions``), in this process."""
    actor = cap.CaptionEmbedder(cap.DEFAULT_MODEL, backend="onnx")
    ids = np.arange(len(CAPTIONS))[::-1].copy()
    got = actor({"caption_id": ids, "text": np.array(CAPTIONS[::-1], dtype=object)})
    np.testing.assert_array_equal(got["caption_id"], ids)
    assert ((got["embedding"][::-1] * reference).sum(1) >= 0.9999).all()


# Stand-ins for sentence-transformers modules: the pipeline check reads their class names.
class Transformer:
    pass


class Pooling(SimpleNamespace):
    pass


class Normalize:
    pass


def test_unsupported_pipelines_are_refused() -> None:
    assert _check_pipeline([Transformer(), Pooling(pooling_mode="mean"), Normalize()])
    assert not _check_pipeline([Transformer(), Pooling(pooling_mode="mean")])
    with pytest.raises(OnnxEncoderError, match="use captions.backend: torch"):
        _check_pipeline([Transformer(), Pooling(pooling_mode="cls"), Normalize()])
    with pytest.raises(OnnxEncoderError, match="Transformer → Pooling → Dense"):
        _check_pipeline([Transformer(), Pooling(pooling_mode="mean"), type("Dense", (), {})()])


@pytest.mark.parametrize("is_fast, pad_token, problem", [
    (False, "[PAD]", "fast version (tokenizer.json)"),
    (True, None, "padding token"),
])
def test_a_tokenizer_the_runtime_cannot_reproduce_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, is_fast: bool, pad_token: str | None,
        problem: str) -> None:
    class SlowTokenizer(SimpleNamespace):
        pass

    class Model(list):  # type: ignore[type-arg]
        tokenizer = SlowTokenizer(is_fast=is_fast, pad_token=pad_token)

    (tmp_path / "modules.json").write_text("[]")  # a model folder of its own (cache key)
    monkeypatch.setattr(cap, "sentence_transformer", lambda path, device: Model(
        [Transformer(), Pooling(pooling_mode="mean"), Normalize()]))
    before = set(cache_dir().glob("onnx/*"))
    with pytest.raises(cap.CaptionError, match=r"captions.backend=onnx: the model's tokenizer "
                                               r"\(SlowTokenizer\) has no "
                                               + re.escape(problem)
                                               + r": use captions.backend: torch"):
        cap.load_encoder(str(tmp_path), backend="onnx")
    assert set(cache_dir().glob("onnx/*")) == before  # nothing exported or half-written


def test_openvino_bf16_is_refused_without_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    import openvino as ov

    real = ov.Core.get_property

    def without_bf16(self: ov.Core, *args: object) -> object:
        got = real(self, *args)
        return [c for c in got if c != "BF16"] if args[1:] == ("OPTIMIZATION_CAPABILITIES",) \
            else got

    monkeypatch.setattr(ov.Core, "get_property", without_bf16)
    with pytest.raises(cap.CaptionError, match=r"openvino-bf16 needs a CPU with bfloat16 "
                                               r"instructions .*use openvino \(float32\)"):
        cap.load_encoder(cap.DEFAULT_MODEL, backend="openvino-bf16")


def test_unknown_backend_is_a_config_error() -> None:
    from components.config import CaptionConfig, ConfigError

    with pytest.raises(ConfigError, match="captions.backend='gpu' is not allowed: choose one "
                                          "of auto, torch, onnx, onnx-int8, openvino, "
                                          "openvino-bf16"):
        CaptionConfig(backend="gpu")  # type: ignore[arg-type]
