"""``captions.backend: auto`` (the default): the fastest caption backend that gives the
reference embeddings on the machine the build runs on.

The reference is sentence-transformers on PyTorch (``torch``). The exported backends
(``components/data/onnx_text.py``) run the same model 1.4–3× faster on CPU
(docs/benchmarks.md, "Caption backends"): ``openvino-bf16`` (bfloat16 arithmetic; only on
CPUs with bfloat16 instructions) and ``openvino`` (float32). Whether one gives the reference
embeddings depends on the CPU and the library versions, so ``auto`` checks it per build: the
candidates, fastest first, embed a probe of the build's own captions (up to :data:`PROBE`:
the longest ones — where bfloat16 error accumulates most — and an even spread of the rest)
and the first whose every probe embedding has cosine ≥ :data:`MIN_COSINE` with the
reference's is used; else the reference itself. With a GPU in the Ray cluster the reference
runs there and is chosen directly. ``onnx`` (float32, slower than ``openvino`` here) and
``onnx-int8`` (not the reference embeddings: cosine ≈ 0.99) are never chosen; name them to
use them.

A dataset's identity does not change with the choice: ``auto`` builds are built with the
reference's parameters (``components.data.build.planning._params`` drops the backend for
``torch`` and ``auto``), so datasets built with the old default ``torch`` keep resuming and
evaluating. The manifest's ``encoder`` section records the backend used and its check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

AUTO = "auto"
Chosen = Literal["openvino-bf16", "openvino", "torch"]
CANDIDATES: tuple[Chosen, ...] = ("openvino-bf16", "openvino")  # fastest first
MIN_COSINE = 0.9999  # every probe caption, against the reference
PROBE = 256  # captions checked per build
LONGEST = 64  # of which the longest ones


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackendChoice:
    """What ``auto`` chose and why.

    Attributes:
        backend: the backend the caption stage runs (``openvino-bf16``, ``openvino`` or
            ``torch``).
        reason: one line for the console and the manifest.
        min_cosine: the chosen exported backend's lowest probe cosine to the reference
            (``None`` for the reference itself).
        probe: captions checked.
        rejected: each candidate tried before it, with why it was not taken.
    """

    backend: Chosen
    reason: str
    min_cosine: float | None
    probe: int
    rejected: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reference_or(backend: str) -> str:
    """The backend an encoder is loaded with before ``auto`` is resolved: the reference
    (``torch``) for ``auto`` (it also checks the candidates), else ``backend`` itself."""
    return "torch" if backend == AUTO else backend


def probe_texts(texts: Sequence[str], n: int = PROBE) -> list[str]:
    """Up to ``n`` of ``texts``, deterministic: the :data:`LONGEST` longest, then an even
    spread over the rest in their order."""
    if len(texts) <= n:
        return list(texts)
    # as arrays (a build's every unique caption: no tuple or int object per text)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    longest = np.argsort(-lengths, kind="stable")[:LONGEST]  # ties: the earlier text first
    del lengths
    rest = np.ones(len(texts), dtype=bool)
    rest[longest] = False
    left = np.flatnonzero(rest)
    del rest
    step = len(left) / (n - len(longest))
    spread = left[[int(j * step) for j in range(n - len(longest))]]
    return [texts[i] for i in [*longest.tolist(), *spread.tolist()]]


def choose(model: str, texts: Sequence[str], reference: Any, gpu: bool = False,
           load: Callable[[str, str], Any] | None = None) -> BackendChoice:
    """The backend ``captions.backend: auto`` runs for a build of ``texts`` with ``model``.

    Args:
        model: ``captions.model``.
        texts: the build's unique captions (a probe of them is embedded by each candidate).
        reference: the loaded reference encoder (``torch``), already needed for the class
            embeddings.
        gpu: the cluster has a GPU: the reference runs there.
        load: ``(model, backend) -> encoder`` (default ``captions.load_encoder``); a
            candidate that cannot load (no bfloat16 on this CPU, OpenVINO missing, a model
            pipeline the export does not support) is skipped with its reason.
    """
    from components.data import captions as cap

    if gpu:
        return BackendChoice(backend="torch",
                             reason="a GPU is in the cluster: the reference runs there",
                             min_cosine=None, probe=0, rejected={})
    probe = probe_texts(texts)
    if not probe:
        return BackendChoice(backend="torch", reason="no captions to check", min_cosine=None,
                             probe=0, rejected={})
    load = load or (lambda m, b: cap.load_encoder(m, backend=b))
    want = cap.normalise_rows(cap.embed(reference, probe)).astype(np.float64)
    rejected: dict[str, str] = {}
    for backend in CANDIDATES:
        try:
            encoder = load(model, backend)
        except (cap.CaptionError, ImportError, OSError, RuntimeError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            rejected[backend] = f"cannot run here: {why}"
            continue
        got = cap.normalise_rows(cap.embed(encoder, probe)).astype(np.float64)
        cos = float(np.min(np.sum(got * want, axis=1)))
        if cos >= MIN_COSINE:
            return BackendChoice(backend=backend,
                                 reason=f"every one of {len(probe)} probe captions has "
                                 f"cosine >= {MIN_COSINE} to the reference (lowest {cos:.6f})",
                                 min_cosine=cos, probe=len(probe), rejected=rejected)
        rejected[backend] = f"lowest probe cosine {cos:.6f} < {MIN_COSINE}"
    return BackendChoice(backend="torch",
                         reason="no faster backend gives the reference embeddings here",
                         min_cosine=None, probe=len(probe), rejected=rejected)
