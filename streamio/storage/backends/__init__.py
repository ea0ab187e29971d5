"""One module per kind of storage behind :class:`~streamio.storage.store.Store`, and the factory.

:func:`connect` makes the fsspec filesystem for a URL and picks its backend, once per process;
:func:`backend_class` answers for a URL without connecting; :func:`is_file_url` and
:func:`pointer_scope` (where a document read from a URL may point) answer from the URL alone. They
are the only place in streamio that compares protocol names: everything else asks them or the
backend (``is_local``, ``whole_reads``, ``bucket``, ...). The seam is :class:`~.base.Backend`; see
each module for what its store guarantees (atomic puts, versions, conditions).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

import fsspec

from streamio.storage.backends.base import TMP_SUFFIX, Backend, PutRequest, WriteMode, shorter_than_expected
from streamio.storage.backends.counted import CountedBackend
from streamio.storage.backends.gcs import GcsBackend
from streamio.storage.backends.generic import GenericBackend
from streamio.storage.backends.local import LocalBackend
from streamio.storage.backends.memory import MemoryBackend
from streamio.storage.backends.s3 import S3Backend
from streamio.storage.retry import RetryPolicy

__all__ = [
    "BACKENDS", "TMP_SUFFIX", "Backend", "PutRequest", "WriteMode",
    "backend_class", "canonical", "connect", "is_file_url", "pointer_scope",
    "shorter_than_expected",
]

#: the backends with a module of their own; any other protocol gets :class:`GenericBackend`
BACKENDS: dict[str, type[GenericBackend]] = {
    "file": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "gs": GcsBackend,
}
_ALIASES = {"local": "file", "gcs": "gs", "s3a": "s3", "": "file"}
#: a document read from these may point anywhere: whoever could plant it can read anything there anyway
_ON_THIS_MACHINE = frozenset({"file", "memory"})
#: protocols where every host is a store of its own
_HOST_SCOPED = frozenset({"http", "https"})


def canonical(protocol: str | tuple[str, ...] | list[str]) -> str:
    """The canonical name of a protocol (``s3a`` -> ``s3``, ``gcs`` -> ``gs``, ``local`` -> ``file``);
    for an fsspec filesystem's ``protocol`` tuple, of its first name."""
    name = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    return _ALIASES.get(name, name)


def is_file_url(url: str) -> bool:
    """Whether ``url`` names the local file system (a plain path, ``file://``, ``local://``)."""
    return canonical(urllib.parse.urlsplit(url).scheme.lower()) == "file"


def pointer_scope(url: str) -> tuple[str, str | None] | None:
    """Where a document read from ``url`` may send a reader (an index's ``shards_url``).

    Returns:
        None where it may point anywhere (``url`` is on this machine: a plain path, ``file://``,
        ``memory://``); otherwise ``(protocol, host)``: a URL is within the scope when its own
        ``pointer_scope`` is equal: the same protocol (canonical) and, for http(s), where every
        host is a store of its own, the same host (``host`` is None for other protocols).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    protocol = canonical(scheme.lower())
    if protocol in _ON_THIS_MACHINE:
        return None
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1].lower() if protocol in _HOST_SCOPED else None
    return protocol, host


def backend_class(url: str) -> type[GenericBackend]:
    """The backend a URL will get, known from its scheme alone (nothing is imported or connected)."""
    return BACKENDS.get(canonical(urllib.parse.urlsplit(url).scheme), GenericBackend)


def connect(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> GenericBackend:
    """A fresh fsspec filesystem for ``url``, its inner retries configured down, in its backend
    (wrapped in a :class:`~.counted.CountedBackend` if it does not count its own requests).

    Args:
        url: the real URL (userinfo included).
        options: the storage options as given (secrets resolved).
        policy: the store's retry policy (for the parts of a multipart upload).

    Raises:
        ImportError: the package implementing the protocol is missing (the caller says which).
    """
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **backend_class(url).fs_options(options))
    protocol = canonical(fs.protocol)
    cls = BACKENDS.get(protocol, GenericBackend)  # the filesystem decides (a chained URL names the outer one)
    cls.configure(fs)
    backend = cls(fs, root.rstrip("/"), protocol, options=options, policy=policy)
    return backend if cls.counts_requests else CountedBackend(backend)  # type: ignore[return-value]
