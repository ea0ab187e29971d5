"""Importing HF Accelerate for the adapter, or saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from streamio.errors import MissingDependencyError

__all__ = ["INSTALL", "require"]

#: What adds Accelerate to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[accelerate]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (``accelerate``, ``accelerate.data_loader``).

    Raises:
        MissingDependencyError: HF Accelerate (1.0 or later) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.accelerate needs HF Accelerate ({module} cannot be imported: {exc}). Install it with {INSTALL}"
        ) from exc
