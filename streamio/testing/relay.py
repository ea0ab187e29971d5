"""One response body on its way from the upstream server to the client: :class:`BodyRelay`.

The relay reads the body in :data:`PIECE`-sized pieces from a ``read(n)`` callable and writes them
to a ``write(piece)`` callable, applying at most one body fault
(:meth:`~streamio.testing.faults.Fault.apply`: cut at an offset, or one flipped byte) and an
optional bandwidth cap. It knows nothing of sockets or HTTP: the forwarding handler passes the
upstream response's ``read1`` and its own (chunk-framing) writer, logs the request when told the
last byte is about to leave, and ends the connection the way the fault asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from streamio.testing.faults import Fault

PIECE = 64 << 10
"""Bytes read and written at a time, both ways: a large body never sits in memory."""


@dataclass
class BodyRelay:
    """One response body on its way to the client: at most one body fault, an optional rate cap.

    ``sent`` counts the body bytes written; ``kind`` is the fault applied so far, if any.
    """

    write: Callable[[bytes], None]
    fault: Fault | None
    length: int | None
    bandwidth: float | None
    sent: int = 0
    kind: str | None = None

    def pump(self, read: Callable[[int], bytes], before_last: Callable[[], None]) -> bool:
        """Copy the body from ``read``; True when it ended at its length (``before_last`` ran before the last write).

        False when the body ended otherwise (end of stream, or cut by a reset or truncate fault):
        the caller then logs the request and ends the response.
        """
        start = time.monotonic()
        # under a rate cap, pieces small enough to trickle (1 byte/s sends one byte a second)
        step = PIECE if not self.bandwidth else max(1, min(PIECE, int(self.bandwidth / 4)))
        while True:
            piece = read(step) if self.length is None or self.sent < self.length else b""
            if not piece:
                return False
            stop = False
            if self.fault is not None:
                piece, applied, stop = self.fault.apply(piece, self.sent)
                self.kind = applied or self.kind
            if stop:
                if piece:
                    self.write(piece)
                    self.sent += len(piece)
                return False
            if self.length is not None and self.sent + len(piece) >= self.length:
                self.sent += len(piece)
                before_last()
                self.write(piece)
                return True
            self.write(piece)
            self.sent += len(piece)
            if self.bandwidth:
                ahead = self.sent / self.bandwidth - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
