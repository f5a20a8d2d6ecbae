"""Scientific check: do the papers' orderings reproduce at small scale on real data?

Fashion-MNIST (Debian ``dataset-fashion-mnist``), a fixed budget per run, several seeds:
SimCLR, SupCon, X-CLR (class graph), SINCERE, ε-SupInfoNCE, CoNe and CE are pretrained with
the same model, data, optimiser and epochs, each evaluated with ``simgraph evaluate``'s
functions (weighted kNN@20/200, linear probe, SINCERE margin, kNN-graph label error), and
reported as mean ± std over seeds in Markdown (``--out``, default docs/results.md), followed
by which claims hold:

* SupCon > SimCLR (supcon.txt), X-CLR ≥ SupCon (xclr.txt), SINCERE margin > SupCon margin
  (sincere.txt Table 1), CoNe > CE (cone.txt) — on probe top-1 unless stated.

    python bench/reproduce.py [--per-class 200] [--epochs 8] [--seeds 0 1 2] [--losses ...]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import PreprocessConfig, PretrainConfig, load_config  # noqa: E402
from pipelines import evaluate, preprocess, pretrain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOSSES = {
    "simclr": ["loss.name=simclr", "loss.tau=0.2"],
    "supcon": ["loss.name=supcon", "loss.tau=0.1"],
    "xclr": ["loss.name=xclr", "loss.tau=0.1", "loss.tau_s=0.1", "loss.graph=class"],
    "sincere": ["loss.name=sincere", "loss.tau=0.1"],
    "eps_supinfonce": ["loss.name=eps_supinfonce", "loss.tau=0.1", "loss.epsilon=0.1"],
    "cone": ["loss.name=cone", "loss.bank_size=1024", "loss.top_n=16"],
    "ce": ["loss.name=ce"],
}
METRICS = {"knn20": "kNN@20", "knn200": "kNN@200", "probe": "probe", "margin": "margin",
           "label_error": "label err"}


def _metrics(e: evaluate.RunEval) -> dict[str, float]:
    k_max = max(e.knn)
    return {"knn20": e.knn[min(20, k_max)]["top1"], "knn200": e.knn[min(200, k_max)]["top1"],
            "probe": e.probe["top1"], "margin": e.separation["margin"],
            "label_error": e.graph["label_error"]}


def _fmt(values: list[float], pct: bool) -> str:
    scale = 100 if pct else 1
    m = statistics.mean(values) * scale
    s = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.1f} ± {s:.1f}" if pct else f"{m:.2e} ± {s:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    ap.add_argument("--work", default="runs/reproduce")
    ap.add_argument("--out", default=str(ROOT / "docs/results.md"))
    ap.add_argument("overrides", nargs="*", help="extra pretrain overrides for every run")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    pre = load_config(ROOT / "pipelines/configs/data/demo.yaml", PreprocessConfig, [
        f"output={work / 'data'}", f"source.max_per_class={args.per_class}"])
    results: dict[str, list[dict[str, float]]] = {}
    failed: list[str] = []
    t0 = time.perf_counter()
    with preprocess.ray_session(None):
        preprocess.run(pre, echo=False)
        for loss in args.losses:
            for seed in args.seeds:
                cfg = load_config(ROOT / "pipelines/configs/pretrain/demo.yaml", PretrainConfig, [
                    *LOSSES[loss], f"name={loss}-s{seed}", f"storage={work / 'runs'}",
                    f"data.dataset={pre.output}", f"train.seed={seed}",
                    f"train.epochs={args.epochs}", "knn.every_epochs=0", *args.overrides])
                try:
                    pretrain.run(cfg, echo=False)
                except pretrain.PretrainError as err:  # reported, and the others still run
                    print(f"{cfg.name}: FAILED {err}", flush=True)
                    failed.append(f"{cfg.name}: {str(err).splitlines()[0]}")
                    continue
                e = evaluate.evaluate_run(work / "runs" / cfg.name)
                results.setdefault(loss, []).append(_metrics(e))
                print(f"{cfg.name}: {_metrics(e)}  ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
    Path(args.out).write_text(report(results, args, time.perf_counter() - t0, failed))
    print(Path(args.out).read_text())


def report(results: dict[str, list[dict[str, float]]], args: Any, wall: float,
           failed: list[str]) -> str:
    head = "| loss | " + " | ".join(METRICS.values()) + " |"
    rows = [head, "|---|" + "---:|" * len(METRICS)]
    for loss, runs in results.items():
        cells = [_fmt([r[m] for r in runs], pct=m != "margin") for m in METRICS]
        rows.append(f"| {loss} | " + " | ".join(cells) + " |")

    def mean(loss: str, m: str) -> float | None:
        runs = results.get(loss)
        return statistics.mean(r[m] for r in runs) if runs else None

    claims = []
    for text, a, b, m in (("SupCon > SimCLR (probe)", "supcon", "simclr", "probe"),
                          ("X-CLR ≥ SupCon (probe)", "xclr", "supcon", "probe"),
                          ("SINCERE margin > SupCon margin", "sincere", "supcon", "margin"),
                          ("CoNe > CE (probe)", "cone", "ce", "probe")):
        x, y = mean(a, m), mean(b, m)
        if x is None or y is None:
            claims.append(f"- {text}: not run")
            continue
        holds = x >= y if "≥" in text else x > y
        claims.append(f"- {text}: **{'holds' if holds else 'does not hold'}** here "
                      f"({x:.4g} vs {y:.4g})")
    return f"""# Reproduction at small scale

`python bench/reproduce.py --per-class {args.per_class} --epochs {args.epochs} --seeds \
{' '.join(map(str, args.seeds))}` on {datetime.date.today()} ({platform.machine()}, CPU,
{wall / 60:.0f} min in all). Fashion-MNIST, {args.per_class} images per class and split (val =
10 % of train), 28 px; the demo model (tiny CNN, 2 Ray Train workers on CPU), {args.epochs}
epochs, SGD with warm-up and cosine, the same for every loss; mean ± std over
{len(args.seeds)} seeds. kNN and probe: top-1 % on the test split (backbone features);
margin: SINCERE median target − noise similarity; label err: % of test 10-NN edges across
classes.

{chr(10).join(rows)}

Claims of the papers at this scale:

{chr(10).join(claims)}

{"Failed runs: " + "; ".join(failed) if failed else "Every run finished."}

Caveat: a tiny CNN for a few epochs on a few thousand 28 px images is far from the papers'
ResNet-50 / ImageNet budgets; differences smaller than the std are not evidence either way.
"""


if __name__ == "__main__":
    main()
