"""The one check of the ``"version"`` inside the small state dicts streamio saves and reads back.

Every ``state_dict()`` streamio writes (planner, dataset, loader, RNG, trainer progress) is a small
JSON-safe dict with an int under ``"version"``; ``load_state_dict()`` refuses any other version
rather than guess at its meaning. :func:`check_version` is that refusal, so each state reads the
same and its message says which state, which versions, and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamio.errors import StreamioError

__all__ = ["VERSION_KEY", "check_version"]

VERSION_KEY = "version"
_FIX = "it was written by another streamio version; resume with that version or start fresh"


def check_version(
    state: object, expected: int, *, what: str, error: type[StreamioError], fix: str = _FIX
) -> Mapping[str, Any]:
    """``state`` itself when it is a mapping whose ``"version"`` is ``expected``; else raise ``error``.

    Args:
        state: the state handed to a ``load_state_dict()`` (or ``resume=``).
        expected: the one version this code reads.
        what: names the state in the message, e.g. ``"dataset state"``.
        error: the :class:`~streamio.errors.StreamioError` subclass to raise.
        fix: what the user should do, appended to the message.

    Raises:
        StreamioError: ``error``, naming ``what``, the version found and the one expected.
    """
    if not isinstance(state, Mapping):
        raise error(f"{what} must be a dict made by state_dict(), not a {type(state).__name__}.")
    found = state.get(VERSION_KEY)
    if found != expected:
        raise error(f"{what} has version {found!r}, but this streamio reads version {expected}: {fix}.")
    return state
