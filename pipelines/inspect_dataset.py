"""``simgraph inspect DATASET_DIR [--out DIR] [--per-class N]``: look at a dataset dir.

Writes ``report.md`` and PNGs (default ``DATASET_DIR/inspect/``): splits and counts, samples
per class as stored, class counts, captions, duplicates, skipped items. The engine and what
each part shows: :mod:`components.data.inspection`.
"""

from __future__ import annotations

from components.data import inspection
from components.errors import run_command


def main(dataset: str, out: str | None = None, per_class: int = 8) -> int:
    return run_command("inspect", lambda: print(f"simgraph inspect: wrote "
                                                f"{inspection.run(dataset, out, per_class)}"))
