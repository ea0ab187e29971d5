"""The kill-at-byte-count trigger of :meth:`~streamio.testing.proxy.FaultProxy.on_upload_bytes`.

A test that crashes an uploading process needs the crash at an exact byte of the upload, not
"about then": the forwarding handler asks :meth:`UploadTrigger.allowance` how much of each request
body piece it may send upstream before the trigger's byte count, sends that much, reports it with
:meth:`UploadTrigger.advance`, and runs the callback that ``advance`` hands back the one time the
count is reached. Counting covers every request body forwarded since the trigger was armed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fired:
    """What a reached trigger asks of the handler: call ``callback``, then cut the request unless ``forward_rest``."""

    callback: Callable[[], Any]
    forward_rest: bool


class UploadTrigger:
    """Fires once when the request-body bytes forwarded upstream reach ``nbytes``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: tuple[int, Fired] | None = None
        self._uploaded = 0

    def arm(self, nbytes: int, callback: Callable[[], Any], *, forward_rest: bool = False) -> None:
        """Fire ``callback`` once ``nbytes`` more request-body bytes went upstream (restarts the count)."""
        with self._lock:
            self._armed = (int(nbytes), Fired(callback, forward_rest))
            self._uploaded = 0

    def disarm(self) -> None:
        """Forget the trigger and the count."""
        with self._lock:
            self._armed = None
            self._uploaded = 0

    def allowance(self, n: int) -> int:
        """How many of the next ``n`` upload bytes to send before the trigger fires (``n`` if none is armed)."""
        with self._lock:
            if self._armed is None:
                return n
            return max(0, min(n, self._armed[0] - self._uploaded))

    def advance(self, n: int) -> Fired | None:
        """Count ``n`` bytes sent upstream; the trigger's :class:`Fired` the one time the count is reached."""
        with self._lock:
            self._uploaded += n
            if self._armed is not None and self._uploaded >= self._armed[0]:
                fired = self._armed[1]
                self._armed = None
                return fired
        return None
