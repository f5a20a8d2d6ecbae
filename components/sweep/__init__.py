"""A sweep's library: where it lives and its error (`layout.py`), its Tune state and whether a
resume may unpickle it (`state.py`), the confirmation stage (`confirmation.py`), its figures
and settings statistics (`plots.py`), its Optuna study, importances and export (`study.py`),
Tune's TensorBoard logger (`tune_loggers.py`). `pipelines/sweep.py` drives them."""
