"""Spans of streamio's stages for a Chrome/Perfetto trace (``STREAMIO_TRACE=/path/trace.json``).

``with span("fetch", shard=url): ...`` records one complete event in the calling thread. Without
``STREAMIO_TRACE`` (read once, at import) :func:`span` returns one shared no-op context manager:
nothing is recorded or kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["TRACE_ENV", "enabled", "span"]

TRACE_ENV = "STREAMIO_TRACE"

_PATH = os.environ.get(TRACE_ENV) or None
_OFF = contextlib.nullcontext()


def enabled() -> bool:
    """Whether this process records spans."""
    return _PATH is not None


def span(name: str, **args: Any) -> contextlib.AbstractContextManager[None]:
    """A context manager that records ``name`` (with ``args``) from entry to exit in this thread."""
    if _PATH is None:
        return _OFF
    return _recorded(name, args)


@contextlib.contextmanager
def _recorded(name: str, args: dict[str, Any]) -> Iterator[None]:  # TODO(trace helper): record and write
    yield
