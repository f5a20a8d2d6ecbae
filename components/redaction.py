"""Credentials never leave in text: the ``user:password@`` of every URI removed from a string
(:func:`redact`) or from a config as plain containers (:func:`redacted`), before it is
written, logged or printed. A base module (nothing imported): errors, storage, trackers and
manifests all use it."""

from __future__ import annotations

import re
from typing import Any

# ``scheme://userinfo@``: the scheme as RFC 3986 spells it, then a user and an "@" before any
# "/" (an "@" in a path is left alone), or ``user:password@`` whose password may hold a raw "/"
# (AWS secret keys do; pyarrow refuses such a URI, but its error message would still show it)
# unless it is a port: ``http://host:80/p@x`` is left alone.
_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.\-])([A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?:[^/?#@\s:]*:(?!\d+[/?#])[^?#@\s]*|[^/?#@\s]*)@")


def redact(value: str) -> str:
    """``value`` with the ``user:password@`` of every URI in it removed
    (``s3://KEY:SECRET@bucket/runs?region=x`` → ``s3://bucket/runs?region=x``; also inside
    longer strings such as ``storage=s3://KEY:SECRET@bucket`` or a database URL
    ``postgresql://user:pw@host/db``). Anything else is returned as it is."""
    return _USERINFO.sub(r"\1", value) if "@" in value else value


def redacted(value: Any) -> Any:
    """A copy of ``value`` (a config as plain containers: dicts, lists, tuples, strings,
    numbers) with :func:`redact` applied to every string in it, keys included; what is written
    to config files, checkpoints, trackers and job metadata."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redacted(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redacted(v) for v in value)
    return value


def has_credentials(value: Any) -> bool:
    """Whether :func:`redacted` would change ``value``: it holds a URI with credentials."""
    return bool(redacted(value) != value)
