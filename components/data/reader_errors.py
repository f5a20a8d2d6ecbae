"""What reading a split file raises besides :class:`~components.data.reader.DatasetError`
(which stays with :class:`~components.data.reader.DatasetInfo`): a bad reader setting, the
failure or stall of FFCV's loader thread.

Here, below :mod:`components.data.reader`, so :mod:`components.data.devices` and
:mod:`components.data.loader_thread` raise them without importing the reader. The reader still
exposes them by their old names (Tune pickles a trial's error, ``error.pkl``, by class path).
"""

from __future__ import annotations

from components.errors import SimgraphError


class ReaderSettingError(SimgraphError, ValueError):
    """A bad reader setting: a device that is not ``cpu`` / ``cuda:N`` (or a GPU torch cannot
    see), a bad stall timeout. Exit 2, as a bad argument."""

    exit_code = 2


class LoaderError(SimgraphError, RuntimeError):
    """FFCV's loader thread failed while reading a split file; the message names the file and
    holds the thread's traceback (the thread's exception is the ``__cause__``)."""


class LoaderStalledError(LoaderError):
    """FFCV's loader thread produced no batch within the stall timeout."""
