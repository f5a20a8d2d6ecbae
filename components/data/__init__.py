"""Data components: sources, image decoding, caption embedding, FFCV shards and the reader.

The preprocess pipeline (``pipelines/preprocess.py``) composes the pieces here with Ray Data;
training reads the result through :mod:`components.data.reader`.
"""

from components.data import ffcv_import

ffcv_import.install()  # before anything here imports FFCV: see ffcv_import's docstring
