"""A trained encoder as files: the export formats, and embeddings of images."""

from components import old_module_getattr

# components.export was a module: what it had is found in components.export.formats and the
# modules formats.py was split into (issue 41); old pickles and imports name it.
__getattr__ = old_module_getattr(__name__, "formats", "architecture", "model_file", "card",
                                 "export_dir")
