"""The build's clock: each stage's wall seconds in one build (:class:`BuildTimes`), written into
``manifest.json`` as ``build_seconds`` (``{stage: seconds}``, every stage of :data:`STAGES`,
0 for a stage that did not run). Not part of the dataset's identity (``params_digest``,
``components/data/identity.py``): two builds of the same source give the same files and the
same manifest but for ``created`` and ``build_seconds``. A resumed build records the seconds of
the run that wrote the manifest (a stage whose work was already done: its checks only)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

# In the order they run. listing and source_record are the caller's (transaction.py: the
# source listed, then recorded: made, and written to source.json.gz before the manifest);
# ray: starting and stopping the local Ray (0 when one is running already), and on a cluster
# the check of which nodes see the build dir (placement.py); hashing: the
# content pass; near_duplicates: ``integrity.near_duplicate_pairs`` inside planning.plan;
# planning: the rest of the plan (skips, exact duplicates, splits, shards) and each shard's
# digest; captions: the text model loaded, the backend chosen, class files and the caption
# table embedded; shards: decoding and writing the shards; merge: the split files; manifest:
# assembling manifest.json (up to its own serialisation).
STAGES = ("listing", "source_record", "ray", "hashing", "near_duplicates", "planning",
          "captions", "shards", "merge", "manifest")


@dataclasses.dataclass
class BuildTimes:
    """Wall seconds per stage of :data:`STAGES`, summed over every time a stage ran. Nested
    stages count once: :meth:`stage` gives the outer stage its own seconds, less those
    recorded inside it."""

    seconds: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def add(self, stage: str, seconds: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown build stage {stage!r}: one of {', '.join(STAGES)}")
        if not seconds >= 0:  # NaN too
            raise ValueError(f"build stage {stage}: {seconds} seconds (must be >= 0)")
        self.seconds[stage] += seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block under ``name`` (also when it raises), less the seconds of the
        stages timed inside it."""
        if name not in STAGES:
            raise ValueError(f"unknown build stage {name!r}: one of {', '.join(STAGES)}")
        t0, inner = time.perf_counter(), sum(self.seconds.values())
        try:
            yield
        finally:
            took = time.perf_counter() - t0 - (sum(self.seconds.values()) - inner)
            self.add(name, max(took, 0.0))

    def as_dict(self) -> dict[str, float]:
        """The manifest's ``build_seconds``: every stage in :data:`STAGES`' order, to the ms."""
        return {k: round(self.seconds[k], 3) for k in STAGES}

    def line(self) -> str:
        """One line for ``--verbose``: each stage's seconds and their total."""
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.as_dict().items())
        return f"seconds by stage: {parts} (total {sum(self.seconds.values()):.1f} s)"
