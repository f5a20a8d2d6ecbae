"""A sentence-transformers text encoder exported to ONNX and run by ONNX Runtime or OpenVINO
(``captions.backend``).

The caption stage of ``simgraph preprocess`` embeds every unique caption once; with
per-image captions (X-CLR's real use) that is millions of texts, and the PyTorch encoder does
a few hundred a second per CPU core. This runs the same model through ONNX Runtime or
OpenVINO (CPU):

* ``onnx``: the transformer exported to ONNX in float32 (``torch.onnx.export``): the same
  embeddings (cosine ≥ 0.9999 with the reference);
* ``onnx-int8``: the export with its weights quantised to int8 per output channel
  (``onnxruntime.quantization.quantize_dynamic``): faster, cosine ≈ 0.99 on real captions
  (docs/benchmarks.md gives the measured agreement and the X-CLR target-graph KL). Dynamic
  quantisation scales activations per batch, so a caption's embedding moves slightly (cosine
  ≥ 0.98) with the other captions of its batch: a rebuild is not bit-identical;
* ``openvino``: the float32 export compiled by OpenVINO in float32 (the same embeddings);
* ``openvino-bf16``: the float32 export run by OpenVINO with bfloat16 arithmetic (float32
  accumulation): about as fast as ``onnx-int8`` with every caption's cosine ≥ 0.999 (measured
  min 0.9999 on real captions), on CPUs with bfloat16 instructions (AVX512_BF16 or AMX);
  refused elsewhere, where OpenVINO would silently run float32 instead.

Texts are batched in order of length (less padding), in small batches (``BATCH``: 32–64 texts
ran 1.3–1.5× faster than 256 on a 2-core x86 VM, docs/benchmarks.md), and truncated at the model's
``max_seq_length``, then mean-pooled over the attention mask and L2-normalised — which is what
the supported models do (a ``Transformer`` → mean ``Pooling`` → optional ``Normalize``
sentence-transformers pipeline, e.g. all-MiniLM-L6-v2); other pipelines are refused.

The exported files (the ONNX graph, the model's fast tokenizer and its settings) are cached
under ``$SIMGRAPH_CACHE_DIR`` (default ``~/.cache/simgraph``)/``onnx/<digest>``, keyed by the
model folder's files, the variant and the torch / onnxruntime versions; each file is written
under a temporary name and renamed, so concurrent caption actors never read a partial file.
Only the export loads the model in PyTorch: a caption actor starting from the cache imports
neither torch nor transformers (5.5 → ~1 s per actor when two start at once on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from components.errors import SimgraphError
from components.io.files import replacing, stat_key, write_json

VARIANTS = ("onnx", "onnx-int8", "openvino", "openvino-bf16")
MODEL_FILE, TOKENIZER_FILE, ENCODER_FILE = "model.onnx", "tokenizer.json", "encoder.json"
# Texts per forward pass: the fastest measured (docs/benchmarks.md, "Caption backends").
BATCH = {"onnx": 32, "onnx-int8": 32, "openvino": 32, "openvino-bf16": 64}


class OnnxEncoderError(SimgraphError, ValueError):
    """The model cannot run on the ONNX backend (use ``captions.backend: torch``)."""


def cache_dir() -> Path:
    return Path(os.environ.get("SIMGRAPH_CACHE_DIR", Path.home() / ".cache" / "simgraph"))


def _model_digest(path: Path, variant: str) -> str:
    # package versions from their metadata: importing torch here would cost each caption actor
    # seconds (the point of reading a cached export)
    import importlib.metadata as md

    h = hashlib.sha256(f"{variant}|{md.version('torch')}|{md.version('onnxruntime')}".encode())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        # size, mtime_ns, inode, ctime_ns: a model replaced in place with its mtime kept
        # (rsync -t, tar) is another model
        key = "|".join(map(str, stat_key(f.stat())))
        h.update(f"{f.relative_to(path)}|{key}".encode())
    return h.hexdigest()[:16]


def _check_pipeline(st_model: Any) -> bool:
    """Whether the sentence-transformers pipeline is Transformer → mean Pooling [→ Normalize];
    returns whether it normalises."""
    names = [type(m).__name__ for m in st_model]
    ok = (len(names) in (2, 3) and names[0] == "Transformer" and names[1] == "Pooling"
          and (len(names) == 2 or names[2] == "Normalize"))
    pooling = st_model[1] if len(names) > 1 else None
    # sentence-transformers 6: pooling_mode "mean"; 5: pooling_mode_mean_tokens=True (alone)
    mode = getattr(pooling, "pooling_mode", None)
    mean = mode == "mean" if isinstance(mode, str) else (
        bool(getattr(pooling, "pooling_mode_mean_tokens", False))
        and sum(bool(getattr(pooling, a, False)) for a in dir(pooling)
                if a.startswith("pooling_mode_") and a.endswith("_tokens")) == 1)
    if not (ok and mean):
        raise OnnxEncoderError(
            f"captions.backend onnx supports Transformer → mean Pooling [→ Normalize] models; "
            f"this one is {' → '.join(names)}: use captions.backend: torch")
    return len(names) == 3


def _positional(auto_model: Any) -> Any:
    """``auto_model`` as a module of ``input_ids, attention_mask, token_type_ids →
    last_hidden_state`` (the export passes inputs by position; transformers 5's ``forward``
    takes others in between)."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = auto_model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    return Positional().eval()


