"""Labels as a source gives them — integer class indices or class names — and the class list
and label -> class index map a listing derives from them (:func:`label_names`), shared by the
manifest and shard sources."""

from __future__ import annotations

from collections.abc import Sequence


def _is_index(lab: object) -> bool:
    return isinstance(lab, int) and not isinstance(lab, bool)


def label_names(
    raw: Sequence[object], classes: Sequence[str] | None
) -> tuple[list[str], dict[int | str, int]]:
    """The class list and a label -> index map (keys: :func:`label_key`) for labels as a table
    or a shard gives them (``None``: no label). An integer is a class index, anything else a
    class name by its text. With ``classes`` both resolve (an index into it, a name in it).
    Without, the kind most of the distinct labels are sets the classes — indices: ``"0"`` ...
    the largest; names: the sorted names — and a label of the other kind (ImageNet's ``.cls``
    indices with one ``n/a``) is not a class: one counted ``unknown-label``
    (:func:`label_problem`), not every item of the other kind."""
    present = list(dict.fromkeys(lab for lab in raw if lab is not None))
    ints = [int(x) for x in present if _is_index(x)]  # type: ignore[call-overload]
    index: dict[int | str, int]
    if classes:
        names = list(classes)
        index = {i: i for i in range(len(names))} if ints else {}
        if len(ints) < len(present):
            index.update({n: i for i, n in enumerate(names)})
        return names, index
    if ints and 2 * len(ints) >= len(present):
        names = [str(i) for i in range(max(ints) + 1)]
        return names, {i: i for i in range(len(names))}
    names = sorted({str(x) for x in present if not _is_index(x)})
    return names, {n: i for i, n in enumerate(names)}


def label_key(lab: object) -> int | str:
    """The key of a raw label in :func:`label_names`'s map."""
    return int(lab) if _is_index(lab) else str(lab)  # type: ignore[call-overload]


def label_problem(lab: object, names: Sequence[str], index: dict[int | str, int]) -> str:
    """Why the raw label ``lab`` has no class in :func:`label_names`'s ``(names, index)``."""
    by_index = any(isinstance(k, int) for k in index)
    by_name = any(isinstance(k, str) for k in index)
    if _is_index(lab) and by_name and not by_index:
        return (f"label {lab!r} is an integer where the other labels are class names; give it "
                "its name, or list the classes in source.classes (an integer then indexes it)")
    if not _is_index(lab) and by_index and not by_name:
        return (f"label {lab!r} is a name where the other labels are class indices "
                "(integers); give it its index, or list the classes in source.classes (names "
                "and indices then both resolve)")
    return f"label {lab!r} is not one of the {len(names)} classes"
