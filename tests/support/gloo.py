"""Multi-process tests on gloo: a rendezvous without a port race, and a process group that
tears down safely."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (for the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rendezvous_file(directory: str | os.PathLike[str]) -> str:
    """A file rendezvous in ``directory`` (a fresh name): no port is picked and then bound
    later — a free port can be taken in between by another test process, which aborted a rank
    under the parallel suite — and no rank hosts a TCP store the others still read."""
    return f"file://{os.path.join(os.fspath(directory), f'gloo-{uuid.uuid4().hex}')}"


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int | str,
               timeout_s: float | None = None) -> Iterator[None]:
    """This process as ``rank`` of a ``world``-rank gloo group: ``port`` a loopback TCP port,
    or a :func:`rendezvous_file` (``timeout_s``: gloo's collective timeout, so a hang fails
    the test). After the block, a barrier (no rank tears its pairs down while a peer may
    still read from them: with a TCP rendezvous rank 0 also hosts the store, and leaving first
    aborted a process once in CI), then the group is destroyed — also when the block raised
    (without the barrier)."""
    # Loopback by name: gloo otherwise resolves the machine's hostname, which fails (or
    # names an unreachable address) inside the suite's network namespace.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    extra = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    init = port if isinstance(port, str) else f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=world, **extra)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_bounded(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int,
                  wait_s: float) -> None:
    """``mp.spawn(fn, args, nprocs)`` that fails the test, killing the ranks, when they are
    not all done within ``wait_s`` (spawn and imports included): a hung rank fails, never
    hangs the suite. A rank's exception is raised here, as ``mp.spawn``'s. A rank that
    returns leaves by ``os._exit(0)`` (:func:`_exit_after`)."""
    ctx = mp.spawn(_exit_after, args=(fn, *args), nprocs=nprocs, join=False)
    deadline = time.monotonic() + wait_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the {nprocs}-rank run did not finish in {wait_s:.0f} s: a rank hung")


def _exit_after(rank: int, fn: Callable[..., None], *args: Any) -> None:
    """``fn(rank, *args)``, then the process ends at once (``os._exit(0)``, output flushed):
    no interpreter finalisation, where gloo's worker threads could still be torn down by a
    C++ static destructor — "terminate called without an active exception", SIGABRT, once in
    five CI runs (2026-11-27) after every result was written. An exception still reaches
    ``mp.spawn``'s wrapper (exit 1, raised in the parent)."""
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