def prepare(model_path: Path, variant: str) -> Path:
    """The cache directory of ``variant`` for the model folder ``model_path``: ``model.onnx``,
    the model's fast tokenizer (``tokenizer.json``, as sentence-transformers configures it) and
    ``encoder.json`` (window, width, normalisation, padding). Exported on first use — the only
    step that loads the model in PyTorch; afterwards an :class:`OnnxEncoder` starts from these
    files alone (no torch import: seconds per caption actor).

    Raises:
        OnnxEncoderError: ``variant`` is unknown, the pipeline is not Transformer → mean
            Pooling [→ Normalize], or the tokenizer has no fast (``tokenizers``) version or no
            padding token.
    """
    if variant not in VARIANTS:
        raise OnnxEncoderError(f"captions.backend={variant!r}: choose one of {VARIANTS}")
    # OpenVINO compiles the float32 export itself (in well under a second): one shared file
    d = cache_dir() / "onnx" / _model_digest(
        model_path, "onnx" if variant.startswith("openvino") else variant)
    if all((d / f).exists() for f in (MODEL_FILE, TOKENIZER_FILE, ENCODER_FILE)):
        return d
    from components.data.captions import embedding_dim, sentence_transformer

    st_model = sentence_transformer(str(model_path), "cpu")
    normalize = _check_pipeline(st_model)
    tok = st_model.tokenizer
    missing = ("fast version (tokenizer.json)" if not getattr(tok, "is_fast", False) else
               "padding token" if tok.pad_token is None else None)
    if missing:
        raise OnnxEncoderError(f"captions.backend={variant}: the model's tokenizer "
                               f"({type(tok).__name__}) has no {missing}: use "
                               "captions.backend: torch")
    if not (d / MODEL_FILE).exists():
        _export(st_model, d, variant)
    with replacing(d / TOKENIZER_FILE) as tmp:
        tok.backend_tokenizer.save(str(tmp))
    write_json(d / ENCODER_FILE, {
        "max_seq_length": int(st_model.max_seq_length), "dim": embedding_dim(st_model),
        "normalize": normalize, "pad_id": int(tok.pad_token_id), "pad_token": tok.pad_token,
        "pad_type_id": int(tok.pad_token_type_id), "padding_side": tok.padding_side,
        "truncation_side": tok.truncation_side,
    })
    return d


def _export(st_model: Any, d: Path, variant: str) -> None:
    """Write ``d / model.onnx``: the transformer in float32, weights quantised for onnx-int8."""
    import torch

    target = d / MODEL_FILE
    d.mkdir(parents=True, exist_ok=True)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dummy = st_model.tokenizer(["a photo of a cat", "x"], padding=True, return_tensors="pt")
    inputs = tuple(dummy[n] if n in dummy else torch.zeros_like(dummy["input_ids"])
                   for n in names)
    float_file = d / f"float32.{os.getpid()}.onnx"  # per process: actors may race here
    with warnings.catch_warnings(), replacing(float_file) as tmp:
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
        torch.onnx.export(
            _positional(st_model[0].auto_model), inputs, str(tmp), input_names=names,
            output_names=["last_hidden_state"], opset_version=17, dynamo=False,
            dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]})
    if variant != "onnx-int8":
        os.replace(float_file, target)
        return
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its "consider pre-processing" advice, logged on the root
    with replacing(target) as tmp:
        # Per-channel weights: per-tensor int8 lost too much (mean cosine 0.96 on real captions).
        try:
            quantize_dynamic(str(float_file), str(tmp), weight_type=QuantType.QInt8,
                             per_channel=True)
        finally:
            root.setLevel(level)
    float_file.unlink(missing_ok=True)


