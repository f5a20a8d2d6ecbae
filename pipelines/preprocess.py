"""``simgraph preprocess CONFIG [key=value ...] [--overwrite]``: images → FFCV dataset dir.

The build itself (list → hash and dedupe → split → embed captions → decode and write shards →
merge, resumable shard by shard) is :mod:`components.data.build`; this entry point loads the
config, runs it and prints the split summary. Output directory::

    manifest.json  train.beton  val.beton  test.beton  classes.json
    class_embeddings.npy  class_similarity.npy   (labelled data with captions enabled)
    caption_embeddings.npy (+ .json)  captions.json  caption_index.npy  content.npz
"""

from __future__ import annotations

from collections.abc import Sequence

from components.config import PreprocessConfig, load_config
from components.data.build import PreprocessError, run, summary
from components.errors import run_command


def main(config: str, overrides: Sequence[str], overwrite: bool = False) -> int:
    return run_command("preprocess", lambda: run(load_config(config, PreprocessConfig, overrides),
                                                 overwrite=overwrite))


__all__ = ["PreprocessError", "main", "run", "summary"]
