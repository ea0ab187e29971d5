"""A fault-injecting HTTP/1.1 proxy for testing storage code over real HTTP.

:class:`FaultProxy` listens on ``127.0.0.1:<free port>`` and forwards every request to one
upstream server (a moto S3 server, a GCS emulator, any HTTP server). Point a client at
``proxy.endpoint_url`` instead of the server, then inject faults between them::

    with local_s3() as s3, FaultProxy(s3.endpoint_url) as proxy:
        store = Store(s3.url("x"), s3.storage_options(proxy.endpoint_url))
        proxy.fail_next(3)                 # three 503 SlowDown answers, then normal service
        proxy.reset_after(8 << 20)         # every response body cut (TCP RST) after 8 MiB
        proxy.truncate_next(1, 1000)       # full Content-Length, 1000 bytes, then close
        proxy.corrupt_next(1, 10)          # one flipped byte, no error anywhere
        proxy.set_latency(0.05)            # 50 ms before every response's first byte
        proxy.on_upload_bytes(n, kill)     # kill() once n request-body bytes went upstream; cut there
        proxy.count("GET", "shard-000")    # requests seen, from the thread-safe log

Why a proxy rather than mocks: the faults that matter (a reset mid-body, a short body under a
full ``Content-Length``, throttling) exercise the real client stack (aiohttp, botocore, s3fs's
retry loops), which a monkeypatched filesystem never does.

Design:

* One upstream connection per request (moto closes after every response anyway), bodies
  streamed in 64 KiB pieces both ways so a large object never sits in memory and the first
  bytes reach the client before the last leave the server.
* Body faults (reset, truncate, corrupt) apply only to successful (2xx) responses whose body is
  longer than the fault's byte offset: a ``HEAD``, a listing shorter than the cut or an error
  body never consumes a fault. ``fail_next`` answers the next matching requests itself without
  forwarding them (the request body is read and dropped), with an S3-style XML error body.
* Every fault method takes optional ``method=`` / ``path_contains=`` filters.
* What a client sees of a cut: ``reset_after`` closes with a TCP RST, and the client's kernel
  drops whatever it had received but not yet read, so a client resumes at or before the cut
  (sometimes at 0 if it had read nothing). ``truncate_next`` closes with a FIN after the short
  body; aiohttp (s3fs, gcsfs) then raises on its next read and discards what it had buffered,
  so the same holds. ``set_bandwidth`` makes the bytes trickle in as over a real network,
  which keeps such counts close to ``size / cut``.
* ``requests`` is a list of :class:`RequestRecord`, appended under a lock just before a
  response's last byte leaves (so a client that saw a response complete finds it logged).
  ``path`` is the URL path without the query string, percent-decoded (for S3 path-style URLs,
  ``/bucket/key``); ``query`` keeps the rest.
"""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

_PIECE = 64 << 10
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
}


@dataclass(frozen=True)
class RequestRecord:
    """One request that went through the proxy.

    Attributes:
        method: HTTP method.
        path: URL path, percent-decoded, without the query (``/bucket/key`` on S3 path-style).
        query: the raw query string ('' if none).
        range: the request's ``Range`` header, or None.
        status: status sent to the client (0 if the connection died before a status).
        request_bytes: request-body bytes received from the client.
        response_bytes: response-body bytes sent to the client.
        fault: the fault applied (``"fail"``, ``"reset"``, ``"truncate"``, ``"corrupt"``) or None.
    """

    method: str
    path: str
    query: str
    range: str | None
    status: int
    request_bytes: int
    response_bytes: int
    fault: str | None = None


