"""Data components: sources, image decoding, caption embedding, FFCV shards and the reader.

The preprocess pipeline (``pipelines/preprocess.py``) composes the pieces here with Ray Data;
training reads the result through :mod:`components.data.reader`.
"""
