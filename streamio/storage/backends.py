"""Per-backend mechanics under :class:`~streamio.storage.store.Store`: filesystems, streams, atomic puts.

The store is generic; what differs per backend lives here, each function doing exactly one
attempt (the store's :class:`~streamio.storage.retry.RetryPolicy` decides retries):

Filesystems (:func:`make_fs`): s3fs's own retry loop is set to one attempt (``fs.retries = 1``)
and botocore to ``total_max_attempts=1``; gcsfs's retry decorator is bypassed on the instance
(``_request.__wrapped__``, no global patch). Without this, attempts multiply (25 attempts / 34 s
for one persistent 503 with the defaults).

Streams (:func:`open_stream`): one GET whose body is yielded as it arrives (S3: aiobotocore's
body; GCS: the aiohttp response; others: ``fs.open`` + ``read``). The first piece is handed over
as soon as any bytes arrived (time to first byte); later pieces are gathered up to ``piece``
bytes to keep the per-piece cost of crossing into fsspec's event loop small.

Atomic puts (what each backend guarantees):

* local (``file://``): temp file beside the target (``.NAME.*.streamio-tmp``), fsync, then
  ``os.replace`` (overwrite) or ``os.link`` (create-only: fails if the name exists), then fsync of
  the directory. All writes into one directory hold an exclusive ``flock`` on it, so a
  compare-and-swap (``if_match``) compares and replaces without interleaving, also across
  processes on this machine (not across NFS clients). Version: ``inode-mtime_ns-size``.
* memory: one process-wide lock around compare + write. Version: CRC32C of the content.
* S3: one ``PutObject`` (below ``multipart_threshold``) or a multipart upload whose parts go up
  in parallel (bounded by ``concurrency``) and which becomes visible only on completion (aborted
  on failure). Create-only sends ``If-None-Match: *``, compare-and-swap ``If-Match: "etag"``,
  on the single PUT and on the completion; 412 -> WriteConflictError. Version: ETag.
  A compare-and-swap multipart put first compares the version with a HEAD (moto ignores
  ``If-Match`` on the completion; AWS honours it, which closes the remaining window there).
  A part that exhausts its retries stops the upload (no further part is sent) and the upload
  is aborted. A process killed mid-upload cannot abort: its upload stays invisible but billed;
  set the bucket lifecycle rule ``AbortIncompleteMultipartUpload`` (e.g. DaysAfterInitiation 1)
  or run ``streamio ckpt gc``, which removes stale uploads.
* GCS: a JSON-API multipart upload, one request, with ``ifGenerationMatch`` (0 for create-only,
  the generation for compare-and-swap; gcsfs itself only sends 0); 412 -> WriteConflictError.
  Unconditional writes above the store's multipart threshold go as a resumable upload sent in
  parts (one part in memory at a time, invisible until the last part lands). Conditional ones
  stay single-request whatever their size, because fake-gcs-server 1.54 ignores
  ``ifGenerationMatch`` on resumable uploads (measured), so the emulator could not test them.
  Version: generation.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import mmap
import os
import tempfile
import threading
import types
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from fsspec.asyn import sync

from streamio.checksum import crc32c
from streamio.errors import CorruptDataError, WriteConflictError
from streamio.storage.retry import RetryPolicy

TMP_SUFFIX = ".streamio-tmp"
_MEMORY_LOCK = threading.Lock()


def protocol_of(fs: Any) -> str:
    """The canonical protocol name of an fsspec filesystem (``s3``, ``gs``, ``file``, ``memory``...)."""
    proto = fs.protocol
    name = proto[0] if isinstance(proto, (tuple, list)) else proto
    return {"local": "file", "gcs": "gs", "s3a": "s3"}.get(name, name)


def make_fs(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    """A fresh fsspec filesystem for ``url`` with its inner retries configured down; ``(fs, root)``."""
    opts = dict(options)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        opts["config_kwargs"] = config
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **opts)
    proto = protocol_of(fs)
    if proto == "s3":
        fs.retries = 1
    elif proto == "gs":
        inner = getattr(type(fs)._request, "__wrapped__", None)
        if inner is not None:
            fs._request = types.MethodType(inner, fs)
    return fs, root.rstrip("/")


# --------------------------------------------------------------------------- streams
def open_stream(
    fs: Any, full: str, start: int, end: int | None, piece: int, on_end: Callable[[int], None]
) -> Iterator[bytes]:
    """Yield bytes ``[start, end)`` of ``full`` from ONE request, as they arrive.

    ``on_end(absolute_end)`` is called once the response says where the body ends (needed when
    ``end`` is None). The stream may stop early without error (a truncated body); the caller
    checks the length.
    """
    proto = protocol_of(fs)
    if proto == "s3":
        return _s3_stream(fs, full, start, end, piece, on_end)
    if proto == "gs":
        return _gcs_stream(fs, full, start, end, piece, on_end)
    return _generic_stream(fs, full, start, end, piece, on_end)


async def _s3_call(fs: Any, op: str, **kwargs: Any) -> Any:
    """One botocore call through s3fs's client, without s3fs's retry wrapper.

    ``fs._call_s3`` with ``retries=1`` still sleeps 0.1 s after a retryable failure and turns
    errors into bare OSErrors; the policy above wants the botocore error at once.
    """
    await fs.set_session()
    s3 = await fs.get_s3(kwargs.get("Bucket"))
    method = getattr(s3, op)
    return await method(**fs._get_s3_method_kwargs(method, **kwargs))


def _range_header(start: int, end: int | None) -> str | None:
    if start == 0 and end is None:
        return None
    return f"bytes={start}-{'' if end is None else end - 1}"


async def _gather(read: Callable[[int], Any], n: int, eager: bool) -> bytes:
    """Up to ``n`` bytes: the first arrival if ``eager``, else reads until ``n`` or EOF."""
    first = await read(n)
    if eager or not first or len(first) >= n:
        return bytes(first)
    parts = [first]
    got = len(first)
    while got < n:
        more = await read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _s3_stream(
    fs: Any, full: str, start: int, end: int | None, piece: int, on_end: Callable[[int], None]
) -> Iterator[bytes]:
    bucket, key, version_id = fs.split_path(full)
    kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
    rng = _range_header(start, end)
    if rng:
        kw["Range"] = rng
    if version_id:
        kw["VersionId"] = version_id
    resp = sync(fs.loop, _s3_call, fs, "get_object", **kw)
    body = resp["Body"]
    try:
        length = resp.get("ContentLength")
        if length is not None:
            on_end(start + int(length))
        eager = True
        while True:
            data = sync(fs.loop, _gather, body.read, piece, eager)
            eager = False
            if not data:
                return
            yield data
    finally:
        with contextlib.suppress(Exception):
            body.close()


def _gcs_stream(
    fs: Any, full: str, start: int, end: int | None, piece: int, on_end: Callable[[int], None]
) -> Iterator[bytes]:
    from gcsfs.retry import validate_response

    url = fs.url(full)
    rng = _range_header(start, end)
    headers = {"Range": rng} if rng else {}

    async def opening() -> Any:
        await fs._set_session()
        r = await fs.session.get(url, headers=fs._get_headers(headers), timeout=fs.requests_timeout)
        if r.status >= 400:
            content = await r.read()
            r.release()
            validate_response(r.status, content, full)
        return r

    r = sync(fs.loop, opening)
    try:
        length = r.headers.get("Content-Length")
        if length is not None:
            on_end(start + int(length))
        eager = True
        while True:
            data = sync(fs.loop, _gather, r.content.read, piece, eager)
            eager = False
            if not data:
                return
            yield data
    finally:
        r.close()


def _generic_stream(
    fs: Any, full: str, start: int, end: int | None, piece: int, on_end: Callable[[int], None]
) -> Iterator[bytes]:
    with fs.open(full, "rb") as f:
        size = int(fs.size(full))
        on_end(size if end is None else min(end, size))
        end = size if end is None else min(end, size)
        f.seek(start)
        pos = start
        while pos < end:
            data = f.read(min(piece, end - pos))
            if not data:
                return
            pos += len(data)
            yield data


def map_local(full: str) -> bytes | memoryview:
    """A local file as a read-only memory map (``b""`` if empty).

    Reading a part through the map costs one pass over the page cache; a ``read`` first fills
    fresh anonymous memory, page fault by page fault (measured: CRC32C + copy into tensors of
    8 x 38 MB parts, 8 threads, 0.05 s mapped vs 0.16 s read). The map outlives an unlink of the
    file; streamio never rewrites a file in place (temp + link/rename), and only such a
    truncation by another writer could fault a reader (SIGBUS), so use it for immutable objects.
    """
    with open(full, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def shorter_than_expected(url: str, ends_at: int, wanted_end: int) -> CorruptDataError:
    """The error for an object that ends before the byte a caller (index, manifest) asked for:
    permanent, never retried, the same words on every backend and read path."""
    return CorruptDataError(
        f"{url} ends at byte {ends_at}, before the requested end {wanted_end}: the object is "
        f"shorter than the caller (index, manifest) expects; re-run `streamio verify` on it"
    )


def read_local(full: str, url: str, start: int, end: int | None) -> bytes:
    """Bytes ``[start, end)`` of a local file in one ``read`` (straight into the result, no
    pieces to join): the whole-object read a checkpoint restore does is bound by the page cache
    copy, not by Python. A file shorter than ``end`` raises :class:`CorruptDataError` (as the
    streamed path does), never a retry loop."""
    with open(full, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        stop = size if end is None else end
        if stop > size:
            raise shorter_than_expected(url, size, stop)
        if stop <= start:
            return b""
        if start:
            f.seek(start)
        want = stop - start
        data = f.read(want)  # FileIO.read(n): one allocation, read(2) into it
        if len(data) != want:  # the file shrank under us: read the rest, the length is checked
            rest = f.read(want - len(data))
            data += rest or b""
        if len(data) != want:
            raise CorruptDataError(f"{url}: read {len(data)} bytes of [{start}, {stop}), the file shrank while being read")
        return data


# --------------------------------------------------------------------------- info
def info_object(fs: Any, full: str) -> tuple[int, str | None]:
    """``(size, version)`` of one object in ONE request where the backend allows it.

    s3fs's ``info`` follows a 404 HEAD with a listing (to find "directories") and gcsfs's turns a
    403 into a listing too; an object store has objects only, so S3 and GCS ask directly.
    """
    proto = protocol_of(fs)
    if proto == "s3":
        bucket, key, version_id = fs.split_path(full)
        kw = {"VersionId": version_id} if version_id else {}
        out = sync(fs.loop, _s3_call, fs, "head_object", Bucket=bucket, Key=key, **kw)
        return int(out["ContentLength"]), str(out.get("ETag", "")).strip('"') or None
    if proto == "gs":
        bucket, key, _ = fs.split_path(full)
        if not key:
            raise FileNotFoundError(full)
        out = sync(fs.loop, fs._call, "GET", "b/{}/o/{}", bucket, key, json_out=True)
        return int(out["size"]), str(out["generation"])
    fs.invalidate_cache(full)
    d = fs.info(full)
    if d.get("type") == "directory":
        raise FileNotFoundError(full)
    if proto == "file":
        return int(d["size"]), local_version(d["name"])
    if proto == "memory":
        return int(d["size"]), memory_version(fs.cat_file(full))
    version = d.get("ETag") or d.get("etag") or d.get("generation")
    return int(d.get("size") or 0), None if version is None else str(version).strip('"')


# --------------------------------------------------------------------------- versions
def local_version(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


def memory_version(data: bytes) -> str:
    return f"{crc32c(data):08x}-{len(data)}"


# --------------------------------------------------------------------------- puts
def conflict(url: str, mode: str, if_match: str | None, found: str | None) -> WriteConflictError:
    if if_match is not None:
        what = "does not exist" if found is None else f"is at version {found}"
        return WriteConflictError(
            f"compare-and-swap write to {url} lost: expected version {if_match}, but the object {what} "
            f"(another writer changed it); re-read it and decide again"
        )
    return WriteConflictError(f"create-only write to {url} lost: the object already exists; read it or pick another name")


@contextlib.contextmanager
def _dir_lock(directory: str) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def put_local(full: str, url: str, data: bytes | memoryview, mode: str, if_match: str | None) -> str:
    """Atomic local write (see module docstring); returns the new version."""
    directory = os.path.dirname(full) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(full)}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with _dir_lock(directory):
            if mode == "create":
                try:
                    os.link(tmp, full)
                except FileExistsError:
                    raise conflict(url, mode, None, None) from None
            else:
                if if_match is not None:
                    try:
                        found: str | None = local_version(full)
                    except FileNotFoundError:
                        found = None
                    if found != if_match:
                        raise conflict(url, mode, if_match, found)
                os.replace(tmp, full)
            version = local_version(full)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return version
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def put_memory(fs: Any, full: str, url: str, data: bytes, mode: str, if_match: str | None) -> str:
    with _MEMORY_LOCK:
        try:
            found: str | None = memory_version(fs.cat_file(full))
        except FileNotFoundError:
            found = None
        if mode == "create" and found is not None:
            raise conflict(url, mode, None, found)
        if if_match is not None and found != if_match:
            raise conflict(url, mode, if_match, found)
        fs.pipe_file(full, data)
        return memory_version(data)


def _s3_condition(mode: str, if_match: str | None) -> dict[str, str]:
    if mode == "create":
        return {"IfNoneMatch": "*"}
    if if_match is not None:
        return {"IfMatch": if_match if if_match.startswith('"') else f'"{if_match}"'}
    return {}


class _PartSkipped(Exception):
    """A part not sent because another one failed first (never escapes put_s3)."""


def _client_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def put_s3(
    fs: Any,
    full: str,
    url: str,
    data: memoryview,
    mode: str,
    if_match: str | None,
    *,
    policy: RetryPolicy,
    part_size: int,
    multipart_threshold: int,
    concurrency: int,
) -> str:
    """One attempt at an atomic S3 put (the single PUT is retried by the caller; parts here)."""
    bucket, key, _ = fs.split_path(full)
    cond = _s3_condition(mode, if_match)
    if len(data) < multipart_threshold:
        try:
            out = sync(fs.loop, _s3_call, fs, "put_object", Bucket=bucket, Key=key, Body=bytes(data), **cond)
        except Exception as exc:
            # If-Match on a key that is gone answers 404 NoSuchKey: for the caller, a lost CAS
            if if_match is not None and _client_code(exc) == "NoSuchKey":
                raise conflict(url, mode, if_match, None) from exc
            raise
        fs.invalidate_cache(full)
        return str(out["ETag"]).strip('"')
    if if_match is not None:
        # IfMatch on the completion closes the race on AWS; moto ignores it there, and either way
        # a stale version is best found before uploading gigabytes
        try:
            found: str | None = policy.call(lambda: info_object(fs, full)[1], url)
        except FileNotFoundError:
            found = None
        if found != if_match.strip('"'):
            raise conflict(url, mode, if_match, found)
    mpu = policy.call(lambda: sync(fs.loop, _s3_call, fs, "create_multipart_upload", Bucket=bucket, Key=key), url)
    upload_id = mpu["UploadId"]
    offsets = list(range(0, len(data), part_size))

    failed = threading.Event()

    def upload(i: int) -> dict[str, Any]:
        if failed.is_set():  # another part already failed: the upload is lost, send no more
            raise _PartSkipped(f"{url}: part {i + 1} skipped after another part failed")
        body = bytes(data[offsets[i] : offsets[i] + part_size])
        try:
            out = _upload_part(body, i)
        except BaseException:
            failed.set()
            raise
        return {"PartNumber": i + 1, "ETag": out["ETag"]}

    def _upload_part(body: bytes, i: int) -> Any:
        return policy.call(
            lambda: sync(
                fs.loop, _s3_call, fs, "upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=i + 1, Body=body
            ),
            f"{url} (part {i + 1}/{len(offsets)})",
        )

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(offsets)))) as pool:
            futures = [pool.submit(upload, i) for i in range(len(offsets))]
            try:
                parts = [f.result() for f in futures]
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # parts not started never start
                first = next((f.exception() for f in futures if f.done() and not f.cancelled()
                              and f.exception() is not None and not isinstance(f.exception(), _PartSkipped)), None)
                if first is not None:
                    raise first from None
                raise
        out = sync(
            fs.loop,
            _s3_call,
            fs,
            "complete_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
            **cond,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            sync(fs.loop, _s3_call, fs, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        raise
    fs.invalidate_cache(full)
    return str(out["ETag"]).strip('"')


def put_gcs(
    fs: Any, full: str, url: str, data: memoryview, mode: str, if_match: str | None, *, resumable_threshold: int, chunk: int
) -> str:
    """One attempt at a conditional GCS upload; returns the generation.

    Below ``resumable_threshold``: one JSON-API multipart upload. Above: a resumable upload sent
    in ``chunk``-byte pieces (a multiple of 256 KiB), so memory stays one chunk above the data;
    the object appears only when the last piece lands. Both carry ``ifGenerationMatch``.
    """
    bucket, key, _ = fs.split_path(full)
    params: dict[str, str] = {}
    if mode == "create":
        params["ifGenerationMatch"] = "0"
    elif if_match is not None:
        params["ifGenerationMatch"] = str(if_match)
    base = f"{fs._location}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
    try:
        # conditional writes always go as one multipart request: fake-gcs-server 1.54 ignores
        # ifGenerationMatch on resumable uploads (measured; real GCS honours it there too)
        if len(data) >= resumable_threshold and not params:
            out = _gcs_resumable(fs, base, key, data, params, chunk)
        else:
            meta = json.dumps({"name": key}).encode()
            boundary = b"==streamio=="
            body = b"".join(
                [
                    b"--" + boundary + b"\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + meta,
                    b"\r\n--" + boundary + b"\r\nContent-Type: application/octet-stream\r\n\r\n",
                    bytes(data),
                    b"\r\n--" + boundary + b"--",
                ]
            )
            out = sync(
                fs.loop,
                fs._call,
                "POST",
                base,
                uploadType="multipart",
                headers={"Content-Type": f'multipart/related; boundary="{boundary.decode()}"'},
                data=io.BytesIO(body),  # aiohttp warns on (and blocks the loop for) large raw bytes
                json_out=True,
                **params,
            )
    except FileExistsError as exc:  # gcsfs maps 412 to FileExistsError
        raise conflict(url, mode, if_match, None) from exc
    fs.invalidate_cache(full)
    return str(out["generation"])


def _gcs_resumable(fs: Any, base: str, key: str, data: memoryview, params: dict[str, str], chunk: int) -> Any:
    headers, _ = sync(fs.loop, fs._call, "POST", base, uploadType="resumable", json={"name": key}, **params)
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
            headers, txt = sync(fs.loop, fs._call, "POST", location, headers=head, data=io.BytesIO(bit))
            received = headers.get("Range")  # 308: what the server has so far, "bytes=0-N"
            offset = int(received.split("-")[1]) + 1 if received and offset + len(bit) < size else offset + len(bit)
    except BaseException:
        with contextlib.suppress(Exception):
            sync(fs.loop, fs._call, "DELETE", location)
        raise
    return json.loads(txt)


def incomplete_uploads_s3(fs: Any, full: str) -> list[tuple[str, str, Any]]:
    """``(key, upload id, initiated)`` of every incomplete multipart upload under ``full``."""
    bucket, _, prefix = full.partition("/")
    found: list[tuple[str, str, Any]] = []
    marker: dict[str, str] = {}
    while True:
        page = sync(fs.loop, _s3_call, fs, "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker)
        found += [(u["Key"], u["UploadId"], u.get("Initiated")) for u in page.get("Uploads", [])]
        if not page.get("IsTruncated"):
            return found
        marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def abort_upload_s3(fs: Any, full: str, key: str, upload_id: str) -> None:
    """Abort one multipart upload (its parts stop being stored and billed)."""
    bucket = full.partition("/")[0]
    sync(fs.loop, _s3_call, fs, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