@dataclass
class _Fault:
    kind: str
    remaining: int | None  # None: unlimited
    offset: int = 0
    status: int = 503
    code: str = "SlowDown"
    method: str | None = None
    path_contains: str | None = None

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        return self.path_contains is None or self.path_contains in path


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 16 loaders connecting at once (2 ranks x 2
    # workers x 4 prefetches) overflowed it, and a dropped handshake costs the client a SYN
    # retransmit (1 s, 3 s, ...) or, once it thinks it is connected, its whole read timeout.
    request_queue_size = 1024


class FaultProxy:
    """A threaded HTTP/1.1 forwarding proxy on 127.0.0.1 that injects faults; see module docstring.

    Args:
        upstream_url: ``http://host:port`` of the real server.

    Call order: construct -> :meth:`start` (or ``with``) -> configure faults at any time ->
    :meth:`stop`. Fault settings are thread-safe and take effect for the next request.
    """

    def __init__(self, upstream_url: str) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"FaultProxy upstream {upstream_url!r} must be an http(s)://host:port URL")
        self.upstream_url = upstream_url.rstrip("/")
        self._scheme = parsed.scheme
        self._host = parsed.hostname
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.endpoint_url = ""
        self.requests: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._latency = 0.0
        self._bandwidth: float | None = None
        self._faults: list[_Fault] = []
        self._upload_trigger: tuple[int, Callable[[], Any], bool] | None = None
        self._uploaded = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FaultProxy:
        """Listen on a free loopback port; sets :attr:`endpoint_url`. Returns self."""
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (_Handler,), {"proxy": self})
        server = _Server(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        host, port = server.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.name = f"FaultProxy:{port}"
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (connections in flight are abandoned)."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ fault settings
    def set_latency(self, first_byte_s: float) -> None:
        """Delay every response this many seconds before its first byte (0 to disable)."""
        with self._lock:
            self._latency = max(0.0, float(first_byte_s))

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        """Cap each connection's response-body rate (None to lift the cap)."""
        with self._lock:
            self._bandwidth = None if bytes_per_s is None else float(bytes_per_s)

    def fail_next(
        self,
        n: int,
        status: int = 503,
        code: str = "SlowDown",
        *,
        method: str | None = None,
        path_contains: str | None = None,
    ) -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 XML error ``code``.

        The request is not forwarded. Typical: ``(3)`` a SlowDown storm, ``(1, 500,
        "InternalError")``, ``(1, 403, "AccessDenied")``, ``(1, 412, "PreconditionFailed")``.
        """
        self._add(_Fault("fail", n, status=status, code=code, method=method, path_contains=path_contains))

    def reset_after(
        self, nbytes: int, times: int | None = None, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Reset the connection (TCP RST) after ``nbytes`` of a response body.

        Applies to each 2xx response with a longer body, ``times`` times (None: until
        :meth:`clear`).
        """
        self._add(_Fault("reset", times, offset=nbytes, method=method, path_contains=path_contains))

    def truncate_next(
        self, n: int, after_bytes: int, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Send only ``after_bytes`` of the next ``n`` longer bodies under their full length, then close (FIN)."""
        self._add(_Fault("truncate", n, offset=after_bytes, method=method, path_contains=path_contains))

    def corrupt_next(
        self, n: int, at_byte: int, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Flip every bit of byte ``at_byte`` of the next ``n`` longer response bodies (no error is raised)."""
        self._add(_Fault("corrupt", n, offset=at_byte, method=method, path_contains=path_contains))

    def on_upload_bytes(self, nbytes: int, callback: Callable[[], Any], *, forward_rest: bool = False) -> None:
        """Call ``callback()`` once, when request bodies forwarded upstream reach ``nbytes`` in all.

        The proxy forwards exactly ``nbytes`` bytes, then calls ``callback`` (e.g. kill -9 and
        reap the uploading child). Then, by default, it drops that request both ways: the server
        sees a body cut at exactly ``nbytes`` and the connection close, as if the network had
        died with the process. (Without this the cut would not be deterministic: a killed
        process's kernel still sends what the process had written into its socket buffer —
        megabytes on loopback — and the upload could complete after the kill.) With
        ``forward_rest=True`` the rest is forwarded normally (a callback that only observes).
        Counting starts when this is called.
        """
        with self._lock:
            self._upload_trigger = (int(nbytes), callback, forward_rest)
            self._uploaded = 0

    def clear(self) -> None:
        """Forget the request log and every fault, latency, bandwidth cap and trigger."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()
            self._latency = 0.0
            self._bandwidth = None
            self._upload_trigger = None
            self._uploaded = 0

    def count(self, method: str | None = None, path_contains: str | None = None) -> int:
        """Requests logged so far, optionally only one method and/or paths containing a string."""
        with self._lock:
            records = list(self.requests)
        return sum(
            1
            for r in records
            if (method is None or r.method == method.upper()) and (path_contains is None or path_contains in r.path)
        )

    def log(self) -> list[RequestRecord]:
        """A snapshot of the request log."""
        with self._lock:
            return list(self.requests)

    # ------------------------------------------------------------------ internals
    def _add(self, fault: _Fault) -> None:
        if fault.remaining is not None and fault.remaining <= 0:
            return
        with self._lock:
            self._faults.append(fault)

    def _take(self, kinds: tuple[str, ...], method: str, path: str, body_len: int | None = None) -> _Fault | None:
        """Consume one use of the first matching fault of ``kinds`` (body faults need a longer body)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind not in kinds or not fault.matches(method, path):
                    continue
                if fault.kind != "fail" and body_len is not None and body_len <= fault.offset:
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)

    def _settings(self) -> tuple[float, float | None]:
        with self._lock:
            return self._latency, self._bandwidth

    def _upload_progress(self, n: int) -> int:
        """How many of the next ``n`` upload bytes to send before firing the trigger (n if none)."""
        with self._lock:
            if self._upload_trigger is None:
                return n
            limit = self._upload_trigger[0] - self._uploaded
            return max(0, min(n, limit))

    def _uploaded_bytes(self, n: int) -> tuple[Callable[[], Any], bool] | None:
        with self._lock:
            self._uploaded += n
            if self._upload_trigger is not None and self._uploaded >= self._upload_trigger[0]:
                _, callback, forward_rest = self._upload_trigger
                self._upload_trigger = None
                return callback, forward_rest
        return None

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=120)
        return http.client.HTTPConnection(self._host, self._port, timeout=120)


