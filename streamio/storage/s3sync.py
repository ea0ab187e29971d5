"""Whole-range S3 reads in the calling thread, through a botocore client with s3fs's settings.

Why: s3fs runs every request of a process on one event loop thread, and aiohttp's body handling
is Python code holding the GIL, so parallel reads through it stop scaling at ~0.6 GB/s here
whatever the number of reading threads (more loops do not help: measured 0.50-0.65 GB/s for
8 x 38 MB on moto with 1, 4 or 8 loops). botocore's synchronous client reads a body in the
thread that asked, with the GIL released while the socket fills one buffer of the whole
length: 8 threads reach 0.95-1.0 GB/s on the same server, the boto3 ceiling.

What it is for: :meth:`Store.read` of S3 objects (checkpoint parts, manifests, pointers,
indexes: bounded reads wanted whole). Streaming reads keep s3fs (``iter_bytes``), which resumes
from the last byte received; a whole-range read that fails mid-body is retried from its start,
so its waste is bounded by the size asked for.

The client is built from the s3fs instance's own resolved settings (credentials, endpoint,
``client_kwargs``, ``config_kwargs`` with streamio's one-attempt retries, ``anon``, session
keyword arguments such as ``profile``; requester-pays and ``s3_additional_kwargs`` go on each
GET), the same way s3fs builds its client, so both see the same account. A caller who passes
their own aiobotocore ``session`` (storage option ``session``) keeps the s3fs path: a sync
client could not share it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from streamio.storage.backends import shorter_than_expected
from streamio.storage.redact import guard_library_logs

_CLIENTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_DEFAULT_POOL = 32  # connections: more than any reader pool streamio runs (botocore's default is 10)


def client(fs: Any) -> Any:
    """The botocore S3 client mirroring ``fs``, one per filesystem instance (thread-safe)."""
    with _LOCK:
        found = _CLIENTS.get(fs)
        if found is None:
            found = _CLIENTS[fs] = _make_client(fs)
            guard_library_logs()  # botocore's modules imported for this client log secrets at DEBUG
        return found


def _make_client(fs: Any) -> Any:
    import botocore.config
    import botocore.session
    from botocore import UNSIGNED

    client_kwargs = dict(fs.client_kwargs)
    init = {
        "aws_access_key_id": fs.key,
        "aws_secret_access_key": fs.secret,
        "aws_session_token": fs.token,
        "endpoint_url": fs.endpoint_url,
    }
    init = {k: v for k, v in init.items() if v is not None and v != client_kwargs.get(k)}
    if "use_ssl" not in client_kwargs:
        init["use_ssl"] = fs.use_ssl
    config = dict(fs.config_kwargs)
    config.setdefault("connect_timeout", fs.connect_timeout)
    config.setdefault("read_timeout", fs.read_timeout)
    config.setdefault("max_pool_connections", _DEFAULT_POOL)
    if fs.anon:
        secrets = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
        init = {k: v for k, v in init.items() if k not in secrets}
        client_kwargs = {k: v for k, v in client_kwargs.items() if k not in secrets}
        config["signature_version"] = UNSIGNED
    session = botocore.session.Session(**fs.kwargs)
    return session.create_client("s3", config=botocore.config.Config(**config), **init, **client_kwargs)


def read(fs: Any, full: str, start: int, end: int | None, url: str) -> bytes:
    """Bytes ``[start, end)`` (to the end if ``end`` is None) of ``full`` in ONE GET, whole.

    Raises:
        CorruptDataError: the object ends before ``end``.
        botocore / urllib3 errors: as they come (the caller's retry policy classifies them); a
            body cut short raises (botocore checks the announced length), never returns short.
    """
    bucket, key, version_id = fs.split_path(full)
    s3 = client(fs)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, **_extra_kwargs(fs, s3)}
    if start or end is not None:
        kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    if version_id:
        kwargs["VersionId"] = version_id
    resp = s3.get_object(**kwargs)
    body = resp["Body"]
    try:
        data: bytes = body.read()
    finally:
        body.close()
    if end is not None and len(data) < end - start:
        raise shorter_than_expected(url, start + len(data), end)
    return data


def _extra_kwargs(fs: Any, s3: Any) -> dict[str, Any]:
    """Requester-pays and the caller's ``s3_additional_kwargs`` that GetObject accepts."""
    extra = {**fs.s3_additional_kwargs, **fs.req_kw}
    if not extra:
        return {}
    members = s3.meta.service_model.operation_model("GetObject").input_shape.members
    return {k: v for k, v in extra.items() if k in members}
