"""A trained encoder as files: the export formats, and embeddings of images."""

from components import old_module_getattr

# components.export was a module: what it had is found in components.export.formats
__getattr__ = old_module_getattr(__name__, "formats")
