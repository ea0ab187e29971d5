"""Importing Lightning for the adapters, or saying what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from streamio.errors import MissingDependencyError

__all__ = ["INSTALL", "require", "require_any"]

#: What adds Lightning to an environment that has streamio.
INSTALL = "pip install 'streamio-torch[lightning]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (``lightning.pytorch.callbacks``, ``lightning.fabric.plugins``).

    Raises:
        MissingDependencyError: Lightning (the ``lightning`` package, 2.5 or later) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"streamio.lightning needs Lightning ({module} cannot be imported: {exc}). Install it with {INSTALL}"
        ) from exc


def require_any(name: str, *modules: str) -> tuple[type, ...]:
    """The class ``name`` of each of ``modules`` that imports, in their order.

    Lightning ships its classes under two package names (``lightning.fabric.plugins`` and the
    older ``lightning_fabric.plugins``): each Trainer accepts only its own package's classes, so a
    plugin that subclasses every one installed is accepted by all of them.

    Raises:
        MissingDependencyError: none of ``modules`` imports.
    """
    found: list[type] = []
    for module in modules:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except ImportError:
            continue
    if not found:
        raise MissingDependencyError(
            f"streamio.lightning needs Lightning (none of {', '.join(modules)} can be imported). Install it with "
            f"{INSTALL}"
        )
    return tuple(found)
