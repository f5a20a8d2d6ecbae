"""Deterministic, stratified train/val/test assignment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPLITS = ("train", "val", "test")


def assign_splits(
    labels: Sequence[int],
    official: Sequence[str | None],
    val: float,
    test: float,
    seed: int,
) -> list[str]:
    """One split name per item, stratified by label, a pure function of the inputs.

    Items with an official split keep it, except that ``val`` is carved out of the official
    train part. Otherwise each class (unlabelled items form one group) is permuted with
    ``numpy.random.default_rng([seed, class])`` and cut into test / val / train with
    ``round(n * fraction)`` items, so adding a class does not reshuffle the others.
    """
    if not 0 <= val < 1 or not 0 <= test < 1 or val + test >= 1:
        raise ValueError(
            f"split.val={val} and split.test={test} must be in [0, 1) and sum to less than 1"
        )
    n = len(labels)
    out = ["train"] * n
    lab = np.asarray(labels, dtype=np.int64)
    has_official = np.array([o is not None for o in official], dtype=bool)
    for i in np.flatnonzero(has_official):
        out[i] = str(official[int(i)])
    for cls in np.unique(lab):
        members = np.flatnonzero(lab == cls)
        official_train = members[has_official[members]]
        official_train = official_train[[out[i] == "train" for i in official_train]]
        free = members[~has_official[members]]
        rng = np.random.default_rng([seed, int(cls) + 1])
        if len(official_train):
            perm = rng.permutation(official_train)
            for i in perm[: round(len(perm) * val)]:
                out[i] = "val"
        if len(free):
            perm = rng.permutation(free)
            n_test = round(len(perm) * test)
            n_val = round(len(perm) * val)
            for i in perm[:n_test]:
                out[i] = "test"
            for i in perm[n_test : n_test + n_val]:
                out[i] = "val"
    return out
