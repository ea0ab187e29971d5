"""Package attributes imported on first use: what keeps ``import streamio`` (and ``streamio.ray``
without Ray) light, for every package that re-exports names from its modules.

A package maps each exported name to the module that defines it and sets
``__getattr__ = lazy_exports(__name__, EXPORTS, globals())``: the first lookup of a name imports
its module and keeps the value in the package's globals, so later lookups never come back here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` for ``exports`` (name -> defining module)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
