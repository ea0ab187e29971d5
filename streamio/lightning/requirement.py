"""Importing Lightning for the adapters, or saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from streamio.errors import MissingDependencyError

__all__ = ["INSTALL", "require"]

#: What adds Lightning to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[lightning]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (``lightning.pytorch.callbacks``, ``lightning.fabric.plugins``).

    Raises:
        MissingDependencyError: Lightning (the ``lightning`` package, 2.2 or later) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.lightning needs Lightning ({module} cannot be imported: {exc}). Install it with {INSTALL}"
        ) from exc
