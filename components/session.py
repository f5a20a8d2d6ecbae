"""The Ray session every entry point runs in: the cluster at ``RAY_ADDRESS``, the Ray this
process already joined, or a local one started for the command and stopped after it.

A local Ray starts without its dashboard unless ``SIMGRAPH_RAY_DASHBOARD=1``, or unless the
command needs it and ``SIMGRAPH_RAY_DASHBOARD`` is unset. The dashboard's HTTP server
(http://127.0.0.1:8265) also serves the Jobs API, through which whoever can reach the port and
present Ray's token (when token auth is on) runs code as this user; without it a local start
also takes ~2.4 s less on a 2-core machine and runs fewer processes. Nothing of simgraph needs
the Jobs API on a local Ray (``simgraph submit`` uses a cluster's own), but the dashboard
also serves Ray's State API, and Ray Train's placement-group cleaner asks it whether a Train
controller is still alive: without it, a sweep trial with its own Train worker group that Tune
stops (ASHA, or at its last epoch) never frees its workers' placement group and the next trial
waits forever (docs/ray-notes.md). ``simgraph sweep`` asks for it for such trials
(``needs_dashboard``). Joining a cluster (``RAY_ADDRESS``) is unchanged: its dashboard is the
cluster's own business.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

DASHBOARD_ENV = "SIMGRAPH_RAY_DASHBOARD"
_YES = ("1", "true", "yes", "on")


def dashboard_wanted(env: Mapping[str, str] | None = None, needed: bool = False) -> bool:
    """Whether a local Ray gets its dashboard: as ``SIMGRAPH_RAY_DASHBOARD`` says (``1``,
    ``true``, ``yes``, ``on``: yes; anything else: no), else whether the command ``needed``
    it."""
    env = os.environ if env is None else env
    value = env.get(DASHBOARD_ENV, "").strip().lower()
    return value in _YES if value else needed


def init_kwargs(num_cpus: int | None, env: Mapping[str, str] | None = None,
                needs_dashboard: bool = False) -> dict[str, Any]:
    """``ray.init``'s arguments besides the console's: a local Ray (no ``RAY_ADDRESS`` in
    ``env``, default ``os.environ``) with ``num_cpus``, a small object store and the dashboard
    only when wanted (:func:`dashboard_wanted`); joining ``RAY_ADDRESS``, none of those."""
    env = os.environ if env is None else env
    kwargs: dict[str, Any] = {"log_to_driver": True}
    if not env.get("RAY_ADDRESS"):
        # "local": never attach to some other Ray found on this machine by accident.
        # A small explicit object store: Ray would otherwise claim ~7 GB of /dev/shm.
        kwargs.update(address="local", num_cpus=num_cpus, object_store_memory=1 << 30,
                      include_dashboard=dashboard_wanted(env, needs_dashboard))
    return kwargs


@contextlib.contextmanager
def ray_session(num_cpus: int | None, needs_dashboard: bool = False) -> Iterator[None]:
    """Use the running Ray / the ``RAY_ADDRESS`` cluster, or start (and stop) a local one
    (with its dashboard when ``needs_dashboard`` and ``SIMGRAPH_RAY_DASHBOARD`` is unset);
    quiet unless ``--verbose`` (:mod:`components.console`)."""
    import ray

    from components import console

    if ray.is_initialized():
        yield
        return
    ray.init(**init_kwargs(num_cpus, needs_dashboard=needs_dashboard),
             **console.before_ray_init())
    console.after_ray_init()
    try:
        yield
    finally:
        ray.shutdown()
