"""The Ray task helper every image stage runs through: :func:`map_tasks` (one plain Ray task
per argument, all queued at once; a task's :class:`PreprocessError` re-raised as is) and
:func:`_task_count` (how many tasks a stage over ``n`` items gets).

Ray pickles a task's function by reference (its module path and name), so :func:`_call` and the
functions handed to :func:`map_tasks` (``hashing.hash_batch``, ``writing.write_shard``,
``merging.merge_split``) stay module-level functions of this package: every worker imports
them from the same module paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from components.data.build.common import PreprocessError
from components.data.build.placement import ANYWHERE, Placement
from components.errors import root_cause

ITEMS_PER_TASK = 1000  # hashing: enough per Ray task that its fixed cost (~10-30 ms) is small


def _task_count(n: int, placement: Placement = ANYWHERE) -> int:
    """Ray tasks for a stage over ``n`` items: about ``ITEMS_PER_TASK`` items a task, and at
    least 4 per CPU the build may use (load balance) while that leaves ≥ 1 item each."""
    cpus = int(placement.cpus())
    return max(1, min(n, max(math.ceil(n / ITEMS_PER_TASK), 4 * cpus)))


def _call(fn: Callable[..., Any], arg: Any, kwargs: dict[str, Any]) -> Any:
    return fn(arg, **kwargs)


def map_tasks(fn: Callable[..., Any], args: Sequence[Any], *,
              placement: Placement = ANYWHERE, **kwargs: Any) -> list[Any]:
    """``[fn(a, **kwargs) for a in args]``, one Ray task (1 CPU) per ``a``, all submitted at
    once, on the nodes ``placement`` allows (:mod:`~components.data.build.placement`);
    ``kwargs`` is stored once in the object store. A task's PreprocessError (which Ray wraps)
    is re-raised as is, and the tasks still queued or running are cancelled.

    Plain tasks, not a Ray Data stage: with every task queued, a worker's lease passes straight
    to the next task, where Ray Data's executor submits one only after it sees another finish
    (0.1–0.4 s idle per task on busy cores): the content pass over 24,000 photos took 13.5 s
    this way on 2 CPUs against 16.3–17.3 s as a Ray Data stage, and the same 27 s on 1 CPU
    (docs/benchmarks.md)."""
    return list(iter_tasks(fn, args, placement=placement, **kwargs))


def iter_tasks(fn: Callable[..., Any], args: Sequence[Any], *,
               placement: Placement = ANYWHERE, **kwargs: Any) -> Iterator[Any]:
    """:func:`map_tasks`, its results handed over one at a time, in order (every task is
    submitted first): the caller stores each and lets it go, instead of holding them all."""
    import ray

    task = ray.remote(num_cpus=1)(_call)
    shared = ray.put(kwargs)
    refs: list[Any] = [task.options(**placement.task_options(k)).remote(fn, a, shared)
                       for k, a in enumerate(args)]
    try:
        for k in range(len(refs)):
            yield ray.get(refs[k])
            refs[k] = None  # its object can go once the caller is done with it
    except BaseException as e:
        for r in refs:
            if r is not None:
                ray.cancel(r, force=False)
        cause = root_cause(e)
        if isinstance(cause, PreprocessError):
            raise PreprocessError(str(cause)) from None
        raise
