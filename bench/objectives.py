"""Objective cost: forward+backward time and saved memory, side by side in one run.

For 2B ∈ {512, 1024, 4096} rows (B samples × 2 views), D = 128, every objective is timed
against

* the floor: one anchors×candidates matmul + one masked log-softmax (fwd+bwd), and
* pytorch-metric-learning's SupConLoss / NTXentLoss (``pip install -e '.[bench]'``).

Times are medians of interleaved repeats (``--repeats``), printed as ratios to the floor
measured in the same run, because these machines are noisy. Memory is the bytes autograd
saves between forward and backward (``saved_tensors_hooks``, deduplicated by storage),
printed in units of one (2B)×(2B) float32 buffer: a machine-independent measure of the
O(B²) constant. On CUDA the peak allocated memory is printed too.

Usage: ``python bench/objectives.py [--sizes 512 1024 4096] [--device cpu|cuda] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from components.objectives import (
    CLIP,
    SINCERE,
    XCLR,
    CoNe,
    ContrastiveBatch,
    CrossEntropy,
    InfoNCE,
    SupCon,
)

D, CLASSES, CAPTION_DIM, TAU = 128, 100, 384, 0.1


def floor_loss(z: Tensor) -> Tensor:
    """One matmul + one masked log-softmax: the least any batch-contrastive loss must do."""
    a = torch.nn.functional.normalize(z.flatten(0, 1), dim=1)
    logits = a @ a.T / TAU
    n = logits.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    logp = torch.log_softmax(logits.masked_fill(eye, torch.finfo(logits.dtype).min), dim=1)
    positive = torch.arange(n, device=z.device) ^ 1  # row b·2+v pairs with b·2+(1−v)
    return -logp[torch.arange(n, device=z.device), positive].mean()


def make_cases(b: int, device: torch.device) -> dict[str, Callable[[Tensor], Tensor]]:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, CLASSES, (b,), generator=g).to(device)
    captions = torch.randn(b, CAPTION_DIM, generator=g).to(device)
    class_sim = torch.rand(CLASSES, CLASSES, generator=g).to(device)
    logits_w = torch.randn(D, CLASSES, generator=g).to(device)

    def ours(objective: torch.nn.Module, **extra: Tensor) -> Callable[[Tensor], Tensor]:
        objective.to(device)

        def run(z: Tensor) -> Tensor:
            fields = {k: v(z) if callable(v) else v for k, v in extra.items()}
            return objective(ContrastiveBatch(z=z, **fields))[0]

        return run

    cone = CoNe(CLASSES, D, bank_size=4096, top_n=32).to(device)
    with torch.no_grad():  # a full bank, as in steady-state training
        keys = torch.nn.functional.normalize(torch.randn(4096, D, generator=g), dim=1)
        cone.bank.enqueue(
            keys.to(device),
            labels=torch.randint(0, CLASSES, (4096,), generator=g).to(device),
            probs=torch.softmax(torch.randn(4096, CLASSES, generator=g), 1).to(device),
        )
    state = {k: v.clone() for k, v in cone.state_dict().items()}

    def cone_run(z: Tensor) -> Tensor:
        cone.load_state_dict(state)  # keep the bank full and fixed across repeats
        logits = z @ logits_w
        batch = ContrastiveBatch(
            z=z, labels=labels, logits=logits, ema_z=z.detach(), ema_logits=logits.detach()
        )
        return cone(batch)[0]

    cases: dict[str, Callable[[Tensor], Tensor]] = {
        "floor": floor_loss,
        "simclr": ours(InfoNCE(TAU)),
        "supcon_out": ours(SupCon(TAU, variant="out"), labels=labels),
        "supcon_in": ours(SupCon(TAU, variant="in"), labels=labels),
        "xclr_class": ours(XCLR(TAU, tau_s=0.1, graph="class", class_similarity=class_sim),
                           labels=labels),
        "xclr_caption": ours(XCLR(TAU, tau_s=0.1, graph="caption"), captions=captions),
        # the search spaces' low end: G/τ_s spans 100 per unit of similarity
        "xclr_caption(τ_s=0.01)": ours(XCLR(TAU, tau_s=0.01, graph="caption"), captions=captions),
        "sincere": ours(SINCERE(TAU), labels=labels),
        "eps_supinfonce": ours(SINCERE(TAU, epsilon=0.1), labels=labels),
        "cone(K=4096,N=32)": cone_run,
        "ce": ours(CrossEntropy(CLASSES), labels=labels, logits=lambda z: z @ logits_w),
        "clip": ours(CLIP(D, CAPTION_DIM, TAU), captions=captions),
    }
    try:
        from pytorch_metric_learning import losses

        pml_supcon = losses.SupConLoss(temperature=TAU)
        pml_ntxent = losses.NTXentLoss(temperature=TAU)
        rows = labels.repeat_interleave(2)
        ids = torch.arange(b, device=device).repeat_interleave(2)
        cases["pml_supcon"] = lambda z: pml_supcon(z.flatten(0, 1), rows)
        if b * 2 <= 1024:  # PML's NTXentLoss loops in Python: ~5 s at 2B=512, minutes beyond
            cases["pml_ntxent"] = lambda z: pml_ntxent(z.flatten(0, 1), ids)
    except ImportError:
        print("pytorch-metric-learning not installed: pip install -e '.[bench]'")
    return cases


def saved_bytes(fn: Callable[[Tensor], Tensor], z: Tensor) -> int:
    """Bytes autograd keeps for backward (unique storages), excluding the input itself."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() != z.untyped_storage().data_ptr():
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(z)
    loss.backward()
    z.grad = None
    return sum(seen.values())


def timed(fn: Callable[[Tensor], Tensor], z: Tensor) -> float:
    sync = torch.cuda.synchronize if z.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    fn(z).backward()
    sync()
    z.grad = None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 4096])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(
        f"# bench/objectives.py — {datetime.date.today()} — {platform.node()} — "
        f"{device} ({torch.get_num_threads()} threads) — torch {torch.__version__}"
    )
    for rows in args.sizes:
        b = rows // 2
        z = torch.randn(b, 2, D, device=device).requires_grad_()
        cases = make_cases(b, device)
        for name, fn in cases.items():  # warm-up
            if name != "pml_ntxent":
                timed(fn, z)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for repeat in range(args.repeats):  # interleaved, so drift hits every case alike
            for name, fn in cases.items():
                if name == "pml_ntxent" and repeat:  # one timing of the slow one is enough
                    continue
                times[name].append(timed(fn, z))
        med = {name: statistics.median(t) for name, t in times.items()}
        square = rows * rows * 4
        print(f"\n## 2B = {rows}, D = {D}\n")
        print("| objective | fwd+bwd ms | × floor | × PML SupCon | saved (2B)² fp32 buffers |")
        print("|---|---:|---:|---:|---:|")
        for name, fn in cases.items():
            vs_pml = med[name] / med["pml_supcon"] if "pml_supcon" in med else float("nan")
            mem = saved_bytes(fn, z) / square
            line = (
                f"| {name} | {med[name] * 1e3:.1f} | {med[name] / med['floor']:.2f} | "
                f"{vs_pml:.2f} | {mem:.2f} |"
            )
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                timed(fn, z)
                peak = (torch.cuda.max_memory_allocated() - base) / square
                line += f" peak {peak:.2f} |"
            print(line)


if __name__ == "__main__":
    main()
