"""``simgraph evaluate RUN_DIR [RUN_DIR ...] [--checkpoint PATH] [--projector] [--out DIR]
[--labels MAP.yaml] [--no-baseline] [--device cpu|cuda:N]``.

For each run, top to bottom:

1. Load the run's ``config.yaml`` and a checkpoint (the newest complete one, or
   ``--checkpoint``); refuse a checkpoint written under another config and a dataset dir
   whose content differs from the one the run trained on (checkpoints record its identity).
2. Extract frozen features (backbone, or projector with ``--projector``) of one centre view of
   every image of the bank split (train) and the query split (test, else val), batched, with
   a progress bar; on ``--device`` (default: ``cuda:0`` when torch sees a GPU, else the CPU;
   :func:`components.data.devices.resolve_device`).
3. Metrics (``components/evaluation``): weighted kNN (Wu et al. 2018, votes exp(cos/0.07)) for
   k ∈ {1, 5, 10, 20, 50, 100, 200}, top-1/top-5; a linear probe on standardised features;
   SINCERE's target–noise separation (median margin, overlap); label error and intra-class
   connectivity of the test kNN graph (definitions in ``components/evaluation/graph.py``);
   learned class-similarity matrix next to the target one (X-CLR Fig. 4); per-class kNN
   recall, a t-SNE map of the query features and a grid of nearest neighbours
   (``components/evaluation/visuals.py``).
4. Unless ``--no-baseline``: the same features and the kNN (headline k) and probe of the
   random-init encoder of the run's config (the weights it started from,
   ``components/evaluation/baseline.py``): a ``random init`` row in every table and the run's
   paired gain over it.
5. Write ``<run>/eval/report.md``, ``metrics.json``, PNG plots and ``embedding_map.csv``
   (``<run>/eval-<map>/`` when ``--labels`` scores the run against groups of its classes:
   every metric then uses the group as the label). With several runs, also a
   comparison table and overlaid plots in ``--out`` (default: ``<storage>/comparison``).

Steps 1–4: :func:`components.runs.evaluate.evaluate_run`; step 5:
:mod:`components.evaluation.report`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from components.errors import run_command
from components.evaluation.report import (
    comparison_table,
    interval_table,
    write_comparison,
    write_report,
)
from components.runs.evaluate import evaluate_run


def main(run_dirs: Sequence[str], checkpoint: str | None = None, projector: bool = False,
         out: str | None = None, labels: str | None = None, baseline: bool = True,
         device: str | None = None) -> int:
    if checkpoint is not None and len(run_dirs) != 1:
        print("simgraph evaluate: --checkpoint needs exactly one RUN_DIR", file=sys.stderr)
        return 2
    from components.io.paths import resolve_path

    run_dirs = [resolve_path(d) for d in run_dirs]  # relative: against $SIMGRAPH_BASE_DIR
    out = resolve_path(out) if out else None
    evals = []

    def each() -> None:
        for d in run_dirs:
            e = evaluate_run(d, checkpoint, projector=projector, labels=labels,
                             baseline=baseline, device=device)
            print(f"{write_report(e)}")
            evals.append(e)

    code = run_command("evaluate", each)
    if code:
        return code
    print(comparison_table(evals))
    print(interval_table(evals))
    if len(evals) > 1:
        from components.io.storage import join, parent

        where = out or join(parent(run_dirs[0]), "comparison")
        print(write_comparison(evals, where))
    return 0
