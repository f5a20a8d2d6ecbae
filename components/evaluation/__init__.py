"""Evaluation metrics on frozen embeddings (weighted kNN classifier; see :mod:`.knn`)."""
