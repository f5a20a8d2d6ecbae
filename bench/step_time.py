"""Training-step benchmark: X-CLR step time / SimCLR step time, same model, batch and data.

xclr.txt Table 4 reports the same step time for both (0.866 s vs 0.866 s): the soft target
graph must not slow the step down. Both losses run through :func:`components.training.step.
train_step` (forward of all views, loss, backward, optimizer step), interleaved so machine
noise hits both alike; the median of ``--steps`` steps per loss is compared.

    python bench/step_time.py [--backbone resnet18] [--batch 128] [--resolution 32] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import ModelConfig, SimCLRConfig, TrainConfig, XCLRConfig  # noqa: E402
from components.data.reader import Batch  # noqa: E402
from components.training.optim import build_optimizer, build_scheduler  # noqa: E402
from components.training.step import build_model, train_step  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--resolution", type=int, default=32)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--amp", default="none", choices=["none", "bf16"])
    args = ap.parse_args()
    device = torch.device(args.device)
    model_cfg = ModelConfig(backbone=args.backbone, small_images=args.resolution <= 64)
    g = torch.Generator().manual_seed(0)
    c = args.classes
    emb = torch.nn.functional.normalize(torch.randn(c, 64, generator=g), dim=1)
    sim = (emb @ emb.T).to(device)
    setups = {}
    for name, loss in (("simclr", SimCLRConfig(tau=0.1)), ("xclr", XCLRConfig(tau=0.1))):
        torch.manual_seed(0)
        model, ema = build_model(model_cfg, loss, c, sim, 0)
        model.to(device)
        opt = build_optimizer(model, "sgd", 0.1, 0.9, 1e-4)
        setups[name] = (model, ema, opt, build_scheduler(opt, 10**6, 0))
    batch = Batch(
        images=torch.randn(args.batch, 2, 3, args.resolution, args.resolution, generator=g
                           ).to(device),
        labels=torch.randint(0, c, (args.batch,), generator=g).to(device),
        sample_ids=torch.arange(args.batch, device=device), captions=None,
    )
    times: dict[str, list[float]] = {k: [] for k in setups}
    names = list(setups)
    for step in range(args.steps + 3):
        # alternate which loss goes first, so drift and cache effects hit both alike
        for name in (names if step % 2 == 0 else names[::-1]):
            model, ema, opt, sched = setups[name]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            train_step(model, ema, opt, sched, None, batch, train_cfg=TrainConfig(amp=args.amp),
                       device=device, step=step, total_steps=10**6, ema_momentum=0.99,
                       where="bench")
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= 3:  # warm-up steps excluded
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.backbone}, batch {args.batch} × 2 views, {args.resolution} px, {c} classes, "
          f"{device}, amp {args.amp}, {torch.get_num_threads()} threads, median of {args.steps}")
    for k, v in med.items():
        print(f"  {k:7s} {1000 * v:8.1f} ms/step")
    print(f"  X-CLR / SimCLR step time: {med['xclr'] / med['simclr']:.3f} (goal <= 1.02)")


if __name__ == "__main__":
    main()