class _Abort(Exception):
    """The client connection is gone; end this request quietly."""


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (ConnectionError, _Abort, socket.timeout, OSError) as exc:
            log.debug("proxy connection ended: %s", exc)
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass

    # every method goes through the same path
    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    # ---------------------------------------------------------------- request side
    def _iter_request_body(self) -> Any:
        """Yield the request body as it arrives (de-chunked if chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(65537)
                if not line:
                    raise _Abort("client closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(left, _PIECE))
                    if not piece:
                        raise _Abort("client closed inside a chunk")
                    left -= len(piece)
                    yield piece
                self.rfile.readline(3)
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                piece = self.rfile.read1(min(left, _PIECE)) if hasattr(self.rfile, "read1") else self.rfile.read(min(left, _PIECE))
                if not piece:
                    raise _Abort("client closed inside the request body")
                left -= len(piece)
                yield piece

    def _proxy(self) -> None:
        proxy = self.proxy
        method = self.command.upper()
        split = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(split.path)
        rng = self.headers.get("Range")
        chunked_req = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        sent_req = 0
        fail = proxy._take(("fail",), method, path)
        if fail is not None:
            for piece in self._iter_request_body():
                sent_req += len(piece)
            # logged before the answer leaves: a client that got it finds it in the log
            proxy._record(RequestRecord(method, path, split.query, rng, fail.status, sent_req, 0, "fail"))
            self._send_error(fail, path)
            return

        upstream = proxy._connect()
        try:
            upstream.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            if chunked_req:
                upstream.putheader("Transfer-Encoding", "chunked")
            upstream.putheader("Connection", "close")
            upstream.endheaders()
            for piece in self._iter_request_body():
                sent_req += len(piece)
                while piece:
                    n = proxy._upload_progress(len(piece))
                    head, piece = piece[:n], piece[n:]
                    if head:
                        upstream.send(b"%x\r\n%s\r\n" % (len(head), head) if chunked_req else head)
                    fired = proxy._uploaded_bytes(len(head))
                    if fired is not None:
                        fired[0]()
                        if not fired[1]:
                            raise _Abort("request cut by on_upload_bytes")
            if chunked_req:
                upstream.send(b"0\r\n\r\n")
            response = upstream.getresponse()
            self._relay(response, method, path, split.query, rng, sent_req)
        except (ConnectionError, _Abort, socket.timeout, OSError) as exc:
            log.debug("proxy: %s %s aborted: %s", method, path, exc)
            proxy._record(RequestRecord(method, path, split.query, rng, 0, sent_req, 0, "aborted"))
            self.close_connection = True
        finally:
            upstream.close()

    # ---------------------------------------------------------------- response side
    def _send_error(self, fault: _Fault, path: str) -> None:
        latency, _ = self.proxy._settings()
        if latency:
            time.sleep(latency)
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{fault.code}</Code><Message>injected by FaultProxy</Message>"
            f"<Resource>{path}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>"
        ).encode()
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if fault.status in (429, 503):
            self.send_header("Retry-After", "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _relay(
        self, response: http.client.HTTPResponse, method: str, path: str, query: str, rng: str | None, req_bytes: int
    ) -> None:
        proxy = self.proxy
        latency, bandwidth = proxy._settings()
        has_body = method != "HEAD" and response.status not in (204, 304) and not 100 <= response.status < 200
        chunked = "chunked" in (response.getheader("Transfer-Encoding") or "").lower()
        length_header = response.getheader("Content-Length")
        length = int(length_header) if length_header is not None and not chunked else None
        fault = None
        if has_body and 200 <= response.status < 300:
            # an unknown length counts as "long enough": the fault fires if the body gets there
            fault = proxy._take(("reset", "truncate", "corrupt"), method, path, length if length is not None else 1 << 62)
        if latency:
            time.sleep(latency)
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if has_body and length is None:
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.close_connection = True
        if self.close_connection or (self.headers.get("Connection") or "").lower() == "close":
            self.close_connection = True
            self.send_header("Connection", "close")
        sent = 0
        kind = None

        def record() -> None:
            # logged just before the last byte leaves, so a client that saw the response
            # complete always finds it in the log
            proxy._record(RequestRecord(method, path, query, rng, response.status, req_bytes, sent, kind))

        if not has_body or length == 0:
            record()
            self.end_headers()
            return
        self.end_headers()
        stream_chunked = chunked and length is None
        start = time.monotonic()
        while True:
            piece = response.read1(_PIECE) if length is None or sent < length else b""
            if not piece:
                break
            if fault is not None and fault.kind in ("reset", "truncate") and sent + len(piece) >= fault.offset:
                piece = piece[: fault.offset - sent]
                if piece:
                    self._write(piece, stream_chunked)
                    sent += len(piece)
                kind = fault.kind
                break
            if fault is not None and fault.kind == "corrupt" and sent <= fault.offset < sent + len(piece):
                i = fault.offset - sent
                piece = piece[:i] + bytes([piece[i] ^ 0xFF]) + piece[i + 1 :]
                kind = "corrupt"
            if length is not None and sent + len(piece) >= length:
                sent += len(piece)
                record()
                self._write(piece, stream_chunked)
                return
            self._write(piece, stream_chunked)
            sent += len(piece)
            if bandwidth:
                ahead = sent / bandwidth - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
        record()
        if kind == "reset":
            self._reset()
        elif kind == "truncate":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif stream_chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _write(self, piece: bytes, chunked: bool) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)

    def _reset(self) -> None:
        """Abort the client connection with a TCP RST (SO_LINGER 0, then close the descriptor)."""
        self.close_connection = True
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        fd = sock.detach()
        socket.close(fd)
