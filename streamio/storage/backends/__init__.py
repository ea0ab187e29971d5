"""One module per kind of storage behind :class:`~streamio.storage.store.Store`, and the factory.

:func:`connect` makes the fsspec filesystem for a URL and picks its backend, once per process;
:func:`backend_class` answers for a URL without connecting. They are the only place in streamio
that compares protocol names: everything else asks the backend (``is_local``, ``whole_reads``,
``bucket``, ...). The seam is :class:`~.base.Backend`; see each module for what its store
guarantees (atomic puts, versions, conditions).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

import fsspec

from streamio.storage.backends.base import TMP_SUFFIX, Backend, PutRequest, WriteMode, shorter_than_expected
from streamio.storage.backends.gcs import GcsBackend
from streamio.storage.backends.generic import GenericBackend
from streamio.storage.backends.local import LocalBackend
from streamio.storage.backends.memory import MemoryBackend
from streamio.storage.backends.s3 import S3Backend
from streamio.storage.retry import RetryPolicy

__all__ = [
    "BACKENDS", "TMP_SUFFIX", "Backend", "PutRequest", "WriteMode",
    "backend_class", "canonical", "connect", "shorter_than_expected",
]

#: the backends with a module of their own; any other protocol gets :class:`GenericBackend`
BACKENDS: dict[str, type[GenericBackend]] = {
    "file": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "gs": GcsBackend,
}
_ALIASES = {"local": "file", "gcs": "gs", "s3a": "s3", "": "file"}


def canonical(protocol: str | tuple[str, ...] | list[str]) -> str:
    """The canonical name of a protocol (``s3a`` -> ``s3``, ``gcs`` -> ``gs``, ``local`` -> ``file``);
    for an fsspec filesystem's ``protocol`` tuple, of its first name."""
    name = protocol[0] if isinstance(protocol, (tuple, list)) else protocol
    return _ALIASES.get(name, name)


def is_file_url(url: str) -> bool:
    """Whether ``url`` names the local file system (a plain path, ``file://``, ``local://``)."""
    return canonical(urllib.parse.urlsplit(url).scheme.lower()) == "file"


def backend_class(url: str) -> type[GenericBackend]:
    """The backend a URL will get, known from its scheme alone (nothing is imported or connected)."""
    return BACKENDS.get(canonical(urllib.parse.urlsplit(url).scheme), GenericBackend)


def connect(url: str, options: Mapping[str, Any], policy: RetryPolicy) -> GenericBackend:
    """A fresh fsspec filesystem for ``url``, its inner retries configured down, in its backend.

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
    return cls(fs, root.rstrip("/"), protocol, options=options, policy=policy)
