"""Importing Ray for the adapters, or saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from streamio.errors import MissingDependencyError

__all__ = ["INSTALL", "require"]

#: What adds Ray Data to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[ray]'"


def require(module: str = "ray") -> ModuleType:
    """Import ``module`` (``ray``, ``ray.data``).

    Raises:
        MissingDependencyError: Ray (with Ray Data) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.ray needs Ray Data ({module} cannot be imported: {exc}). Install it with {INSTALL}"
        ) from exc
