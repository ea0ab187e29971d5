"""Google Cloud Storage (``gs://``) through gcsfs's session and JSON API.

Retries: gcsfs's retry decorator is bypassed on the instance (``_request.__wrapped__``, no
global patch), so the store's policy alone retries.

Streams: one ranged GET whose aiohttp response body is yielded as it arrives. Info: one JSON-API
object GET (gcsfs's ``info`` turns a 403 into a listing). Version: the object's generation.

Puts: a JSON-API multipart upload, one request, with ``ifGenerationMatch`` (0 for create-only,
the generation for compare-and-swap; gcsfs itself only sends 0); 412 -> WriteConflictError.
Unconditional writes above the store's multipart threshold go as a resumable upload sent in
parts (one part in memory at a time, invisible until the last part lands). Conditional ones stay
single-request whatever their size, because fake-gcs-server 1.54 ignores ``ifGenerationMatch`` on
resumable uploads (measured), so the emulator could not test them.

Requests are counted (:mod:`streamio.storage.accounting`) by an aiohttp ``TraceConfig`` on gcsfs's
session (aiohttp's public hook, passed through gcsfs's ``session_kwargs``): each attempt with its
op, status and seconds to the response headers. Object bytes: what a stream received
(``content.total_bytes``), and the object bytes of each upload request sent (not the multipart
envelope).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import types
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from fsspec.asyn import sync

from streamio.storage import accounting
from streamio.storage.backends.base import OnEnd, PutRequest, conflict, pump, range_header, within
from streamio.storage.backends.generic import GenericBackend
from streamio.storage.bodies import ERROR_BODY_LIMIT, bounded_async
from streamio.storage.deadline import Pace
from streamio.storage.failures import says_not_found
from streamio.storage.retry import RetryPolicy

_BOUNDARY = b"==streamio=="


class GcsBackend(GenericBackend):
    """``gs://`` (see the module docstring)."""

    find_kwargs: Mapping[str, Any] = {}
    writes_per_s = 1000.0  # Google: the writes per second a bucket starts with (it ramps up from there)
    endpoint_env = ("STORAGE_EMULATOR_HOST",)
    counts_requests = True  # a TraceConfig counts every HTTP attempt

    def __init__(self, fs: Any, root: str, protocol: str, *, options: Mapping[str, Any], policy: RetryPolicy) -> None:
        super().__init__(fs, root, protocol, options=options, policy=policy)
        self.bucket = root.partition("/")[0] or None

    @classmethod
    def fs_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        opts = dict(options)
        session = dict(opts.get("session_kwargs") or {})
        session["trace_configs"] = [*session.get("trace_configs", ()), counting_trace()]
        opts["session_kwargs"] = session
        return opts

    @classmethod
    def configure(cls, fs: Any) -> None:
        inner = getattr(type(fs)._request, "__wrapped__", None)
        if inner is not None:
            fs._request = types.MethodType(inner, fs)

    def open_stream(self, full: str, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
        from gcsfs.retry import validate_response

        fs = self.fs
        url = fs.url(full)
        rng = range_header(start, end)
        headers = {"Range": rng} if rng else {}

        async def opening() -> Any:
            await fs._set_session()
            r = await fs.session.get(url, headers=fs._get_headers(headers), timeout=fs.requests_timeout)
            if r.status >= 400:  # an error body is read within a limit: the status decides, not its text
                content = await bounded_async(r.content.iter_chunked(1 << 16), ERROR_BODY_LIMIT, r.status, url, r.close)
                r.release()
                validate_response(r.status, content, full)
            return r

        deadline = self.policy.body_deadline
        try:
            r = sync(fs.loop, within, deadline.grace, opening())
        except TimeoutError as exc:
            raise deadline.missed(f"gs://{full}", None) from exc
        try:
            length = r.headers.get("Content-Length")
            if length is not None:
                on_end(start + int(length))
            yield from pump(fs.loop, r.content.read, piece, Pace(deadline, f"gs://{full}"))
        finally:
            accounting.read_bytes(accounting.received(r))  # read or not, cut or not
            r.close()

    def info(self, full: str) -> tuple[int, str | None]:
        bucket, key, _ = self.fs.split_path(full)
        if not key:
            raise FileNotFoundError(full)
        out = sync(self.fs.loop, self.fs._call, "GET", "b/{}/o/{}", bucket, key, json_out=True)
        return int(out["size"]), str(out["generation"])

    def version_of(self, entry: Mapping[str, Any]) -> str | None:
        version = entry.get("generation")
        return None if version is None else str(version).strip('"')

    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str:
        """One attempt at a (conditional) upload; returns the generation."""
        fs = self.fs
        bucket, key, _ = fs.split_path(full)
        params: dict[str, str] = {}
        if request.mode == "create":
            params["ifGenerationMatch"] = "0"
        elif request.if_match is not None:
            params["ifGenerationMatch"] = str(request.if_match)
        base = f"{fs._location}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        try:
            # conditional writes always go as one multipart request: fake-gcs-server 1.54 ignores
            # ifGenerationMatch on resumable uploads (measured; real GCS honours it there too)
            if len(data) >= request.multipart_threshold and not params:
                out = self._resumable(base, key, data, request.part_size)
            else:
                out = self._multipart(base, key, data, params)
        except FileExistsError as exc:  # gcsfs maps 412 to FileExistsError
            raise conflict(url, request.if_match, None) from exc
        fs.invalidate_cache(full)
        return str(out["generation"])

    def _multipart(self, base: str, key: str, data: memoryview, params: dict[str, str]) -> Any:
        meta = json.dumps({"name": key}).encode()
        body = b"".join(
            [
                b"--" + _BOUNDARY + b"\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + meta,
                b"\r\n--" + _BOUNDARY + b"\r\nContent-Type: application/octet-stream\r\n\r\n",
                bytes(data),
                b"\r\n--" + _BOUNDARY + b"--",
            ]
        )
        accounting.written_bytes(len(data))
        return sync(
            self.fs.loop,
            self.fs._call,
            "POST",
            base,
            uploadType="multipart",
            headers={"Content-Type": f'multipart/related; boundary="{_BOUNDARY.decode()}"'},
            data=io.BytesIO(body),  # aiohttp warns on (and blocks the loop for) large raw bytes
            json_out=True,
            **params,
        )

    def _resumable(self, base: str, key: str, data: memoryview, chunk: int) -> Any:
        """A resumable upload in ``chunk``-byte pieces (a multiple of 256 KiB): memory stays one
        chunk above the data, and the object appears only when the last piece lands."""
        fs = self.fs
        headers, _ = sync(fs.loop, fs._call, "POST", base, uploadType="resumable", json={"name": key})
        location = headers["Location"]
        size = len(data)
        offset = 0
        txt: Any = b""
        try:
            while offset < size:
                bit = bytes(data[offset : offset + chunk])
                head = {
                    "Content-Range": f"bytes {offset}-{offset + len(bit) - 1}/{size}",
                    "Content-Length": str(len(bit)),
                    "Content-Type": "application/octet-stream",
                }
                accounting.written_bytes(len(bit))
                headers, txt = sync(fs.loop, fs._call, "POST", location, headers=head, data=io.BytesIO(bit))
                received = headers.get("Range")  # 308: what the server has so far, "bytes=0-N"
                done = offset + len(bit) >= size
                offset = int(received.split("-")[1]) + 1 if received and not done else offset + len(bit)
        except BaseException:
            with contextlib.suppress(Exception), accounting.at_once():
                sync(fs.loop, fs._call, "DELETE", location)
            raise
        return json.loads(txt)

    def bucket_exists(self, bucket: str) -> bool:
        try:
            sync(self.fs.loop, self.fs._call, "GET", "b/{}/o", bucket, maxResults=1, json_out=True)
        except Exception as exc:
            if says_not_found(exc):
                return False
            raise
        return True


# ----------------------------------------------------------------- counting requests
async def _started(session: Any, ctx: Any, params: Any) -> None:
    ctx.op, ctx.began = accounting.gcs_op(params.method, str(params.url)), time.monotonic()


async def _answered(session: Any, ctx: Any, params: Any) -> None:
    status = params.response.status
    if status == 499 and params.method == "DELETE" and "upload_id=" in str(params.url):
        status = 204  # GCS answers the cancel of a resumable upload with 499: it was cancelled
    accounting.attempt(ctx.op, status, time.monotonic() - ctx.began)


async def _unanswered(session: Any, ctx: Any, params: Any) -> None:
    accounting.attempt(ctx.op, None)


def counting_trace() -> Any:
    """An aiohttp ``TraceConfig`` that counts each request of the session it is given to; pickled
    as "make a new one" (the filesystem's options travel with it to other processes)."""
    import aiohttp

    class _Counting(aiohttp.TraceConfig):  # type: ignore[misc]
        def __reduce__(self) -> tuple[Any, ...]:
            return counting_trace, ()

    config = _Counting()
    config.on_request_start.append(_started)
    config.on_request_end.append(_answered)
    config.on_request_exception.append(_unanswered)
    return config
