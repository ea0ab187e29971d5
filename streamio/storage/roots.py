"""Whether a Store's root can exist at all: a protocol fsspec knows, a bucket that exists.

Why a separate check: object stores answer "no such key" and "no such bucket" alike in some
calls. A HEAD has no body, so S3's 404 for a missing bucket looks like a missing key; s3fs's
``exists`` says ``False`` and the fsspec walk behind HTTP listings says ``[]``; fake-gcs-server
and gcsfs list a missing bucket as empty. Left alone, a typo in a bucket name reads as "no
checkpoint yet" or "no index.json". So when a call on ``s3://`` or ``gs://`` finds nothing, the
store asks once about the bucket itself (its backend's ``bucket_exists``: one request,
``HeadBucket`` on S3, a one-item object listing on GCS, which needs only the permission a
listing needs anyway) and remembers a bucket that exists (:class:`BucketCheck`); a missing one
raises :class:`~streamio.errors.BucketNotFoundError`. The check is never the only request: it runs
after a not-found, so a healthy root pays it at most once per Store.

Protocols (:func:`check_protocol`) are checked when a Store is made, without importing anything:
an unknown one names the known ones (and the nearest, for a typo); a known scheme with one slash
(``s3:/bucket``, which fsspec would take for a local path) says what was meant; a known one whose
package is missing (``az://`` without adlfs) is reported at first use (:func:`missing_package`).
"""

from __future__ import annotations

import difflib
import logging
import re
import threading

import fsspec

from streamio.errors import StorageError, UnsupportedProtocolError
from streamio.storage.backends.base import Backend
from streamio.storage.failures import bucket_not_found, has_code
from streamio.storage.retry import RetryPolicy

log = logging.getLogger(__name__)

_USUAL = ("s3", "gs", "file", "memory")  # named in the message, in this order
#: a known scheme with one slash or none after its colon (two letters at least: C:/ is a drive)
_ALMOST_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):/?(?!/)")


def check_protocol(url: str, shown: str) -> None:
    """Raise :class:`UnsupportedProtocolError` if a protocol in ``url`` (chains: ``a::b://``) is unknown.

    Args:
        url: the URL as given.
        shown: the same URL as it may be shown (no userinfo), for the message.
    """
    known = set(fsspec.available_protocols()) | set(fsspec.registry)
    for part in url.split("::"):
        proto = fsspec.core.split_protocol(part)[0]
        almost = _ALMOST_URL.match(part) if proto is None else None
        if almost is not None and almost.group(1).lower() in known:  # s3:/bucket, gs:bucket: not a local path
            scheme, rest = almost.group(1), part[almost.end() :]
            raise UnsupportedProtocolError(
                f"{shown!r} is not a URL: a {scheme} URL starts with {scheme}:// (did you mean "
                f"{scheme}://{rest}?); a local path that really starts with {scheme}: is written ./{part}"
            )
        if proto is None or proto in known:
            continue
        # a typo of a usual scheme first (s4 -> s3), then only close names among the rest (foo is no root)
        close = difflib.get_close_matches(proto, _USUAL, n=1, cutoff=0.5) or difflib.get_close_matches(
            proto, sorted(known), n=1, cutoff=0.75
        )
        raise UnsupportedProtocolError(
            f"unknown storage protocol {proto!r} in {shown}: "
            f"{f'did you mean {close[0]}://? ' if close else ''}use {', '.join(f'{p}://' for p in _USUAL)} "
            f"(or a plain local path), or another of the {len(known)} protocols fsspec knows "
            f"(http, https, az, hf, ...: fsspec.available_protocols())"
        )


def missing_package(shown: str, exc: ImportError) -> UnsupportedProtocolError:
    """The error for a known protocol whose implementation cannot be imported."""
    proto = fsspec.core.split_protocol(shown.split("::")[-1])[0] or "file"
    return UnsupportedProtocolError(
        f"{proto}:// ({shown}) needs a package that is not installed or does not import: {exc}; install it "
        f"in this environment (fsspec's list: fsspec.registry.known_implementations[{proto!r}])"
    )


class BucketCheck:
    """The buckets a Store (and the stores it makes with ``child``) has seen exist.

    Args:
        policy: the retry policy of the check's one request.
        root_url: the store's root URL (as shown), named in the check's own errors.
    """

    def __init__(self, policy: RetryPolicy, root_url: str) -> None:
        self._policy = policy
        self._root_url = root_url
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, backend: Backend, url: str, exc: BaseException | None = None) -> None:
        """Raise :class:`~streamio.errors.BucketNotFoundError` (from ``exc``) if the bucket of
        ``backend`` is missing; remember one that exists.

        Args:
            backend: whose bucket (``backend.bucket`` None: no buckets, nothing to check).
            url: the URL the caller found nothing at, for the message.
            exc: the not-found being explained, if any (an empty listing has none).

        A check that itself fails (403 on the bucket, transient errors) says nothing: the
        caller keeps its own answer.
        """
        bucket = backend.bucket
        with self._lock:
            if bucket is None or bucket in self._seen:
                return
        if exc is not None and has_code(exc, "NoSuchKey"):  # S3 said so: the bucket is there
            exists = True
        else:
            try:
                exists = self._policy.call(lambda: backend.bucket_exists(bucket), self._root_url)
            except StorageError as err:
                log.debug("could not check that bucket %s of %s exists: %s", bucket, self._root_url, err)
                return
        if not exists:
            raise bucket_not_found(url, "the store has no such bucket", bucket) from exc
        with self._lock:
            self._seen.add(bucket)
