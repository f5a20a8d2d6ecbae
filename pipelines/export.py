"""``simgraph export RUN_DIR [--checkpoint DIR] [--format safetensors|torchscript|onnx]
[--projector] [--out DIR]``: a trained encoder as files that load without simgraph.

The engine, top to bottom (load the run and a checkpoint, write and check the format asked
for, describe it in ``config.json`` and ``model_card.md``), and which files of ``--out``
(default ``<run>/export/``; a path or URI) it may replace:
:func:`components.export.run_export.export_run`.
"""

from __future__ import annotations

from components.errors import run_command
from components.export.formats import CARD, check_format
from components.export.run_export import export_run
from components.io.paths import resolve_path
from components.io.storage import join


def main(run_dir: str, checkpoint: str | None = None, fmt: str = "safetensors",
         projector: bool = False, out: str | None = None) -> int:
    def body() -> None:
        check_format(fmt)  # before any loading: a typo fails at once
        run = resolve_path(run_dir)  # relative: against $SIMGRAPH_BASE_DIR
        dest = export_run(run, resolve_path(checkpoint) if checkpoint else None, fmt,
                          projector, resolve_path(out) if out else None)
        print(join(dest, CARD))

    return run_command("export", body)


__all__ = ["main"]
