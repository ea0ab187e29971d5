"""S3 (and S3-compatible stores) through s3fs's client, plus a botocore client for whole reads.

Retries: s3fs's own loop is set to one attempt (``fs.retries = 1``) and botocore's to ``total_max_attempts=1``;
without this, attempts multiply under the store's policy (25 attempts / 34 s for one persistent 503 with the
defaults). Requests go straight to the client (:func:`s3_call`): s3fs's ``_call_s3`` still sleeps after a retryable
failure and turns errors into bare ``OSError``s, and its ``info`` follows a 404 HEAD with a listing.

Streams: one ``GetObject`` whose aiobotocore body is yielded as it arrives.

Whole reads (:meth:`S3Backend.read`): in the calling thread, through a botocore client built from the s3fs instance's
own resolved settings (:func:`sync_client`). Why: s3fs runs every request of a process on one event loop thread, and
aiohttp's body handling is Python code holding the GIL, so parallel reads through it stop scaling at ~0.6 GB/s here
whatever the number of reading threads (more loops do not help: measured 0.50-0.65 GB/s for 8 x 38 MB on moto with 1,
4 or 8 loops). botocore's synchronous client reads a body in the thread that asked, with the GIL released while the
socket fills one buffer of the whole length: 8 threads reach 0.95-1.0 GB/s on the same server, the boto3 ceiling. They
serve bounded reads wanted whole (checkpoint parts, manifests, pointers, indexes); streaming reads keep s3fs and
resume from the last byte received, while a whole read that fails mid-body is retried from its start (its waste is
bounded by the size asked for). The client mirrors credentials, endpoint, ``client_kwargs``, ``config_kwargs`` (with
the one-attempt retries), ``anon`` and session keyword arguments such as ``profile``; requester-pays and
``s3_additional_kwargs`` go on each GET, so both clients see the same account. A caller who passes their own
aiobotocore ``session`` keeps the s3fs path: a sync client could not share it.

Puts: one ``PutObject`` below the multipart threshold, else a multipart upload whose parts go up in parallel
(bounded by ``concurrency``) and which becomes visible only on completion (aborted on failure). Create-only
sends ``If-None-Match: *``, compare-and-swap ``If-Match: "etag"``, on the single PUT and on the completion;
412 -> WriteConflictError. Version: ETag. A compare-and-swap multipart put first compares the version with a
HEAD (moto ignores ``If-Match`` on the completion; AWS honours it, which closes the remaining window there).
A part that exhausts its retries stops the upload (no further part is sent) and the upload is aborted. A
process killed mid-upload cannot abort: its upload stays invisible but billed; set the bucket lifecycle rule
``AbortIncompleteMultipartUpload`` (e.g. DaysAfterInitiation 1) or run ``streamio ckpt gc``, which removes
stale uploads (:meth:`S3Backend.incomplete_uploads`)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from fsspec.asyn import sync

from streamio.errors import TruncatedBodyError
from streamio.pool import run_parallel
from streamio.storage import accounting
from streamio.storage.backends.base import (
    OnEnd,
    PutRequest,
    conflict,
    pump,
    range_header,
    shorter_than_expected,
    too_large,
    within,
)
from streamio.storage.backends.generic import GenericBackend
from streamio.storage.deadline import Pace, watchdog
from streamio.storage.failures import code_of, says_not_found
from streamio.storage.retry import RetryPolicy
from streamio.storage.secrets import guard_library_logs

_CLIENT_ATTR = "_streamio_sync_client"  # on the filesystem instance itself: see sync_client
_CLIENTS_LOCK = threading.Lock()
_LOADER: Any = None  # botocore's data loader, shared by every session of this process (see shared_loader)
_LOADER_LOCK = threading.Lock()  # not _CLIENTS_LOCK: sync_client holds that one while it makes a session
_DEFAULT_POOL = 32  # connections: more than any reader pool streamio runs (botocore's default is 10)


async def s3_call(fs: Any, op: str, **kwargs: Any) -> Any:
    """One botocore call through s3fs's client, without s3fs's retry wrapper (see module doc)."""
    await fs.set_session()
    s3 = await fs.get_s3(kwargs.get("Bucket"))
    method = getattr(s3, op)
    return await method(**fs._get_s3_method_kwargs(method, **kwargs))


class S3Backend(GenericBackend):
    """``s3://`` (see the module docstring)."""

    find_kwargs: Mapping[str, Any] = {}
    writes_per_s, endpoint_env = 3500.0, ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")  # AWS, per prefix
    counts_requests = True  # every HTTP attempt, in its sessions (s3_bodies)

    def __init__(self, fs: Any, root: str, protocol: str, *, options: Mapping[str, Any], policy: RetryPolicy) -> None:
        super().__init__(fs, root, protocol, options=options, policy=policy)
        self.bucket = root.partition("/")[0] or None
        self.whole_reads = self.versioned_reads = "session" not in options  # a caller's session: s3fs only

    @classmethod
    def fs_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        from streamio.storage.backends.s3_bodies import BoundedAioSession

        opts = dict(options)
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        config.setdefault("http_session_cls", BoundedAioSession)  # error and document bodies bounded
        opts["config_kwargs"] = config
        return opts

    @classmethod
    def configure(cls, fs: Any) -> None:
        fs.retries = 1
        if fs.session is None:  # s3fs would make this very session on first use, with a loader of its own
            import aiobotocore.session

            fs.session = shared_loader(aiobotocore.session.AioSession(**fs.kwargs))

    @classmethod
    def options_for_verified_reads(cls, options: Mapping[str, Any]) -> dict[str, Any] | None:
        """Options whose client skips botocore's response-checksum pass
        (``response_checksum_validation="when_required"``); ``None`` if the caller set it.

        Why: that CRC32 is one more pass over every body, while a caller that verifies size and
        CRC32C end to end (a checkpoint restore's parts) checks the same bytes anyway.
        """
        opts = dict(options)
        config = dict(opts.get("config_kwargs") or {})
        if "response_checksum_validation" in config:
            return None
        config["response_checksum_validation"] = "when_required"
        opts["config_kwargs"] = config
        return opts

    def _call(self, op: str, **kwargs: Any) -> Any:
        return sync(self.fs.loop, s3_call, self.fs, op, **kwargs)

    def _call_within(self, seconds: float, op: str, **kwargs: Any) -> Any:
        """:meth:`_call` cancelled after ``seconds`` (:class:`TimeoutError`, transient)."""
        return sync(self.fs.loop, within, seconds, s3_call(self.fs, op, **kwargs))

    # ------------------------------------------------------------- reads
    def read(self, full: str, url: str, start: int, end: int | None, limit: int | None = None) -> bytes:
        return self.read_versioned(full, url, start, end, limit)[0]

    def read_versioned(self, full: str, url: str, start: int = 0, end: int | None = None,
                       limit: int | None = None) -> tuple[bytes, str | None]:
        """ONE GetObject through :func:`sync_client`, whole (botocore checks the announced length:
        a body cut short raises, never returns short), and the ETag the same answer gave."""
        fs = self.fs
        bucket, key, version_id = fs.split_path(full)
        s3 = sync_client(fs)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, **_extra_kwargs(fs, s3)}
        rng = range_header(start, end)
        if rng:
            kwargs["Range"] = rng
        if version_id:
            kwargs["VersionId"] = version_id
        response = s3.get_object(**kwargs)
        body = response["Body"]
        length = int(response.get("ContentLength") or 0)
        if limit is not None and length > limit:
            _shut(body)  # not drained: the connection is dropped with the body unread
            body.close()
            raise too_large(url, length, limit)
        deadline = self.policy.body_deadline
        timer = watchdog().arm(deadline.allowed(length), functools.partial(_shut, body))
        try:
            data = accounting.counted(body.read if limit is None else lambda: _read_at_most(body, url, length, limit))
        except Exception as exc:
            if timer.fired:
                raise deadline.missed(url, length) from exc
            raise
        finally:
            timer.disarm()
            body.close()
        if end is not None and len(data) < end - start:
            raise shorter_than_expected(url, start + len(data), end)
        return data, str(response.get("ETag", "")).strip('"') or None

    def open_stream(self, full: str, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
        bucket, key, version_id = self.fs.split_path(full)
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        rng = range_header(start, end)
        if rng:
            kw["Range"] = rng
        if version_id:
            kw["VersionId"] = version_id
        url = f"s3://{full}"
        deadline = self.policy.body_deadline
        try:
            resp = self._call_within(deadline.grace, "get_object", **kw)
        except TimeoutError as exc:
            raise deadline.missed(url, None) from exc
        body = resp["Body"]
        try:
            length = resp.get("ContentLength")
            if length is not None:
                on_end(start + int(length))
            yield from pump(self.fs.loop, body.read, piece, Pace(deadline, url))
        finally:
            accounting.read_bytes(accounting.received(getattr(body, "_raw_stream", None)))  # read or not, cut or not
            with contextlib.suppress(Exception):
                body.close()

    def info(self, full: str) -> tuple[int, str | None]:
        bucket, key, version_id = self.fs.split_path(full)
        kw = {"VersionId": version_id} if version_id else {}
        out = self._call("head_object", Bucket=bucket, Key=key, **kw)
        return int(out["ContentLength"]), str(out.get("ETag", "")).strip('"') or None

    # ------------------------------------------------------------- writes
    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str:
        """One attempt at an atomic put (the single PUT is retried by the caller; parts here)."""
        if len(data) < request.multipart_threshold:
            return self._put_single(full, url, data, request)
        if request.if_match is not None:
            # IfMatch on the completion closes the race on AWS; moto ignores it there, and either
            # way a stale version is best found before uploading gigabytes
            try:
                found: str | None = self.policy.call(lambda: self.info(full)[1], url)
            except FileNotFoundError:
                found = None
            if found != request.if_match.strip('"'):
                raise conflict(url, request.if_match, found)
        return _Multipart(self, full, url, request).run(data)

    def _put_single(self, full: str, url: str, data: memoryview, request: PutRequest) -> str:
        bucket, key, _ = self.fs.split_path(full)
        try:
            out = self._call("put_object", Bucket=bucket, Key=key, Body=bytes(data), **_condition(request))
        except Exception as exc:
            # If-Match on a key that is gone answers 404 NoSuchKey: for the caller, a lost CAS
            if request.if_match is not None and code_of(exc)[0] == "NoSuchKey":
                raise conflict(url, request.if_match, None) from exc
            raise
        self.fs.invalidate_cache(full)
        return str(out["ETag"]).strip('"')

    # ------------------------------------------------------------- maintenance
    def incomplete_uploads(self, full: str) -> list[tuple[str, str, Any]]:
        bucket, _, prefix = full.partition("/")
        found: list[tuple[str, str, Any]] = []
        marker: dict[str, str] = {}
        while True:
            page = self._call("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker)
            found += [(f"{bucket}/{u['Key']}", u["UploadId"], u.get("Initiated")) for u in page.get("Uploads", [])]
            if not page.get("IsTruncated"):
                return found
            marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def abort_upload(self, full: str, upload_id: str) -> None:
        bucket, _, key = full.partition("/")
        self._call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self._call("head_bucket", Bucket=bucket)
        except Exception as exc:
            if says_not_found(exc):
                return False
            raise
        return True


def _condition(request: PutRequest) -> dict[str, str]:
    if request.mode == "create":
        return {"IfNoneMatch": "*"}
    if request.if_match is not None:
        etag = request.if_match
        return {"IfMatch": etag if etag.startswith('"') else f'"{etag}"'}
    return {}


class _Multipart:
    """One multipart upload: parts in parallel under the policy, completed or aborted."""

    def __init__(self, backend: S3Backend, full: str, url: str, request: PutRequest) -> None:
        self.backend, self.url, self.request = backend, url, request
        self.bucket, self.key, _ = backend.fs.split_path(full)
        self.full = full
        self.failed = threading.Event()

    def run(self, data: memoryview) -> str:
        b, req = self.backend, self.request
        ids = {"Bucket": self.bucket, "Key": self.key}
        mpu = b.policy.call(lambda: b._call("create_multipart_upload", **ids), self.url)
        ids["UploadId"] = mpu["UploadId"]
        offsets = list(range(0, len(data), req.part_size))
        try:
            parts = run_parallel(
                lambda i: self._part(data, ids, i, len(offsets)), range(len(offsets)),
                concurrency=req.concurrency, name="streamio-s3-part",
            )
            out = b._call("complete_multipart_upload", **ids, MultipartUpload={"Parts": parts}, **_condition(req))
        except BaseException:
            with contextlib.suppress(Exception):
                b._call("abort_multipart_upload", **ids)
            raise
        b.fs.invalidate_cache(self.full)
        return str(out["ETag"]).strip('"')

    def _part(self, data: memoryview, ids: dict[str, Any], i: int, count: int) -> dict[str, Any] | None:
        if self.failed.is_set():  # another part already failed: the upload is lost, send no more
            return None
        start = i * self.request.part_size
        body = bytes(data[start : start + self.request.part_size])
        b = self.backend
        try:
            out = b.policy.call(
                lambda: b._call("upload_part", **ids, PartNumber=i + 1, Body=body), f"{self.url} (part {i + 1}/{count})"
            )
        except BaseException:
            self.failed.set()
            raise
        return {"PartNumber": i + 1, "ETag": out["ETag"]}


# ----------------------------------------------------------------- the botocore client for whole reads
def sync_client(fs: Any) -> Any:
    """The botocore S3 client mirroring ``fs`` (module docstring), one per filesystem instance, shared by
    every thread; kept on it: filesystems made with the same arguments compare equal under any ``AWS_*`` env."""
    with _CLIENTS_LOCK:
        found = cached_client(fs)
        if found is None:
            setattr(fs, _CLIENT_ATTR, found := _make_client(fs))
            guard_library_logs()  # botocore's modules imported for this client log secrets at DEBUG
        return found


def cached_client(fs: Any) -> Any | None:  # the client sync_client made for fs, if any
    return vars(fs).get(_CLIENT_ATTR)


def _make_client(fs: Any) -> Any:
    import botocore.config
    import botocore.session
    from botocore import UNSIGNED

    from streamio.storage.backends.s3_bodies import bound_client

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
        keys = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"}
        init = {k: v for k, v in init.items() if k not in keys}
        client_kwargs = {k: v for k, v in client_kwargs.items() if k not in keys}
        config["signature_version"] = UNSIGNED
    config.pop("http_session_cls", None)  # aiobotocore's option; this client gets bound_client instead
    session = shared_loader(botocore.session.Session(**fs.kwargs))
    client = session.create_client("s3", config=botocore.config.Config(**config), **init, **client_kwargs)
    return bound_client(client)


def _read_at_most(body: Any, url: str, length: int, limit: int) -> bytes:
    """A body of at most ``limit`` bytes, whatever its headers said, checked against ``length``."""
    data: bytes = body.read(limit + 1)
    if len(data) > limit:
        raise too_large(url, None, limit)
    if len(data) < length:
        raise TruncatedBodyError(f"{url}: body ended at byte {len(data)}, expected {length}")
    return data


def _shut(body: Any) -> None:
    """Unblock a thread reading ``body`` (botocore's): shut its socket for reading, else close it."""
    raw = getattr(body, "_raw_stream", None)
    try:
        raw.shutdown()  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - no socket to shut (released, or another urllib3): close instead
        body.close()


def shared_loader(session: Any) -> Any:
    """``session`` with this process's one botocore data loader: the JSON service models, endpoints
    and retry rules parsed once per process tree, not once per client.

    Every new process (each DataLoader worker, every epoch) makes its own clients; with a loader of
    its own each parses the S3 model again: 0.5 CPU-seconds before its first byte, measured. A
    forked worker inherits the parent's loader with everything it has parsed. A session with a
    custom ``data_path`` (``AWS_DATA_PATH``) keeps its own.
    """
    global _LOADER
    if session.get_config_variable("data_path"):
        return session
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _LOADER)
    return session


def _extra_kwargs(fs: Any, s3: Any) -> dict[str, Any]:
    """Requester-pays and the caller's ``s3_additional_kwargs`` that GetObject accepts."""
    if not (extra := {**fs.s3_additional_kwargs, **fs.req_kw}):
        return {}
    members = s3.meta.service_model.operation_model("GetObject").input_shape.members
    return {k: v for k, v in extra.items() if k in members}
