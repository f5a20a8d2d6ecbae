"""A sweep's library: where it lives, the names of its shared files and its error
(`layout.py`), a sweep from start to end (`driver.py`: `run`, what `simgraph sweep` calls),
its Ray Tune wiring (`tuner.py`: the trial trainable, Tuner, searcher, scheduler,
concurrency), the start record and the checks before a resume (`resume.py`), its Tune state
and whether a resume may unpickle it (`state.py`), its results (`results.py`: trial rows,
tables, `trials.*`, `best.yaml`), the confirmation stage (`confirmation.py`: what to confirm
and its statistics; `confirm_runs.py`: the runs and their files), its figures and settings
statistics (`plots.py`), its Optuna study, importances and export (`study.py`), Tune's
TensorBoard logger (`tune_loggers.py`). `pipelines/sweep.py` is the command over `driver.run`."""
