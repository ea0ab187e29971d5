"""The HTTP/1.1 forwarding server behind :class:`~streamio.testing.proxy.FaultProxy`.

:class:`ForwardingServer` listens on a free loopback port and forwards each request to one
:class:`Upstream`, consulting a :class:`~streamio.testing.faults.FaultTable` (what to inject) and an
:class:`~streamio.testing.upload_trigger.UploadTrigger` (where to cut an upload) on the way.

* One upstream connection per request (moto closes after every response anyway), bodies streamed
  in 64 KiB pieces both ways (:class:`~streamio.testing.relay.BodyRelay` on the way back), so a
  large object never sits in memory and the first bytes reach the client before the last leave
  the server.
* A request is logged just before its response's last byte leaves (a ``fail`` answer: before it
  leaves), so a client that saw a response complete always finds it in the log.
* Cuts: a reset closes with a TCP RST (``SO_LINGER`` 0), a truncate with a FIN after the short body.
"""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from streamio.testing.faults import (
    BODY_FAULTS,
    FAIL,
    RESET,
    THROTTLED,
    TRUNCATE,
    Fault,
    FaultTable,
    RequestRecord,
)
from streamio.testing.relay import PIECE, BodyRelay
from streamio.testing.upload_trigger import UploadTrigger

log = logging.getLogger(__name__)

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
_UNKNOWN_LENGTH = 1 << 62  # an unknown length counts as "long enough": the fault fires if the body gets there


