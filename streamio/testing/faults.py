"""What :class:`~streamio.testing.proxy.FaultProxy` does to traffic, as values, and the table of them.

* :class:`Fault`: one rule (kind, how many uses, byte offset, error answer, method/path filters).
  Its methods are pure: whether a request matches, whether a body is long enough, what a body
  piece becomes once the fault applies, the S3-style XML body of an injected error.
* :class:`RequestRecord`: one request as the proxy saw it; the request log is a list of them.
* :class:`StallGate`: where requests a ``stall`` fault holds wait until released or dropped.
* :class:`FaultTable`: the faults in force, the latency and bandwidth settings and the request
  log, behind one lock: the proxy's public methods write it from the test's thread, the
  forwarding handler threads read and consume it.

Body faults (reset, truncate, corrupt) apply only to a body longer than their offset: a ``HEAD``,
a listing shorter than the cut or an error body never consumes one.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from streamio.testing.ratelimit import RateLimit

FAIL = "fail"
RESET = "reset"
TRUNCATE = "truncate"
CORRUPT = "corrupt"
STALL = "stall"
THROTTLED = "throttled"
"""What the log records for a request a :class:`~streamio.testing.ratelimit.RateLimit` refused."""
BODY_FAULTS = (RESET, TRUNCATE, CORRUPT)
"""The kinds that act on a response body (``fail`` answers instead of forwarding)."""


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
        fault: the fault applied (``"fail"``, ``"reset"``, ``"truncate"``, ``"corrupt"``,
            ``"throttled"``) or None.
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
class Fault:
    """One fault rule; ``remaining`` uses left (None: until cleared), consumed by :meth:`FaultTable.take`."""

    kind: str
    remaining: int | None  # None: unlimited
    offset: int = 0
    status: int = 503
    code: str = "SlowDown"
    method: str | None = None
    path_contains: str | None = None
    padding: int = 0

    def matches(self, method: str, path: str) -> bool:
        """Whether the method/path filters let this fault apply to a request."""
        if self.method is not None and self.method.upper() != method:
            return False
        return self.path_contains is None or self.path_contains in path

    def fits(self, body_len: int | None) -> bool:
        """Whether a body of ``body_len`` bytes (None: not known) reaches this fault's offset."""
        return self.kind == FAIL or body_len is None or body_len > self.offset

    def apply(self, piece: bytes, sent: int) -> tuple[bytes, str | None, bool]:
        """What to send of the body ``piece`` that starts ``sent`` bytes into the body.

        Returns ``(piece to send, kind applied or None, stop after it)``: a reset or truncate
        keeps the bytes before its offset and stops there; a corrupt flips every bit of the byte
        at its offset and goes on.
        """
        end = sent + len(piece)
        if self.kind in (RESET, TRUNCATE) and end >= self.offset:
            return piece[: self.offset - sent], self.kind, True
        if self.kind == CORRUPT and sent <= self.offset < end:
            i = self.offset - sent
            return piece[:i] + bytes([piece[i] ^ 0xFF]) + piece[i + 1 :], CORRUPT, False
        return piece, None, False

    def error_document(self, path: str) -> tuple[int, Callable[[int], bytes]]:
        """The S3-style XML error document a ``fail`` fault answers with: its length, and a
        ``read(n)`` over it that makes the ``padding`` letters of its message as they are read."""
        head = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{self.code}</Code><Message>injected by FaultProxy"
        ).encode()
        tail = f"</Message><Resource>{path}</Resource><RequestId>{uuid.uuid4().hex}</RequestId></Error>".encode()
        return len(head) + self.padding + len(tail), _Document(head, self.padding, tail).read


class _Document:
    """``head``, ``padding`` letters, ``tail``, read in pieces (a large one is never held whole)."""

    def __init__(self, head: bytes, padding: int, tail: bytes) -> None:
        self.parts = [head, tail]
        self.padding = padding

    def read(self, n: int) -> bytes:
        if self.parts[0]:
            piece, self.parts[0] = self.parts[0][:n], self.parts[0][n:]
        elif self.padding:
            piece = b"a" * min(n, self.padding)
            self.padding -= len(piece)
        else:
            piece, self.parts[1] = self.parts[1][:n], self.parts[1][n:]
        return piece


@dataclass
class StallGate:
    """Requests held by ``stall`` faults wait on :attr:`opened`; :attr:`dropped`: the proxy stops,
    so they end unanswered instead of being forwarded."""

    opened: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False


class FaultTable:
    """The faults in force, the latency and bandwidth settings and the request log, thread-safe.

    ``requests`` is the log itself (appended under the lock, cleared in place), so a holder of
    the list sees every record.
    """

    def __init__(self) -> None:
        self.requests: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._latency = 0.0
        self._bandwidth: float | None = None
        self._rate: RateLimit | None = None
        self._gate = StallGate()
        self._held = 0

    def add(self, fault: Fault) -> None:
        """Put ``fault`` in force after those already there (one with no use left is ignored)."""
        if fault.remaining is not None and fault.remaining <= 0:
            return
        with self._lock:
            self._faults.append(fault)

    def take(self, kinds: tuple[str, ...], method: str, path: str, body_len: int | None = None) -> Fault | None:
        """Consume one use of the first matching fault of ``kinds`` (body faults need a longer body)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind not in kinds or not fault.matches(method, path) or not fault.fits(body_len):
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def take_stall(self, method: str, path: str) -> StallGate | None:
        """Consume one use of the first matching ``stall`` fault: the gate to wait at, counted as
        held until :meth:`unheld`."""
        fault = self.take((STALL,), method, path)
        if fault is None:
            return None
        with self._lock:
            self._held += 1
            return self._gate

    def unheld(self) -> None:
        """A held request left its gate."""
        with self._lock:
            self._held -= 1

    def held(self) -> int:
        """Requests waiting at a stall gate now."""
        with self._lock:
            return self._held

    def release_stalls(self, *, drop: bool = False) -> None:
        """End every ``stall`` fault and open the gate: held requests are forwarded (``drop``: they
        end unanswered)."""
        with self._lock:
            self._faults = [f for f in self._faults if f.kind != STALL]
            gate, self._gate = self._gate, StallGate()
            gate.dropped = drop
            gate.opened.set()

    def set_latency(self, first_byte_s: float) -> None:
        """Delay before every response's first byte (negative values count as 0)."""
        with self._lock:
            self._latency = max(0.0, float(first_byte_s))

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        """Per-connection response-body rate cap (None: no cap)."""
        with self._lock:
            self._bandwidth = None if bytes_per_s is None else float(bytes_per_s)

    def timing(self) -> tuple[float, float | None]:
        """``(first-byte latency in s, bandwidth cap in bytes/s or None)``."""
        with self._lock:
            return self._latency, self._bandwidth

    def set_rate_limit(self, limit: RateLimit | None) -> None:
        """Requests over ``limit`` are answered 503 SlowDown (None: no limit)."""
        with self._lock:
            self._rate = limit

    def rate_limit(self) -> RateLimit | None:
        """The request-rate limit in force, if any."""
        with self._lock:
            return self._rate

    def record(self, record: RequestRecord) -> None:
        """Append one request to the log."""
        with self._lock:
            self.requests.append(record)

    def log(self) -> list[RequestRecord]:
        """A snapshot of the request log."""
        with self._lock:
            return list(self.requests)

    def clear(self) -> None:
        """Forget the request log, every fault, the latency and the bandwidth cap."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()
            self._latency = 0.0
            self._bandwidth = None
            self._rate = None
        self.release_stalls()
