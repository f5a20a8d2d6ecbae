"""A trained encoder as files: the export formats, and embeddings of images."""

from typing import Any

from components import old_module_getattr

# components.export was a module: what it had is found in components.export.formats and the
# modules formats.py was split into (issue 41); old pickles and imports name it.
_OLD_MODULE = [old_module_getattr(__name__, m)
               for m in ("formats", "architecture", "model_file", "card", "export_dir")]


def __getattr__(name: str) -> Any:
    for getattr_ in _OLD_MODULE:
        try:
            return getattr_(name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
