"""Deprecated: where ``ShardedModelState``, ``StreamioWriter`` and ``StreamioReader`` were documented in 0.2.0.

They are :mod:`streamio.checkpoint`'s own names now (``from streamio.checkpoint import
ShardedModelState, StreamioWriter, StreamioReader``), defined in :mod:`streamio.checkpoint.tensors.app_state`
and :mod:`streamio.checkpoint.dcp`. Their names here still work, each use with a
``DeprecationWarning``, until streamio 0.3.0 removes this module.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamio.deprecation import moved_name

__all__: list[str] = []  # nothing new is to be imported from here

_MOVED = {
    "ShardedModelState": "streamio.checkpoint.tensors.app_state",
    "StreamioWriter": "streamio.checkpoint.dcp.writer",
    "StreamioReader": "streamio.checkpoint.dcp.reader",
}


def __getattr__(name: str) -> Any:
    """The moved name from its module (imported on first use: torch DCP costs a second), with a
    ``DeprecationWarning``."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    return moved_name(f"streamio.checkpoint.sharded.{name}", f"streamio.checkpoint.{name}", value)
