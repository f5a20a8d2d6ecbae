"""``simgraph sweep SPACE.yaml [--resume] [--confirm] [key=value ...]``: Ray Tune + Optuna over
pretraining.

The engine is ``components/sweep/``: :func:`components.sweep.driver.run` loads the search
space, runs (or resumes) the sweep under the sweep dir's lock, writes its results and runs its
confirmation stage; what it prints is the command's output. This module parses nothing itself
(``pipelines/cli.py`` does) and reports errors through
:func:`components.errors.run_command`.
"""

from __future__ import annotations

from collections.abc import Sequence

from components.errors import run_command

# The two `x as x` imports: pickled by path in older sweep dirs. Their Tune state (tuner.pkl,
# experiment_state-*.json) names the trainable pipelines.sweep.trial_fn; confirm_fn went to
# Ray tasks from here too.
from components.sweep.confirm_runs import confirm_fn as confirm_fn
from components.sweep.driver import run
from components.sweep.tuner import trial_fn as trial_fn


def main(space: str, overrides: Sequence[str], resume: bool = False,
         trust: bool = False, confirm_only: bool = False) -> int:
    return run_command("sweep", lambda: run(space, overrides, resume=resume, trust=trust,
                                            confirm_only=confirm_only))
