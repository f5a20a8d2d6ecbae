"""A sweep's state in its dir (`state.py`), its confirmation stage (`confirmation.py`), Tune's
TensorBoard logger (`tune_loggers.py`)."""
