"""Caption embedding throughput of ``simgraph preprocess``'s caption stage, per text-encoder
backend (``captions.backend``), side by side in one Ray session, and each fast backend's
agreement with the reference (``torch``) on real captions.

Throughput: ``components.data.build.embed_captions`` — the Ray Data actor pool the preprocess
command runs, actor start-up and model load included — on ``--n`` unique captions. Captions:
the English captions of Tux Paint's stamps (``tuxpaint-stamps-default``), and for the count a
realistic mix made from them (each with one of a few prefixes and suffixes, de-duplicated).
Agreement: cosine between each backend's and the reference embedding of every real caption,
and the KL divergence of X-CLR's target rows ``softmax_j(G_ij / τ_s)`` (own column excluded).

    python bench/captions.py [--n 50000] [--actors 2]
        [--backends auto torch onnx onnx-int8 openvino openvino-bf16]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import PreprocessConfig, load_config  # noqa: E402
from components.data import build, onnx_text  # noqa: E402
from components.data import captions as cap  # noqa: E402
from components.data.caption_backend import AUTO, choose  # noqa: E402

STAMPS = "/usr/share/tuxpaint/stamps"


def real_captions() -> list[str]:
    found = set()
    for f in glob.glob(f"{STAMPS}/**/*.txt", recursive=True):
        with open(f, encoding="utf-8", errors="replace") as fh:
            line = fh.readline().strip()
        if line:
            found.add(line)
    if not found:
        sys.exit(f"no captions under {STAMPS}: apt-get install tuxpaint-stamps-default "
                 "(make bench-deps)")
    return sorted(found)


def caption_mix(real: list[str], n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    pre = ["", "a photo of ", "a drawing of ", "an image showing ", "clip art: ", "a picture of "]
    post = ["", " on a white background", " in a children's book", ", cartoon style",
            " seen from the side", " next to a tree", " at night", " in the snow"]
    out: set[str] = set()
    while len(out) < n:
        c = real[int(rng.integers(len(real)))]
        text = f"{pre[rng.integers(len(pre))]}{c[0].lower()}{c[1:]}{post[rng.integers(len(post))]}"
        out.add(f"{text} #{int(rng.integers(1000))}" if len(out) > 40 * len(real) else text)
    return sorted(out)


def target_kl(ref: np.ndarray, other: np.ndarray, tau_s: float) -> tuple[float, float]:
    def rows(e: np.ndarray) -> np.ndarray:
        g = e @ e.T / tau_s
        np.fill_diagonal(g, -np.inf)
        g -= g.max(1, keepdims=True)
        p = np.exp(g)
        return p / p.sum(1, keepdims=True)

    p, q = rows(ref), rows(other)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum(1)
    return float(terms.mean()), float(terms.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50000, help="unique captions to embed")
    ap.add_argument("--actors", type=int, default=2, help="captions.actors")
    ap.add_argument("--backends", nargs="+", default=[AUTO, "torch", *onnx_text.VARIANTS],
                    choices=[AUTO, "torch", *onnx_text.VARIANTS])
    args = ap.parse_args()

    import ray

    real = real_captions()
    texts = caption_mix(real, args.n)
    ref = cap.embed(cap.load_encoder(cap.DEFAULT_MODEL), real)
    ray.init(address="local", object_store_memory=1 << 30, log_to_driver=False)
    rows = []
    try:
        for name in args.backends:
            backend = name
            cfg = load_config(ROOT / "pipelines/configs/data/demo.yaml", PreprocessConfig,
                              [f"captions.actors={args.actors}"])
            t0 = time.perf_counter()
            if name == AUTO:  # the default: the per-build check is part of its cost
                reference = cap.load_encoder(cfg.captions.model)
                backend = choose(cfg.captions.model, texts, reference).backend
                name = f"auto → {backend}"
            check = time.perf_counter() - t0
            cfg = dataclasses.replace(cfg, captions=dataclasses.replace(cfg.captions,
                                                                        backend=backend))
            # export + cache outside timing
            dim = cap.embedding_dim(cap.load_encoder(cfg.captions.model, backend=backend))
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                build.embed_captions(cfg, texts, Path(tmp), dim=dim)
                took = time.perf_counter() - t0 + check
            got = cap.embed(cap.load_encoder(cfg.captions.model, backend=backend), real)
            cos = (got * ref).sum(1)
            kl = target_kl(ref, got, 0.1)
            rows.append(f"| {name} | {len(texts) / took:.0f}/s | {took:.1f} s | "
                        f"{cos.mean():.4f} | {cos.min():.4f} | {kl[0]:.4f} / {kl[1]:.4f} |")
            print(rows[-1], flush=True)
    finally:
        ray.shutdown()
    print(f"\n{datetime.date.today()}, {platform.machine()}, {platform.node()}; {len(texts)} "
          f"unique captions (mean {np.mean([len(t) for t in texts]):.0f} chars), "
          f"{args.actors} caption actors; agreement on {len(real)} real Tux Paint captions\n")
    print("| backend | captions/s | wall | cosine mean | cosine min | X-CLR target KL "
          "(τ_s 0.1) mean / max |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
