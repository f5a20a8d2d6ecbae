"""What runs around the library: the Ray session (`session.py`), what a command prints
(`console.py`), the collectives that make DDP exact (`distributed.py`)."""
