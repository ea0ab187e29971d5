"""The per-process side of a Store: where it points, how to get there, and what may be pickled.

A :class:`Connection` is ``(url, storage_options, retry policy)`` and nothing live: its backend
(the fsspec filesystem in a :class:`~streamio.storage.backends.base.Backend`) is made lazily,
once per process, because s3fs objects are not fork-safe and hold credentials. So it pickles into
DataLoader workers and spawned processes as those three fields, with every secret replaced by an
opaque reference into this process's vault (:mod:`~streamio.storage.secrets`: every option value
is a secret unless its key is on a short allow-list, and so is the userinfo of the URL). A forked
child (the DataLoader default on Linux) resolves the references; a spawned process or another
machine cannot, and gets a clear error at first use: give it credentials the way the library
takes them from its environment (``AWS_ACCESS_KEY_ID``..., ``GOOGLE_APPLICATION_CREDENTIALS``) or
build the Store there. Only ``shown`` (userinfo replaced by ``***``) is ever displayed; the real
URL reaches fsspec alone.
"""

from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Mapping
from typing import Any

from streamio.errors import ConfigError, StoragePermissionError
from streamio.storage import backends, roots, secrets
from streamio.storage.backends.base import Backend
from streamio.storage.retry import RetryPolicy
from streamio.storage.secrets import SecretRef


class Connection:
    """A URL, its storage options and the retry policy; the backend on first use in each process.

    Args:
        url: any fsspec URL or local path (a trailing ``/`` is dropped).
        options: passed to the fsspec filesystem (endpoint, credentials, ...).
        policy: the retry policy the backend's inner loops use (multipart parts).

    Raises:
        ConfigError: ``url`` is not a string (arguments given in the wrong order, say).
        UnsupportedProtocolError: fsspec knows no such protocol.
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None, policy: RetryPolicy) -> None:
        if not isinstance(url, str):
            raise ConfigError(f"a storage URL must be a string (a path or s3://, gs://, ...), got a "
                              f"{type(url).__name__}: were the arguments given in the wrong order?")
        real = url.rstrip("/") if url != "/" else url
        self.shown = secrets.strip_userinfo(real)
        self._real: str | SecretRef = real
        roots.check_protocol(real, self.shown)
        secrets.guard_library_logs()
        self.options = dict(options or {})
        self._sealed = secrets.seal(self.options)  # now: its secrets are known to secrets.scrub
        if self.shown != real:
            secrets.seal_value(real)
        self.policy = policy
        self._backend: Backend | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        # the three fields with secrets replaced by references, never the live filesystem
        real = None if self._real == self.shown else secrets.seal_value(self._real)
        return (_rebuild, (self.shown, real, self._sealed, self.policy))

    @property
    def backend(self) -> Backend:
        """This process's backend, made on first use (inner retries configured down)."""
        if self._backend is None or self._pid != os.getpid():
            with self._lock:
                if self._backend is None or self._pid != os.getpid():
                    self._backend = self._connect()
                    self._pid = os.getpid()
        return self._backend

    def _connect(self) -> Backend:
        missing = secrets.missing(self.options)
        if isinstance(self._real, SecretRef):
            missing.insert(0, "the URL's user:password@")
        if missing:
            raise StoragePermissionError(
                f"the Store for {self.shown} was unpickled in a process that does not hold its "
                f"secrets ({', '.join(missing)}): streamio never pickles secrets. Give this "
                f"process credentials through its environment or create the Store in it"
            )
        try:
            backend = backends.connect(str(self._real), self.options, self.policy)
        except ImportError as exc:
            raise roots.missing_package(self.shown, exc) from exc
        secrets.guard_library_logs()  # the loggers of the modules it just imported
        return backend

    def full(self, path: str) -> str:
        """The backend's full path of ``path`` (relative to the root, ``/``-separated)."""
        root = self.backend.root
        return posixpath.join(root, path) if path else root

    def relative(self, full: str) -> str:
        """``full`` relative to the root (as given if it lies elsewhere)."""
        root = self.backend.root
        base = root + "/" if root else ""
        return full[len(base) :] if full.startswith(base) else full

    def derive(self, path: str = "", options: Mapping[str, Any] | None = None) -> Connection:
        """A connection to ``path`` below this root (``""``: the root itself), with ``options``
        instead of this one's if given, and the same policy."""
        real = self._real

        def below(base: str) -> str:
            return f"{base}/{path}" if path else base

        opts = self.options if options is None else options
        out = Connection(below(real) if isinstance(real, str) else below(self.shown), opts, self.policy)
        if not isinstance(real, str):
            out._real = real  # unresolved here (unpickled elsewhere): the derived one is as unusable
        return out


def _rebuild(shown: str, real: SecretRef | None, options: dict[str, Any], policy: RetryPolicy) -> Connection:
    conn = Connection(shown, secrets.unseal(options), policy)
    if real is not None:
        conn._real = secrets.unseal(real)  # a str where this process holds it, else still a ref
    return conn
