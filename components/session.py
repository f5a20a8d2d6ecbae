"""The Ray session every entry point runs in: the cluster at ``RAY_ADDRESS``, the Ray this
process already joined, or a local one started for the command and stopped after it.

A local Ray starts its dashboard (http://127.0.0.1:8265) unless ``SIMGRAPH_RAY_DASHBOARD=0``:
without it a local start takes ~2.4 s less on a 2-core machine and runs fewer processes
(the test suite, which starts ~25 local Rays, sets it; nothing of simgraph needs the
dashboard on a local Ray — ``simgraph submit`` uses a cluster's own).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

DASHBOARD_ENV = "SIMGRAPH_RAY_DASHBOARD"


@contextlib.contextmanager
def ray_session(num_cpus: int | None) -> Iterator[None]:
    """Use the running Ray / the ``RAY_ADDRESS`` cluster, or start (and stop) a local one;
    quiet unless ``--verbose`` (:mod:`components.console`)."""
    import ray

    from components import console

    if ray.is_initialized():
        yield
        return
    local = not os.environ.get("RAY_ADDRESS")
    dashboard = os.environ.get(DASHBOARD_ENV, "1").strip().lower() not in ("0", "false", "no")
    kwargs: dict[str, Any] = {"log_to_driver": True, **console.before_ray_init()}
    if local:
        # "local": never attach to some other Ray found on this machine by accident.
        # A small explicit object store: Ray would otherwise claim ~7 GB of /dev/shm.
        kwargs.update(address="local", num_cpus=num_cpus, object_store_memory=1 << 30,
                      include_dashboard=dashboard)
    ray.init(**kwargs)
    console.after_ray_init()
    try:
        yield
    finally:
        ray.shutdown()
