"""Peak memory and time of one forward + backward of each objective at large batches on CPU,
row-chunked (the default above ``reducers.LOGIT_BUDGET_BYTES`` of logits) against unchunked.

Each (objective, 2B, mode) runs in a fresh subprocess; the number is the growth of its peak
resident set (``ru_maxrss``) over the step: inputs and imports excluded. Labels: 1,000
classes; captions: 384-d; D = 128, V = 2 views of B samples.

    python bench/objectives_memory.py                         # 2B = 4096 both ways, 32768 chunked
    python bench/objectives_memory.py --sizes 8192 32768 --unchunked-up-to 8192
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ["simclr", "supcon", "sincere", "xclr_caption", "clip"]


def _child(loss: str, anchors: int, chunked: bool) -> None:
    import resource
    import time

    import torch

    sys.path.insert(0, str(ROOT))
    from components.objectives import ContrastiveBatch
    from components.objectives.clip import CLIP
    from components.objectives.infonce import InfoNCE
    from components.objectives.sincere import SINCERE
    from components.objectives.supcon import SupCon
    from components.objectives.xclr import XCLR

    torch.manual_seed(0)
    b, d, e = anchors // 2, 128, 384
    objective = {"simclr": lambda: InfoNCE(0.1), "supcon": lambda: SupCon(0.1),
                 "sincere": lambda: SINCERE(0.1),
                 "xclr_caption": lambda: XCLR(0.1, tau_s=0.1, graph="caption"),
                 "clip": lambda: CLIP(d, caption_dim=e)}[loss]()
    if not chunked:
        objective.logit_budget_bytes = 1 << 62  # type: ignore[misc]
    z = torch.randn(b, 2, d, requires_grad=True)
    batch = ContrastiveBatch(z=z, labels=torch.randint(0, 1000, (b,)),
                             sample_ids=torch.arange(b), captions=torch.randn(b, e))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    t0 = time.perf_counter()
    loss_value, _ = objective(batch)
    loss_value.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": (peak - before) / 1024, "seconds": seconds,
                      "loss": float(loss_value)}))


def _measure(loss: str, anchors: int, chunked: bool) -> dict[str, float] | None:
    p = subprocess.run([sys.executable, __file__, "--child", loss, str(anchors),
                        "1" if chunked else "0"], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{loss} 2B={anchors} chunked={chunked} failed: {p.stderr[-500:]}", file=sys.stderr)
        return None
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 32768], help="2B values")
    p.add_argument("--unchunked-up-to", type=int, default=4096,
                   help="also run unchunked at sizes up to this (A×A float32 buffers)")
    p.add_argument("--losses", nargs="+", default=LOSSES, choices=LOSSES)
    args = p.parse_args()
    print(f"{datetime.date.today()}, {platform.machine()}, {platform.node()}; one forward + "
          "backward, D = 128, V = 2; peak RSS growth over the step\n")
    print("| loss | 2B | chunked peak | chunked time | unchunked peak | unchunked time | "
          "loss equal |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for size in args.sizes:
        for loss in args.losses:
            c = _measure(loss, size, True)
            u = _measure(loss, size, False) if size <= args.unchunked_up_to else None

            def cell(r: dict[str, float] | None, key: str, unit: str) -> str:
                return "—" if r is None else f"{r[key]:.0f} {unit}" if unit == "MiB" \
                    else f"{r[key]:.2f} {unit}"

            same = "—" if c is None or u is None else \
                f"{abs(c['loss'] - u['loss']) <= 1e-5 * abs(u['loss'])}"
            print(f"| {loss} | {size} | {cell(c, 'peak_mib', 'MiB')} | {cell(c, 'seconds', 's')}"
                  f" | {cell(u, 'peak_mib', 'MiB')} | {cell(u, 'seconds', 's')} | {same} |",
                  flush=True)


if __name__ == "__main__":
    main()
