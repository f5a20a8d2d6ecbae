"""The strict-device emulation (tests/support/strict_device.py) checks every collective simgraph
calls: a collective it does not patch would let a host tensor reach NCCL unseen (issue 40,
defect 7)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch.distributed as dist

from tests.support.strict_device import _COLLECTIVES

ROOT = Path(__file__).resolve().parents[2]
# torch.distributed functions that move no data between ranks.
NOT_COLLECTIVES = {"is_available", "is_initialized", "get_rank", "get_world_size",
                   "get_backend", "init_process_group", "destroy_process_group", "new_group",
                   "ReduceOp", "ProcessGroup", "get_process_group_ranks", "Backend"}


def dist_calls() -> dict[str, list[str]]:
    """Every ``dist.<name>`` used in components/ and pipelines/ → where."""
    found: dict[str, list[str]] = {}
    for path in [*ROOT.glob("components/**/*.py"), *ROOT.glob("pipelines/**/*.py")]:
        if "torch.distributed as dist" not in path.read_text():
            continue  # "dist" is something else there
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "dist":
                found.setdefault(node.attr, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_collective_the_code_calls_is_emulated() -> None:
    calls = dist_calls()
    assert "all_gather_object" in calls and "all_reduce" in calls  # the scan sees the code
    missing = {n: w for n, w in calls.items()
               if n not in _COLLECTIVES and n not in NOT_COLLECTIVES}
    assert not missing, ("collectives not in tests/support/strict_device.py's _COLLECTIVES: "
                         f"{missing}")


def test_the_gather_works_on_torch_without_all_gather_single(monkeypatch) -> None:
    """torch 2.11 (the lent GPU image) has no dist.all_gather_single: the gather falls back to
    all_gather_into_tensor (the same collective) instead of stopping the run."""
    from components.runtime import distributed

    seen: list[str] = []
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    monkeypatch.setattr(dist, "all_gather_into_tensor",
                        lambda out, x: (seen.append("into_tensor"), out.copy_(x))[0])
    import torch

    out = torch.empty(3)
    distributed._all_gather_single(out, torch.arange(3.0))
    assert seen == ["into_tensor"] and out.tolist() == [0.0, 1.0, 2.0]
