"""Files and storage: local files written whole (`files.py`), where relative paths point
(`paths.py`), run / sweep / dataset dirs on disk or in object stores with their one-writer locks
(`storage.py`)."""
