"""Deterministic, stratified train/val/test assignment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPLITS = ("train", "val", "test")


def _check_fractions(val: float, test: float) -> None:
    if not 0 <= val < 1 or not 0 <= test < 1 or val + test >= 1:
        raise ValueError(
            f"split.val={val} and split.test={test} must be in [0, 1) and sum to less than 1"
        )


def assign_splits(
    labels: Sequence[int] | np.ndarray,
    official: Sequence[str | None],
    val: float,
    test: float,
    seed: int,
    groups: Sequence[int] | np.ndarray | None = None,
) -> list[str]:
    """One split name per item, stratified by label, a pure function of the inputs.

    Items with an official split keep it, except that ``val`` is carved out of the official
    train part when no item's official split is val (a published validation split).
    Otherwise each class (unlabelled items form one group) is permuted with
    ``numpy.random.default_rng([seed, class])`` and cut into test / val / train with
    ``round(n * fraction)`` items, so adding a class does not reshuffle the others.

    ``groups``: item i belongs to group ``groups[i]`` (any int; e.g. the index of the group's
    first member). A group is placed whole: it is stratified by its first member's label and
    permuted as one unit, and it joins test (then val) while that brings the split's count
    closer to its target. With only singleton groups this is exactly the ungrouped assignment.
    Free members of a group that also holds official items follow its first official member.
    """
    _check_fractions(val, test)
    if groups is not None:
        return _assign_grouped(labels, official, val, test, seed, groups)
    n = len(labels)
    out = ["train"] * n
    lab = np.asarray(labels, dtype=np.int64)
    has_official = np.array([o is not None for o in official], dtype=bool)
    carve = _carved_val(official, val)
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
            for i in perm[: round(len(perm) * carve)]:
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


def assign_split_codes(
    labels: Sequence[int] | np.ndarray,
    official: Sequence[str | None] | None,
    val: float,
    test: float,
    seed: int,
    groups: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """:func:`assign_splits` as each item's index into :data:`SPLITS` (``[n]`` int8);
    ``official`` ``None``: no item has one. Grouped items without official splits are assigned
    on arrays throughout (no str or list per item: a build's plan at CC12M's 12M items)."""
    if official is None and groups is not None:
        _check_fractions(val, test)
        return _grouped_free_codes(labels, val, test, seed, groups)
    n = len(labels)
    names = assign_splits(labels, [None] * n if official is None else official, val, test,
                          seed, groups)
    code_of = {sp: k for k, sp in enumerate(SPLITS)}
    return np.fromiter((code_of[sp] for sp in names), dtype=np.int8, count=n)


def _carved_val(official: Sequence[str | None], val: float) -> float:
    """The fraction of the official train part made val: ``val``, or none when the official
    splits have their own val (a Hugging Face DatasetDict's ``validation``)."""
    return 0.0 if any(o == "val" for o in official) else val


def _take(units: np.ndarray, sizes: dict[int, int], n_test: int, n_val: int) -> dict[int, str]:
    """Walk the permuted units: test while that gets closer to ``n_test``, then val, else
    train."""
    out, got_test, got_val = {}, 0, 0
    for u in units.tolist():
        k = sizes[u]
        if abs(got_test + k - n_test) < abs(got_test - n_test):
            out[u], got_test = "test", got_test + k
        elif abs(got_val + k - n_val) < abs(got_val - n_val):
            out[u], got_val = "val", got_val + k
        else:
            out[u] = "train"
    return out


def _assign_grouped_free(
    labels: Sequence[int] | np.ndarray, val: float, test: float, seed: int,
    groups: Sequence[int] | np.ndarray,
) -> list[str]:
    return [SPLITS[c] for c in _grouped_free_codes(labels, val, test, seed, groups).tolist()]


def _grouped_free_codes(
    labels: Sequence[int] | np.ndarray, val: float, test: float, seed: int,
    groups: Sequence[int] | np.ndarray,
) -> np.ndarray:
    """:func:`_assign_grouped` when no item has an official split, on arrays (each item's
    index into :data:`SPLITS`, int8): the same
    assignment (the same units, heads, permutations and walk), without a list or dict per
    group (the driver's plan at 12M items held ~400 B an item in them)."""
    lab = np.asarray(labels)
    if lab.dtype.kind not in "iu":
        lab = lab.astype(np.int64)
    g = np.asarray(groups, dtype=np.int64)
    if not len(g):
        return np.zeros(0, dtype=np.int8)
    roots = _root_units(g)
    if roots is None:
        _, heads, inverse = np.unique(g, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        heads, inverse = roots
    sizes = np.bincount(inverse)  # [units]
    unit_code = np.zeros(len(heads), dtype=np.int8)  # 0 train, 1 val, 2 test
    head_label = lab[heads]
    del lab
    for cls in np.unique(head_label).tolist():
        units = np.flatnonzero(head_label == cls)
        h = heads[units]
        if len(h) > 1 and not bool(np.all(h[1:] > h[:-1])):  # roots as groups: sorted already
            by = np.argsort(h, kind="stable")  # by head, ascending
            units, h = units[by], h[by]
        rng = np.random.default_rng([seed, cls + 1])
        perm = rng.permutation(h)
        order = units[np.searchsorted(h, perm)]  # the permuted heads' units
        k = sizes[order]
        n_items = int(k.sum())
        n_test, n_val = round(n_items * test), round(n_items * val)
        got_test = got_val = 0
        codes = np.zeros(len(order), dtype=np.int8)
        for j, size in enumerate(k.tolist()):  # _take's walk
            if abs(got_test + size - n_test) < abs(got_test - n_test):
                codes[j], got_test = 2, got_test + size
            elif abs(got_val + size - n_val) < abs(got_val - n_val):
                codes[j], got_val = 1, got_val + size
        unit_code[order] = codes
    return unit_code[inverse]


_CHECK = 1 << 20  # items checked at a time by _root_units


def _root_units(g: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(heads, inverse)`` as ``np.unique(g, return_index=True, return_inverse=True)`` gives
    them when ``g`` are roots (``g[i] <= i`` and ``g[g[i]] == g[i]``: each item's group named
    by its first member's index, as :func:`~components.data.integrity.group_roots` gives;
    a build's plan), found without a sort: a unit's head is where ``g[i] == i``, its number
    the heads before it. None when ``g`` is not roots. Per item: 8 B of inverse and a check
    chunk's (np.unique: ~45 B an item of sort order, sorted copy, mask and cumsums)."""
    n = len(g)
    is_head = np.empty(n, dtype=bool)
    for s in range(0, n, _CHECK):
        part = g[s:s + _CHECK]
        at = np.arange(s, s + len(part))
        if bool(np.any(part > at)) or bool(np.any(part < 0)) or bool(np.any(g[part] != part)):
            return None
        is_head[s:s + len(part)] = part == at
    number = np.cumsum(is_head, dtype=np.int64)
    number -= 1
    return np.flatnonzero(is_head), number[g]


def _assign_grouped(
    labels: Sequence[int] | np.ndarray,
    official: Sequence[str | None],
    val: float,
    test: float,
    seed: int,
    groups: Sequence[int] | np.ndarray,
) -> list[str]:
    if all(o is None for o in official):
        return _assign_grouped_free(labels, val, test, seed, groups)
    return _assign_grouped_lists(labels, official, val, test, seed, groups)


def _assign_grouped_lists(
    labels: Sequence[int] | np.ndarray,
    official: Sequence[str | None],
    val: float,
    test: float,
    seed: int,
    groups: Sequence[int] | np.ndarray,
) -> list[str]:
    n = len(labels)
    lab = np.asarray(labels, dtype=np.int64)
    out = [str(o) if o is not None else "train" for o in official]
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(int(g), []).append(i)
    # A unit is a group's members that share an official split (or have none); it is named
    # by its first member, so singleton units permute exactly like the ungrouped items.
    units: dict[int, list[int]] = {}
    for mem in members.values():
        first_official = next((i for i in mem if official[i] is not None), None)
        for key in (None, "train", "val", "test"):
            part = [i for i in mem if official[i] == key]
            if not part:
                continue
            if key is None and first_official is not None:
                for i in part:  # free items ride with the group's official split
                    out[i] = str(official[first_official])
                continue
            units[part[0]] = part
    by_class: dict[int, list[int]] = {}
    for head in sorted(units):
        by_class.setdefault(int(lab[head]), []).append(head)
    carve = _carved_val(official, val)
    for cls in sorted(by_class):
        heads = np.array(by_class[cls], dtype=np.int64)
        is_off = np.array([official[h] is not None for h in heads], dtype=bool)
        off_train = heads[is_off & np.array([official[h] == "train" for h in heads], bool)]
        free = heads[~is_off]
        sizes = {int(h): len(units[int(h)]) for h in heads}
        rng = np.random.default_rng([seed, cls + 1])
        if len(off_train):
            perm = rng.permutation(off_train)
            n_items = sum(sizes[int(h)] for h in perm)
            for h, s in _take(perm, sizes, 0, round(n_items * carve)).items():
                for i in units[h]:
                    out[i] = s
        if len(free):
            perm = rng.permutation(free)
            n_items = sum(sizes[int(h)] for h in perm)
            placed = _take(perm, sizes, round(n_items * test), round(n_items * val))
            for h, s in placed.items():
                for i in units[h]:
                    out[i] = s
    assert len(out) == n
    return out
