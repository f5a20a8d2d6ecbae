"""A run: its dir, its one writer and one reader (`run_dir.py`), the dataset checks before it
starts (`dataset_checks.py`), what a resume may change (`resume.py`), one checkpoint's format
(`checkpoint.py`) and a run dir's checkpoints: naming, publishing, pruning, the newest complete
one (`checkpoints.py`), the recipe: where it is started and what Ray is handed (`recipe.py`),
what each worker does (`worker.py`), rank 0's metrics log (`run_log.py`), data-wait timing,
worker records and fault injection (`diagnostics.py`), where it runs (`hosts.py`), its error
(`errors.py`), what it prints first (`summary.py`), and its checkpoint scored on a split
(`scoring.py`)."""