class _OpenVinoSession:
    """An OpenVINO compiled model behind ONNX Runtime's ``run(None, feed)`` / ``get_inputs``."""

    def __init__(self, path: Path, variant: str, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        precision = "bf16" if variant == "openvino-bf16" else "f32"
        if precision == "bf16":
            found = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
            if "BF16" not in found:
                raise OnnxEncoderError(
                    "captions.backend=openvino-bf16 needs a CPU with bfloat16 instructions "
                    f"(AVX512_BF16 or AMX); OpenVINO finds {found} here: use openvino "
                    "(float32) or onnx-int8")
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
            "INFERENCE_PRECISION_HINT": precision,
            # pinned threads of two caption actors would share one core
            "ENABLE_CPU_PINNING": False,
        })
        got = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        if precision == "bf16" and "bfloat16" not in got:
            raise OnnxEncoderError(f"captions.backend=openvino-bf16: OpenVINO compiled the "
                                   f"encoder for {got}, not bfloat16: use openvino or onnx-int8")
        self.request = self.compiled.create_infer_request()

    def get_inputs(self) -> list[Any]:
        return [SimpleNamespace(name=i.get_any_name()) for i in self.compiled.inputs]

    def run(self, _outputs: None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = self.request.infer(feed)
        return [np.asarray(result[self.compiled.output(0)])]


class OnnxEncoder:
    """A sentence-transformers model on ONNX Runtime or OpenVINO, with what the caption code
    uses (``encode``, ``token_counts``, ``max_seq_length``, ``get_embedding_dimension``).
    Starts from :func:`prepare`'s files: the tokenizer is the model's own fast tokenizer
    (``tokenizers``), set up as sentence-transformers calls it.

    Raises:
        OnnxEncoderError: the model's pipeline is not Transformer → mean Pooling [→ Normalize],
            its tokenizer has no fast version or no padding token, ``variant`` is unknown, or
            ``openvino-bf16`` on a CPU without bfloat16.
    """

    def __init__(self, model_path: str, variant: str = "onnx", threads: int = 1) -> None:
        from tokenizers import Tokenizer

        d = prepare(Path(model_path), variant)
        facts = json.loads((d / ENCODER_FILE).read_text())
        self.variant = variant
        self.normalize = bool(facts["normalize"])
        self.max_seq_length = int(facts["max_seq_length"])
        self._dim = int(facts["dim"])
        # What transformers does for tokenizer(texts, padding=True, truncation=True,
        # max_length=max_seq_length): truncate to the window, pad to the longest in the batch.
        self._tokenizer = Tokenizer.from_file(str(d / TOKENIZER_FILE))
        self._tokenizer.enable_truncation(self.max_seq_length,
                                          direction=facts["truncation_side"])
        self._tokenizer.enable_padding(direction=facts["padding_side"], pad_id=facts["pad_id"],
                                       pad_type_id=facts["pad_type_id"],
                                       pad_token=facts["pad_token"])
        self._counter = Tokenizer.from_file(str(d / TOKENIZER_FILE))  # whole texts, unpadded
        self._counter.no_truncation()
        self._counter.no_padding()
        self.session: Any
        if variant.startswith("openvino"):
            self.session = _OpenVinoSession(d / MODEL_FILE, variant, threads)
            self._inputs = [i.name for i in self.session.get_inputs()]
            return
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(d / MODEL_FILE), options,
                                            providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self.session.get_inputs()]

    def get_embedding_dimension(self) -> int:
        return self._dim

    def token_counts(self, texts: Sequence[str], batch_size: int = 4096) -> list[int]:
        """Tokens per text, special tokens included, before truncation to the window
        (``batch_size`` texts per tokenizer call: its encodings are large, a build's captions
        many)."""
        out: list[int] = []
        for s in range(0, len(texts), batch_size):
            out += [len(e.ids) for e in self._counter.encode_batch(list(texts[s:s + batch_size]))]
        return out

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """``[len(texts), E]`` float32 embeddings (L2-normalised when the model normalises);
        ``batch_size`` texts per forward pass (default: the variant's ``BATCH``)."""
        batch_size = batch_size or BATCH[self.variant]
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths together
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            enc = self._tokenizer.encode_batch([texts[i] for i in idx])
            given = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),  # [b, tokens]
                     "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                     "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}
            feed = {n: given[n] for n in self._inputs}
            hidden = self.session.run(None, feed)[0]  # [b, tokens, E]
            mask = given["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
            if self.normalize:
                pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[idx] = pooled
        return out
