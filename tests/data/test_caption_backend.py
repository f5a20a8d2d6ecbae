"""``captions.backend: auto`` (components/data/caption_backend.py): the fastest backend whose
embeddings of the build's captions match the reference's, checked per build; a dataset's
identity does not change with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from components.config import PreprocessConfig, from_dict
from components.data import captions as cap
from components.data.caption_backend import (
    LONGEST,
    MIN_COSINE,
    PROBE,
    choose,
    probe_texts,
)

TEXTS = [f"a photo of a {'very ' * (i % 7)}small thing number {i}" for i in range(600)]


class Fixed:
    """A stand-in encoder: each text's embedding is a fixed random unit vector, optionally
    tilted so its cosine to the untilted one is ``cos``."""

    def __init__(self, cos: float = 1.0) -> None:
        self.cos = cos

    def get_embedding_dimension(self) -> int:
        return 8

    def encode(self, texts: list[str], **_: Any) -> np.ndarray:
        out = []
        for t in texts:
            rng = np.random.default_rng(abs(hash(t)) % 2**32)
            v, w = rng.normal(size=8), rng.normal(size=8)
            v /= np.linalg.norm(v)
            w -= (w @ v) * v
            w /= np.linalg.norm(w)
            out.append(self.cos * v + np.sqrt(max(0.0, 1 - self.cos**2)) * w)
        return np.asarray(out, dtype=np.float32)


def test_probe_holds_the_longest_captions_and_a_spread() -> None:
    probe = probe_texts(TEXTS)
    assert len(probe) == PROBE and len(set(probe)) == PROBE and probe == probe_texts(TEXTS)
    longest = sorted(TEXTS, key=len, reverse=True)[:LONGEST]
    assert set(longest) <= set(probe)
    assert probe_texts(TEXTS[:10]) == TEXTS[:10]


def test_the_fastest_candidate_that_matches_is_chosen_else_the_reference() -> None:
    def loader(tilts: dict[str, Any]) -> Any:
        def load(_model: str, backend: str) -> Any:
            tilt = tilts[backend]
            if isinstance(tilt, Exception):
                raise tilt
            return Fixed(tilt)
        return load

    ok = choose("m", TEXTS, Fixed(), load=loader({"openvino-bf16": 0.99995,
                                                  "openvino": 1.0}))
    assert ok.backend == "openvino-bf16" and ok.probe == PROBE
    assert ok.min_cosine == pytest.approx(0.99995, abs=1e-6) and not ok.rejected
    # bf16 too far (or unavailable on this CPU): the float32 one.
    far = choose("m", TEXTS, Fixed(), load=loader({"openvino-bf16": 0.9995, "openvino": 1.0}))
    assert far.backend == "openvino"
    assert far.rejected == {"openvino-bf16": f"lowest probe cosine 0.999500 < {MIN_COSINE}"}
    none = choose("m", TEXTS, Fixed(), load=loader({
        "openvino-bf16": cap.CaptionError("needs a CPU with bfloat16 instructions"),
        "openvino": ImportError("No module named 'openvino'")}))
    assert none.backend == "torch" and none.min_cosine is None
    assert none.rejected["openvino-bf16"].endswith("needs a CPU with bfloat16 instructions")
    assert "openvino" in none.rejected["openvino"]
    assert choose("m", TEXTS, Fixed(), gpu=True, load=loader({})).backend == "torch"


@pytest.mark.slow
def test_on_this_machine_auto_picks_an_exact_openvino_backend() -> None:
    """The real candidates against the real reference (the machines of this project have
    OpenVINO; bfloat16 where the CPU has it)."""
    import openvino as ov

    reference = cap.load_encoder("default")
    got = choose("default", TEXTS, reference)
    bf16 = "BF16" in list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    assert got.backend == ("openvino-bf16" if bf16 else "openvino"), got
    assert got.min_cosine is not None and got.min_cosine >= MIN_COSINE


def test_auto_has_the_identity_of_the_old_default() -> None:
    """Datasets built with the old default (torch) keep resuming: auto builds digest the same
    build parameters; a named exported backend still counts."""
    from components.data.build.common import _digest
    from components.data.build.planning import _params

    def digest(**captions: Any) -> str:
        return _digest(_params(from_dict(PreprocessConfig, {
            "output": "/tmp/ds", "source": {"kind": "folder", "path": "/tmp/src"},
            "captions": captions})))

    assert from_dict(PreprocessConfig, {"output": "x", "source": {
        "kind": "folder", "path": "/tmp/src"}}).captions.backend == "auto"
    assert digest() == digest(backend="torch") == digest(backend="auto")
    assert digest(backend="onnx-int8") != digest()


def test_probe_texts_as_arrays_picks_what_the_sort_of_tuples_picked() -> None:
    """The probe's texts (the longest, then an even spread) are chosen on arrays — no tuple
    per caption at CC12M's 12M — and are the ones the sort of ``(-len, index)`` gave."""
    from components.data.caption_backend import LONGEST, PROBE, probe_texts

    def reference(texts: list[str], n: int) -> list[str]:
        if len(texts) <= n:
            return list(texts)
        by_length = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
        longest = by_length[:LONGEST]
        rest = [i for i in range(len(texts)) if i not in set(longest)]
        step = len(rest) / (n - len(longest))
        spread = [rest[int(j * step)] for j in range(n - len(longest))]
        return [texts[i] for i in [*longest, *spread]]

    rng = np.random.default_rng(0)
    for size in (5, PROBE, PROBE + 1, 3 * PROBE + 7, 5000):
        texts = ["x" * int(k) + str(i) for i, k in enumerate(rng.integers(0, 30, size))]
        for n in (PROBE, LONGEST + 3):
            assert probe_texts(texts, n) == reference(texts, n), (size, n)
