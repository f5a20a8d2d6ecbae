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

**Loopback only.** A local Ray listens on 127.0.0.1 only, dashboard included. Ray 2.60's
gRPC servers (GCS, raylet, workers, agents) listen on every interface unless the node's address
is exactly ``127.0.0.1``, and ``ray.init(_node_ip_address="127.0.0.1")`` is not enough:
``services.resolve_ip_for_localhost`` rewrites it to the address of the interface that routes
off the machine. That rewrite, and Ray's own choice of node address, are skipped when
``ray_constants.ENABLE_RAY_CLUSTER`` is false (what Ray does on macOS / Windows, and what
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets): :func:`local_start` turns it off for the
start, in this process and (through the environment) in the processes Ray spawns. Token
authentication stays as Ray 2.60 sets it for a new local cluster (on, unless ``RAY_AUTH_MODE``
says otherwise): loopback ports are still reachable by the machine's other users.
Tested in a network namespace with a routable 10.x address and a default route
(``tests/deploy/test_secrets_and_ports.py::test_a_local_ray_listens_on_loopback_only_with_a_token``).

**Train's poll.** Ray Train 2.60's controller polls its workers every
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (default 2 s), and a worker's ``ray.train.report`` waits
until the controller has taken its previous report (a queue of one): a run whose epochs are
shorter than the poll waits up to 2 s per epoch, and every run waits up to 2 s more to end. A
local Ray is one machine's few workers, where polling is cheap: its processes get 0.25 s
(:data:`LOCAL_TRAIN_POLL_S`) unless the variable is set (measured: a 4-epoch, 2-worker run of
the tests' dataset 23 → 17.5 s; docs/benchmarks.md). A cluster keeps Ray's default (its
nodes' environment decides: docs/ray-notes.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from components.errors import stop_on_sigterm

DASHBOARD_ENV = "SIMGRAPH_RAY_DASHBOARD"
LOOPBACK = "127.0.0.1"
_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
_YES = ("1", "true", "yes", "on")
TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # read by Train's controller actor
LOCAL_TRAIN_POLL_S = "0.25"


def placement_problem(workers: int, cpus: float, gpus: float,
                      nodes: Sequence[Mapping[str, float]], where: str,
                      strategy: str = "PACK") -> str | None:
    """``None`` when ``workers`` bundles of ``{CPU: cpus, GPU: gpus}`` fit the ``nodes``' total
    resources (Ray's resource names; a node holds as many bundles as its scarcest asked
    resource allows; ``STRICT_SPREAD``: one per node), else one message with the numbers and
    the fix. ``where`` names the nodes (``the cluster at ...``, ``examples/cluster/aws.yaml``).
    """
    ask = {"CPU": cpus, "GPU": gpus}
    ask = {k: v for k, v in ask.items() if v > 0}

    def holds(node: Mapping[str, float]) -> int:
        # a little slack: Ray stores resources in 1e-4 units
        n = min((int(node.get(k, 0.0) / v + 1e-6) for k, v in ask.items()), default=workers)
        return min(n, 1) if strategy == "STRICT_SPREAD" else n

    fit = sum(holds(n) for n in nodes)
    if fit >= workers:
        return None
    asked = f"{cpus:g} CPU" + (f" + {gpus:g} GPU" if gpus > 0 else "")
    with_gpus = [n for n in nodes if gpus <= 0 or n.get("GPU", 0.0) >= gpus]
    most_cpus = max((n.get("CPU", 0.0) for n in with_gpus), default=0.0)
    fix = (f"set scaling.cpus_per_worker <= {most_cpus:g} (and data.num_workers with it), "
           "or add nodes with more CPUs" if with_gpus and most_cpus < cpus else
           "lower scaling.num_workers, or add nodes")
    shape = ", ".join(sorted({f"{n.get('CPU', 0.0):g} CPU / {n.get('GPU', 0.0):g} GPU"
                              for n in nodes})) or "no nodes"
    return (f"scaling asks {workers} worker(s) of {asked} each, but {where} holds at most "
            f"{fit} (its nodes: {shape}): the run could never start. {fix[0].upper()}"
            f"{fix[1:]}.")


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
                      include_dashboard=dashboard_wanted(env, needs_dashboard),
                      _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK)
    return kwargs


@contextlib.contextmanager
def local_start() -> Iterator[None]:
    """While a local Ray starts: its node address stays ``127.0.0.1``, so every server it
    starts listens on loopback only, and its processes (which inherit this environment) get
    Train's short poll unless ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` is set (module docstring);
    restored afterwards."""
    from ray._private import ray_constants

    env = {_CLUSTER_ENV: "0", TRAIN_POLL_ENV: os.environ.get(TRAIN_POLL_ENV, LOCAL_TRAIN_POLL_S)}
    old_flag, old_env = ray_constants.ENABLE_RAY_CLUSTER, {k: os.environ.get(k) for k in env}
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ.update(env)
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        for key, value in old_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def ray_session(num_cpus: int | None, needs_dashboard: bool = False) -> Iterator[None]:
    """Use the running Ray / the ``RAY_ADDRESS`` cluster, or start (and stop) a local one
    (with its dashboard when ``needs_dashboard`` and ``SIMGRAPH_RAY_DASHBOARD`` is unset);
    quiet unless ``--verbose`` (:mod:`components.runtime.console`)."""
    import ray

    from components.runtime import console

    if ray.is_initialized():
        yield
        return
    kwargs = init_kwargs(num_cpus, needs_dashboard=needs_dashboard)
    with local_start() if kwargs.get("address") == "local" else contextlib.nullcontext():
        ray.init(**kwargs, **console.before_ray_init())
    console.after_ray_init()
    stop_on_sigterm()  # over the core worker's native handler (a stack dump, then abort)
    try:
        yield
    finally:
        ray.shutdown()


def check_placement(workers: int, cpus: float, gpus: float, strategy: str = "PACK") -> None:
    """Before a Train worker group is asked for: can the connected Ray's alive nodes hold
    it (:func:`placement_problem`, on their total resources)? A local Ray simgraph started
    cannot grow: refused (``ConfigError``, exit 2). A cluster (``RAY_ADDRESS``) may have an
    autoscaler that adds a larger node type later: one warning line with the numbers, since
    otherwise Ray Train only fails after its start timeout without saying why."""
    import ray

    from components.config.checks import ConfigError
    from components.runtime import console

    if not ray.is_initialized():  # nothing to ask (a caller that manages Ray itself)
        return
    nodes = [{k: float(v) for k, v in n.get("Resources", {}).items()}
             for n in ray.nodes() if n.get("Alive")]
    address = os.environ.get("RAY_ADDRESS")
    problem = placement_problem(workers, cpus, gpus, nodes,
                                f"the cluster at {address}" if address else "this machine's Ray",
                                strategy)
    if problem is None:
        return
    if not address:
        raise ConfigError(problem)
    console.say(f"warning: {problem} (unless the cluster's autoscaler adds a node type that "
                "holds one; Ray Train gives up after its start timeout)")
