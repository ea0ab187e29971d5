"""The requests of a backend that does not count its own (``file://``, ``memory://``, any other
fsspec filesystem): one per backend call, counted by a thin wrapper :func:`~.connect` puts around it.

S3 and GCS count every HTTP attempt where it is sent (``counts_requests``); the others have no
HTTP attempt to see, so each call of the :class:`~.base.Backend` seam is one request: ``read``,
``map`` and a stream (``open_stream``) a ``get`` (their bytes read), ``info`` a ``head``, ``find``
a ``list``, ``put`` a ``put`` (its bytes written once it returned), ``delete`` a ``delete``. The
outcome is :func:`~streamio.storage.accounting.call_outcome`'s, settled by the retry loop around
the call like an HTTP attempt's. Everything else (attributes, maintenance calls) is the inner
backend's, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from streamio.storage.accounting import counted_call, counted_stream
from streamio.storage.backends.base import OnEnd, PutRequest


class CountedBackend:
    """``inner`` with each call of the seam counted as one request (see the module docstring)."""

    counts_requests = True

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"CountedBackend({self._inner!r})"

    def read(self, full: str, url: str, start: int, end: int | None, limit: int | None = None) -> bytes:
        return counted_call("get", lambda: self._inner.read(full, url, start, end, limit))()

    def read_versioned(
        self, full: str, url: str, start: int = 0, end: int | None = None, limit: int | None = None
    ) -> tuple[bytes, str | None]:
        return counted_call("get", lambda: self._inner.read_versioned(full, url, start, end, limit))()

    def map(self, full: str) -> bytes | memoryview:
        return counted_call("get", lambda: self._inner.map(full))()

    def open_stream(self, full: str, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
        return counted_stream(self._inner.open_stream(full, start, end, piece, on_end))

    def info(self, full: str) -> tuple[int, str | None]:
        return counted_call("head", lambda: self._inner.info(full))()

    def find(self, full: str) -> Mapping[str, Mapping[str, Any]]:
        return counted_call("list", lambda: self._inner.find(full))()

    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str:
        return counted_call("put", lambda: self._inner.put(full, url, data, request), sent=len(data))()

    def delete(self, full: str) -> None:
        counted_call("delete", lambda: self._inner.delete(full))()
