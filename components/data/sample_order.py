"""Which samples each DDP rank reads in an epoch, and the FFCV traversal order that applies it.

:func:`rank_order` (FFCV's side: the ``RankOrder`` that :func:`order_factory` builds) permutes
the whole split with ``default_rng([seed, epoch])`` (the same on every rank) and deals it out
``perm[rank::W]``, so ranks see disjoint samples, a new shuffle each epoch, reproducible from
(seed, epoch). With ``drop_last`` the permutation is cut to a multiple of ``W × batch`` first,
so every rank runs the same number of steps (DDP collectives need that) and nothing is
repeated; without it every sample is read exactly once (evaluation). FFCV's own
``distributed=True`` pads with repeats (``DistributedSampler``), which is why it is not used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def rank_order(
    n: int, *, seed: int, epoch: int, rank: int, world_size: int, batch_size: int,
    shuffle: bool, drop_last: bool,
) -> np.ndarray:
    """The sample indices ``rank`` reads in ``epoch`` (see the module docstring)."""
    perm = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    if drop_last:
        perm = perm[: (n // (world_size * batch_size)) * world_size * batch_size]
    return perm[rank::world_size]


def order_factory(max_batches: int | None = None, **kwargs: Any) -> Any:
    """A ``TraversalOrder`` for FFCV's Loader.

    FFCV 1.0.2 accepts a custom order only as an *instance* that it then calls with the loader
    (``order(self)`` after ``isinstance(order, TraversalOrder)``), so the instance is a factory.
    """
    from ffcv.traversal_order.base import TraversalOrder

    class RankOrder(TraversalOrder):
        def __init__(self, loader: Any) -> None:
            super().__init__(loader)

        def sample_order(self, epoch: int) -> Sequence[int]:
            idx = np.asarray(self.indices)
            pick = rank_order(len(idx), epoch=epoch, **kwargs)
            if max_batches is not None:  # a capped epoch: the first batches of this order
                pick = pick[: max_batches * kwargs["batch_size"]]
            return idx[pick]

    class Factory(TraversalOrder):
        def __init__(self) -> None:  # built before the loader exists
            pass

        def __call__(self, loader: Any) -> TraversalOrder:
            return RankOrder(loader)

        def sample_order(self, epoch: int) -> Sequence[int]:
            raise NotImplementedError

    return Factory()
