"""Importing transformers for the adapter, or saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from streamio.errors import MissingDependencyError

__all__ = ["INSTALL", "require"]

#: What adds transformers (and Accelerate, which its Trainer runs on) to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[transformers]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (``transformers``, ``transformers.trainer_callback``).

    Raises:
        MissingDependencyError: transformers (5.0 or later) or Accelerate is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.transformers needs transformers and accelerate ({module} cannot be imported: {exc}). "
            f"Install them with {INSTALL}"
        ) from exc
