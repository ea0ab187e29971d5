"""Deprecated: where ``RNGState`` lived in streamio 0.1 (``from streamio.state import RNGState``).

``RNGState`` is :class:`streamio.RNGState` (:mod:`streamio.checkpoint.rng`). Its names here still
work, each use with a ``DeprecationWarning``, until streamio 0.3.0 removes this module.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamio.deprecation import moved_name

__all__: list[str] = []  # nothing new is to be imported from here

_MOVED = {"RNGState": "streamio.RNGState (or streamio.checkpoint.RNGState)",
          "STATE_VERSION": "streamio.checkpoint.rng.STATE_VERSION"}


def __getattr__(name: str) -> Any:
    """``RNGState`` and ``STATE_VERSION`` from :mod:`streamio.checkpoint.rng`, with a ``DeprecationWarning``."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("streamio.checkpoint.rng"), name)
    return moved_name(f"streamio.state.{name}", _MOVED[name], value)