@dataclass(frozen=True)
class Upstream:
    """The real server: ``scheme://host:port``."""

    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """The upstream of an ``http(s)://host[:port]`` URL.

        Raises:
            ValueError: ``url`` is not an http(s) URL with a host.
        """
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"FaultProxy upstream {url!r} must be an http(s)://host:port URL")
        return cls(parsed.scheme, parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80))

    def connect(self) -> http.client.HTTPConnection:
        """A new connection (not yet open) to the upstream server."""
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=120)
        return http.client.HTTPConnection(self.host, self.port, timeout=120)


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 16 loaders connecting at once (2 ranks x 2
    # workers x 4 prefetches) overflowed it, and a dropped handshake costs the client a SYN
    # retransmit (1 s, 3 s, ...) or, once it thinks it is connected, its whole read timeout.
    request_queue_size = 1024


class ForwardingServer:
    """A threaded forwarding server on 127.0.0.1; call order: :meth:`start` -> :meth:`stop`."""

    def __init__(self, upstream: Upstream, table: FaultTable, trigger: UploadTrigger) -> None:
        self._handler = type("_BoundHandler", (_Handler,), {"upstream": upstream, "table": table, "trigger": trigger})
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._table = table

    def start(self) -> str:
        """Listen on a free loopback port (if not already); return ``http://127.0.0.1:<port>``."""
        if self._server is None:
            server = _Server(("127.0.0.1", 0), self._handler)
            server.daemon_threads = True
            server.block_on_close = False
            self._server = server
            port = server.server_address[1]
            self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            self._thread.name = f"FaultProxy:{port}"
            self._thread.start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop listening (connections in flight are abandoned)."""
        self._table.release_stalls(drop=True)  # held requests end unanswered
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None


class _Abort(Exception):
    """The client connection is gone; end this request quietly."""


@dataclass
class _Request:
    """What the log keeps of the request being handled; ``body_bytes`` grows as the body is read."""

    method: str
    path: str
    query: str
    range: str | None
    body_bytes: int = 0
    logged: bool = False

    def log(self, table: FaultTable, status: int, response_bytes: int, fault: str | None) -> None:
        """Add this request to ``table``'s log, once: a response logged before its last write is not
        logged again, as aborted, when that write finds the client gone (it dropped the body unread)."""
        if not self.logged:
            self.logged = True
            table.record(RequestRecord(
                self.method, self.path, self.query, self.range, status, self.body_bytes, response_bytes, fault
            ))


def _chunked(transfer_encoding: str | None) -> bool:
    return "chunked" in (transfer_encoding or "").lower()


class _Handler(BaseHTTPRequestHandler):
    upstream: Upstream
    table: FaultTable
    trigger: UploadTrigger
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (ConnectionError, _Abort, TimeoutError, OSError) as exc:
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

    def _proxy(self) -> None:
        split = urllib.parse.urlsplit(self.path)
        req = _Request(self.command.upper(), urllib.parse.unquote(split.path), split.query, self.headers.get("Range"))
        self._hold(req)
        fail, kind = self.table.take((FAIL,), req.method, req.path), FAIL
        limit = self.table.rate_limit()
        if fail is None and limit is not None and not limit.admit(req.method, req.path):
            fail, kind = Fault(FAIL, None, status=503, code="SlowDown"), THROTTLED
        if fail is not None:
            for piece in self._iter_request_body():
                req.body_bytes += len(piece)
            self._send_error(fail, req, kind)
            return
        upstream = self.upstream.connect()
        try:
            self._forward_request(upstream, req)
            self._relay(upstream.getresponse(), req)
        except (ConnectionError, _Abort, TimeoutError, OSError) as exc:
            log.debug("proxy: %s %s aborted: %s", req.method, req.path, exc)
            req.log(self.table, 0, 0, "aborted")
            self.close_connection = True
        finally:
            upstream.close()

    def _hold(self, req: _Request) -> None:
        """Wait at the stall gate if a ``stall`` fault matches: forwarded once released, ended
        unanswered when the proxy stops."""
        gate = self.table.take_stall(req.method, req.path)
        if gate is None:
            return
        try:
            gate.opened.wait()
        finally:
            self.table.unheld()
        if gate.dropped:
            req.log(self.table, 0, 0, "stall")
            raise _Abort("a stalled request is dropped: the proxy stops")

    # ---------------------------------------------------------------- request side
    def _iter_request_body(self) -> Iterator[bytes]:
        """Yield the request body as it arrives (de-chunked if chunked)."""
        if _chunked(self.headers.get("Transfer-Encoding")):
            yield from self._iter_chunks()
            return
        read = getattr(self.rfile, "read1", self.rfile.read)
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            piece = read(min(left, PIECE))
            if not piece:
                raise _Abort("client closed inside the request body")
            left -= len(piece)
            yield piece

    def _iter_chunks(self) -> Iterator[bytes]:
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
                piece = self.rfile.read(min(left, PIECE))
                if not piece:
                    raise _Abort("client closed inside a chunk")
                left -= len(piece)
                yield piece
            self.rfile.readline(3)

    def _forward_request(self, upstream: http.client.HTTPConnection, req: _Request) -> None:
        """Send the request upstream (``Connection: close``), its body cut where the upload trigger says."""
        chunked = _chunked(self.headers.get("Transfer-Encoding"))
        upstream.putrequest(req.method, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                upstream.putheader(name, value)
        if chunked:
            upstream.putheader("Transfer-Encoding", "chunked")
        upstream.putheader("Connection", "close")
        upstream.endheaders()
        for piece in self._iter_request_body():
            req.body_bytes += len(piece)
            while piece:
                n = self.trigger.allowance(len(piece))
                head, piece = piece[:n], piece[n:]
                if head:
                    upstream.send(b"%x\r\n%s\r\n" % (len(head), head) if chunked else head)
                fired = self.trigger.advance(len(head))
                if fired is not None:
                    fired.callback()
                    if not fired.forward_rest:
                        raise _Abort("request cut by on_upload_bytes")
        if chunked:
            upstream.send(b"0\r\n\r\n")

    # ---------------------------------------------------------------- response side
    def _send_error(self, fault: Fault, req: _Request, kind: str = FAIL) -> None:
        """Answer with the fault's error document, logged before its last byte leaves (a client
        that got it finds it in the log) or, when the client hangs up first, with what was sent."""
        latency, bandwidth = self.table.timing()
        if latency:
            time.sleep(latency)
        length, read = fault.error_document(req.path)
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(length))
        if fault.status in (429, 503):
            self.send_header("Retry-After", "0")
        relay = BodyRelay(self.wfile.write, None, length, bandwidth)

        def record() -> None:
            req.log(self.table, fault.status, relay.sent, kind)

        if self.command == "HEAD":
            record()
            self.end_headers()
            return
        self.end_headers()
        try:
            relay.pump(read, record)
        except OSError:
            record()
            raise

    def _relay(self, response: http.client.HTTPResponse, req: _Request) -> None:
        latency, bandwidth = self.table.timing()
        has_body = req.method != "HEAD" and response.status not in (204, 304) and not 100 <= response.status < 200
        chunked = _chunked(response.getheader("Transfer-Encoding"))
        length_header = response.getheader("Content-Length")
        length = int(length_header) if length_header is not None and not chunked else None
        fault = None
        if has_body and 200 <= response.status < 300:
            body_len = length if length is not None else _UNKNOWN_LENGTH
            fault = self.table.take(BODY_FAULTS, req.method, req.path, body_len)
        if latency:
            time.sleep(latency)
        self._send_head(response, open_ended=has_body and length is None, chunked=chunked)
        stream_chunked = chunked and length is None
        relay = BodyRelay(lambda piece: self._write(piece, stream_chunked), fault, length, bandwidth)

        def record() -> None:
            req.log(self.table, response.status, relay.sent, relay.kind)

        if not has_body or length == 0:
            record()
            self.end_headers()
            return
        self.end_headers()
        if relay.pump(response.read1, record):
            return
        record()
        if relay.kind == RESET:
            self._reset()
        elif relay.kind == TRUNCATE:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif stream_chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _send_head(self, response: http.client.HTTPResponse, *, open_ended: bool, chunked: bool) -> None:
        """Status and headers (not yet flushed); a body of unknown length is re-chunked or ends at close."""
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if open_ended:
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.close_connection = True
        if self.close_connection or (self.headers.get("Connection") or "").lower() == "close":
            self.close_connection = True
            self.send_header("Connection", "close")

    def _write(self, piece: bytes, chunked: bool) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)

    def _reset(self) -> None:
        """Abort the client connection with a TCP RST (SO_LINGER 0, then close the descriptor)."""
        self.close_connection = True
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        fd = sock.detach()
        socket.close(fd)
