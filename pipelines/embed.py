"""``simgraph embed RUN_DIR --data DATASET_DIR_OR_IMAGE_FOLDER [--split S] [--projector]
[--checkpoint DIR] [--device cpu|cuda:N] --out FILE.parquet``: one embedding per image, as a
Parquet file.

The engine, top to bottom (what ``--data`` is, the run's checkpoint, one centre view per image
as evaluation sees it, ``--out`` written whole or not at all):
:func:`components.export.run_embed.embed_run`.
"""

from __future__ import annotations

from components.errors import run_command
from components.export.run_embed import embed_run
from components.io.paths import resolve_path


def main(run_dir: str, data: str, out: str, split: str | None = None, projector: bool = False,
         checkpoint: str | None = None, device: str | None = None) -> int:
    def body() -> None:
        # relative paths: against $SIMGRAPH_BASE_DIR
        dest = resolve_path(out)
        got = embed_run(resolve_path(run_dir), resolve_path(data), dest, split=split,
                        projector=projector,
                        checkpoint=resolve_path(checkpoint) if checkpoint else None,
                        device=device)
        rate = got["rows"] / max(got["seconds"], 1e-9)
        print(f"simgraph embed: {got['rows']} images, {got['dim']}-d {got['feature']} "
              f"features in {got['seconds']:.1f} s ({rate:.0f} images/s)")
        print(dest)

    return run_command("embed", body)


__all__ = ["main"]
