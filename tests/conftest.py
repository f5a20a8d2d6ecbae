"""Shared fixtures: deterministic seeds, the float64 default used by exactness tests, a local
Ray for preprocessing tests, FFCV's JIT off (``no_jit``) and the S3 stand-in."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator

import pytest
import torch

from tests.support.s3 import s3_endpoint, s3_uri  # noqa: F401

# The suite runs offline (make test uses a loopback-only namespace); make libraries agree.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with the most ``slow`` tests first, each file's tests in their order: ``make
    test`` gives whole files to its two pytest-xdist workers in this order (``--dist loadfile
    --no-loadscope-reorder``), so the long end-to-end files start early instead of one running
    alone at the end (xdist's own order, most tests first, put them last: ~75 s longer in a
    simulation over the suite's measured per-file times, 2026-11-27)."""
    def path(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    slow = collections.Counter(path(i) for i in items if i.get_closest_marker("slow"))
    items.sort(key=lambda i: -slow[path(i)])  # stable: otherwise collection order


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def no_jit() -> Iterator[None]:
    """FFCV's pipelines without numba compiling (15-45 s a loader): a module opts in with
    ``pytestmark = pytest.mark.usefixtures("no_jit")``."""
    from components.data.reader import set_jit

    set_jit(False)
    yield
    set_jit(True)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray for one test module's preprocessing builds (2 CPUs, no dashboard)."""
    import ray

    ray.init(num_cpus=2, object_store_memory=1 << 30, include_dashboard=False,
             log_to_driver=False)
    yield
    ray.shutdown()

