"""Which int8 layers cost the caption embeddings their agreement: dynamic int8 quantisation of
all-MiniLM-L6-v2 with some MatMuls kept in float32, against the reference (sentence-transformers,
torch) on the 805 real Tux Paint captions, and each variant's speed, in one process.

Variants: every MatMul int8 (``captions.backend: onnx-int8`` today), one layer's FFN output
kept float32 (layer 0…5), every FFN output kept float32, the whole FFN (intermediate + output)
kept float32 (attention int8 only), and plain float32 (``onnx``). Speed: one ONNX Runtime
thread, up to ``--n`` captions made from the real ones (3 prefixes each), encoded by
``OnnxEncoder.encode`` (sorted by length, batches of 256): a relative measure, not the actor
pool's rate (``bench/captions.py``).

    python bench/caption_quantization.py [--n 6000]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from captions import real_captions  # noqa: E402

from components.data import captions as cap  # noqa: E402
from components.data import onnx_text  # noqa: E402


def main() -> None:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=6000)
    a = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime's pre-processing advice
    texts = real_captions()
    reference = cap.load_encoder(cap.DEFAULT_MODEL, backend="torch").encode(
        texts, batch_size=128, normalize_embeddings=True, convert_to_numpy=True)
    enc = onnx_text.OnnxEncoder(cap.resolve_model(cap.DEFAULT_MODEL), "onnx")
    float_file = Path(enc.session._model_path)  # the cached float32 export
    options = enc.session.get_session_options()
    matmuls = [n.name for n in onnx.load(str(float_file)).graph.node if n.op_type == "MatMul"]
    ffn_out = [n for n in matmuls if "/output/dense/" in n and "attention" not in n]
    ffn_in = [n for n in matmuls if "/intermediate/" in n]
    variants: dict[str, list[str] | None] = {
        "all MatMuls int8 (onnx-int8)": [],
        **{f"layer {k} FFN output float32": [name] for k, name in enumerate(ffn_out)},
        "every FFN output float32": ffn_out,
        "FFN float32, attention int8": ffn_out + ffn_in,
        "float32 (onnx)": None,
    }
    many = [f"{p} {t}" for t in texts for p in ("a picture of", "an image of", "my")][:a.n]
    print(f"{len(texts)} real captions; speed on {len(many)}, 1 thread\n")
    print("| variant | cosine mean | cosine min | cosine 1st pct | captions/s |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        for name, exclude in variants.items():
            path = float_file
            if exclude is not None:
                path = Path(d) / "q.onnx"
                quantize_dynamic(str(float_file), str(path), weight_type=QuantType.QInt8,
                                 per_channel=True, nodes_to_exclude=exclude)
            enc.session = ort.InferenceSession(str(path), options,
                                               providers=["CPUExecutionProvider"])
            cos = (enc.encode(texts) * reference).sum(1)
            t0 = time.perf_counter()
            enc.encode(many)
            rate = len(many) / (time.perf_counter() - t0)
            print(f"| {name} | {cos.mean():.4f} | {cos.min():.4f} | "
                  f"{np.percentile(cos, 1):.4f} | {rate:.0f} |", flush=True)


if __name__ == "__main__":
    main()
