"""Which nodes a build's Ray tasks and caption actors may run on (:func:`decide`).

Every stage's tasks read the source's files and read or write the build dir by their paths as
the driver sees them (shard tasks write ``shards/<name>.beton``, the caption actors write rows
into ``caption_embeddings.npy``, the merge tasks read the shards back). On a cluster whose nodes
all mount both at the same paths, the tasks may run anywhere. Where they do not — a local
output (or a URI output's build dir, which is a local cache on the driver's node), a source
folder on the head only — a task on another node would write where the driver never looks,
and the build would stop at "shard … did not complete" on every re-run. So before the first
stage, one probe task per alive node (pinned to it) checks that it sees this build's token
file in the build dir and the source's files as the driver does (size and mtime of the first
and last item's file); the build then runs on the nodes that do, or stops with an error
naming them when none of those has a CPU. A local Ray (one node) is not probed.

A node that joins after the probe (an autoscaler) is not used while the build is pinned."""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.data.build.common import PreprocessError
from components.data.sources import item_file

PROBE_PREFIX = ".placement-"  # the token file; dot-named: never uploaded with a URI output
PROBE_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    cpus: float
    gpus: float


@dataclasses.dataclass(frozen=True)
class Placement:
    """The nodes a build may use; ``nodes`` empty means any node of the cluster."""

    nodes: tuple[Node, ...] = ()

    def cpus(self) -> float:
        """CPUs the build's tasks can spread over (the cluster's, when not pinned)."""
        import ray

        if not self.nodes:
            return float(ray.cluster_resources().get("CPU", 1))
        return sum(n.cpus for n in self.nodes)

    def gpus(self) -> float:
        import ray

        if not self.nodes:
            return float(ray.cluster_resources().get("GPU", 0))
        return sum(n.gpus for n in self.nodes)

    def task_options(self, k: int) -> dict[str, Any]:
        """Ray options for the ``k``-th task of a stage: pinned round-robin over the nodes,
        each node taking tasks in proportion to its CPUs; ``{}`` when not pinned."""
        if not self.nodes:
            return {}
        slots = self._slots
        return {"scheduling_strategy": _affinity(slots[k % len(slots)].node_id)}

    @functools.cached_property
    def _slots(self) -> list[Node]:
        """Each node once per CPU (at least once): the round-robin of :meth:`task_options`."""
        return [n for n in self.nodes for _ in range(max(1, int(n.cpus)))]

    def actor_options(self, gpu: bool) -> dict[str, Any]:
        """Ray options for the caption actors: all on one node (the one with the most GPUs
        when ``gpu``, else CPUs); ``{}`` when not pinned."""
        if not self.nodes:
            return {}
        best = max(self.nodes, key=lambda n: (n.gpus, n.cpus) if gpu else (n.cpus, n.gpus))
        return {"scheduling_strategy": _affinity(best.node_id)}


ANYWHERE = Placement()


def _affinity(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _file_view(path: str) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of ``path`` as this node sees it, None if it cannot."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def sees(token_path: str, token: str, files: dict[str, tuple[int, int]]) -> str | None:
    """The probe task: why this node does not see the build as the driver does, or None."""
    try:
        with open(token_path) as f:
            if f.read() != token:
                return f"{Path(token_path).parent} is another folder here"
    except OSError:
        return f"{Path(token_path).parent} is not there"
    for path, want in files.items():
        if _file_view(path) != want:
            return f"the source file {path} is missing or differs"
    return None


def _source_files(paths: Sequence[str]) -> dict[str, tuple[int, int]]:
    """The first and last item's local files with the driver's view of them (object-store
    items have none: every node reads those the same way)."""
    out: dict[str, tuple[int, int]] = {}
    for p in ({paths[0], paths[-1]} if len(paths) else set()):
        f = item_file(str(p))
        if f is not None and (view := _file_view(f)) is not None:
            out[f] = view
    return out


def alive_nodes() -> list[Node]:
    import ray

    return [Node(n["NodeID"], n.get("NodeManagerAddress", "?"),
                 float(n.get("Resources", {}).get("CPU", 0)),
                 float(n.get("Resources", {}).get("GPU", 0)))
            for n in ray.nodes() if n.get("Alive")]


def decide(out: Path, paths: Sequence[str], echo: bool = True) -> Placement:
    """Probe every alive node (see the module docstring; :func:`probe`); the placement the
    build's stages use (:func:`choose`)."""
    for stale in out.glob(f"{PROBE_PREFIX}*"):  # a killed build's (we hold the dir's lock)
        stale.unlink(missing_ok=True)
    nodes = alive_nodes()
    if len(nodes) <= 1:
        return ANYWHERE
    return choose(nodes, probe(nodes, out, _source_files(paths)), out, echo)


def probe(nodes: Sequence[Node], out: Path, files: dict[str, tuple[int, int]]
          ) -> dict[str, str]:
    """``{node id: why it does not see the build}`` for the ``nodes`` that do not (one task
    pinned to each, :func:`sees`; a node that does not answer in ``PROBE_TIMEOUT_S`` or
    cannot run the task counts as not seeing it)."""
    import ray

    token = secrets.token_hex(16)
    token_path = out / f"{PROBE_PREFIX}{token[:8]}"
    token_path.write_text(token)
    why: dict[str, str] = {}
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(sees)
        refs = [task.options(scheduling_strategy=_affinity(n.node_id)).remote(
            str(token_path), token, files) for n in nodes]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for n, ref in zip(nodes, refs, strict=True):
            if ref not in ready:
                ray.cancel(ref, force=True)
                why[n.node_id] = f"did not answer in {PROBE_TIMEOUT_S:.0f} s"
                continue
            try:
                answer = ray.get(ref)
            except Exception as e:  # the node died, or cannot run a task
                answer = f"could not run the check ({type(e).__name__})"
            if answer is not None:
                why[n.node_id] = answer
    finally:
        token_path.unlink(missing_ok=True)
    return why


def choose(nodes: Sequence[Node], why: dict[str, str], out: Path, echo: bool) -> Placement:
    """Every node sees the build: anywhere; else the nodes that do and have a CPU (saying so).

    Raises:
        PreprocessError: none of the nodes that see the build has a CPU (naming each node
            and what it lacks, and the fix).
    """
    if not why:
        return ANYWHERE
    usable = tuple(n for n in nodes if n.node_id not in why and n.cpus > 0)
    others = "; ".join(f"node {n.address} ({n.node_id[:8]}): {why[n.node_id]}"
                       for n in nodes if n.node_id in why)
    fix = ("put the output (for an s3:// / gs:// output: $SIMGRAPH_STAGE_DIR, where it is "
           "built first) and the source on a filesystem every node mounts at the same path")
    if not usable:
        idle = [n.address for n in nodes if n.node_id not in why]
        raise PreprocessError(
            f"no node with a CPU sees the build dir {out} and the source as this driver does "
            f"(the nodes that do have no CPUs: {', '.join(idle) or 'none'}; {others}); {fix}")
    if echo:
        print(f"simgraph preprocess: building on {len(usable)} of {len(nodes)} nodes "
              f"({sum(n.cpus for n in usable):g} CPUs), the others do not see it ({others}); "
              f"to use them all, {fix}", flush=True)
    return Placement(usable)
