"""Code a test runs in a fresh interpreter that must not need simgraph."""

# The start of a script that loads an export as a user without simgraph would: importing
# ``components`` / ``pipelines`` / ``tests`` raises (the venv's editable install would
# otherwise make them importable from anywhere). Scripts append their own code.
NO_SIMGRAPH = r'''
import importlib.abc
import sys


class NoSimgraph(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("components", "pipelines", "tests"):
            raise ImportError(name + ": simgraph must not be needed to load an export")
        return None


sys.meta_path.insert(0, NoSimgraph())
'''
