"""A run: its dir and the one reader of it (`run_dir.py`), checkpoints (`checkpoint.py`), the
recipe that trains it (`recipe.py`) and where it runs (`hosts.py`), what it prints first
(`summary.py`), and its checkpoint scored on a split (`scoring.py`)."""
