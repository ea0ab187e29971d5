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
        proxy.limit_rate(100, prefix_chars=8)  # 503 SlowDown over 100 writes/s per key prefix
        proxy.stall(method="PUT", path_contains="part-")  # no answer until proxy.release() or stop()
        proxy.count("GET", "shard-000")    # requests seen, from the thread-safe log

Why a proxy rather than mocks: the faults that matter (a reset mid-body, a short body under a
full ``Content-Length``, throttling) exercise the real client stack (aiohttp, botocore, s3fs's
retry loops), which a monkeypatched filesystem never does.

Design (this module is the facade; one concept per module behind it):

* :mod:`~streamio.testing.faults`: each fault as a value, the :class:`RequestRecord` of the log,
  and the thread-safe table of the faults, latency and bandwidth in force.
* :mod:`~streamio.testing.forwarding`: the HTTP forwarding server. One upstream connection per
  request (moto closes after every response anyway), bodies streamed in 64 KiB pieces both ways
  so a large object never sits in memory and the first bytes reach the client before the last
  leave the server.
* :mod:`~streamio.testing.upload_trigger`: the kill-at-byte-count trigger of
  :meth:`FaultProxy.on_upload_bytes`.
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

from collections.abc import Callable
from typing import Any

from streamio.testing.faults import CORRUPT, FAIL, RESET, STALL, TRUNCATE, Fault, FaultTable, RequestRecord
from streamio.testing.forwarding import ForwardingServer, Upstream
from streamio.testing.ratelimit import RateLimit
from streamio.testing.upload_trigger import UploadTrigger

__all__ = ["FaultProxy", "RequestRecord"]


class FaultProxy:
    """A threaded HTTP/1.1 forwarding proxy on 127.0.0.1 that injects faults; see module docstring.

    Args:
        upstream_url: ``http://host:port`` of the real server.

    Raises:
        ValueError: ``upstream_url`` is not an http(s) URL with a host.

    Call order: construct -> :meth:`start` (or ``with``) -> configure faults at any time ->
    :meth:`stop`. Fault settings are thread-safe and take effect for the next request.
    """

    def __init__(self, upstream_url: str) -> None:
        upstream = Upstream.parse(upstream_url)
        self.upstream_url = upstream_url.rstrip("/")
        self.endpoint_url = ""
        self._table = FaultTable()
        self._trigger = UploadTrigger()
        self.requests: list[RequestRecord] = self._table.requests
        self._server = ForwardingServer(upstream, self._table, self._trigger)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FaultProxy:
        """Listen on a free loopback port; sets :attr:`endpoint_url`. Returns self."""
        self.endpoint_url = self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening (connections in flight are abandoned; requests a stall holds end unanswered)."""
        self._server.stop()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ fault settings
    def set_latency(self, first_byte_s: float) -> None:
        """Delay every response this many seconds before its first byte (0 to disable)."""
        self._table.set_latency(first_byte_s)

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        """Cap each connection's response-body rate (None to lift the cap)."""
        self._table.set_bandwidth(bytes_per_s)

    def fail_next(
        self,
        n: int,
        status: int = 503,
        code: str = "SlowDown",
        *,
        method: str | None = None,
        path_contains: str | None = None,
        padding: int = 0,
    ) -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 XML error ``code``.

        The request is not forwarded. Typical: ``(3)`` a SlowDown storm, ``(1, 500,
        "InternalError")``, ``(1, 403, "AccessDenied")``, ``(1, 412, "PreconditionFailed")``.
        ``padding`` letters lengthen the error's message (a hostile or broken server's huge error
        body; made as it is sent); the log records how many body bytes left before the client hung up.
        """
        self._table.add(
            Fault(FAIL, n, status=status, code=code, method=method, path_contains=path_contains, padding=padding)
        )

    def limit_rate(
        self,
        per_second: float,
        *,
        burst: float | None = None,
        prefix_chars: int | None = None,
        methods: tuple[str, ...] = ("PUT", "POST", "DELETE"),
    ) -> RateLimit:
        """Answer requests over ``per_second`` per key prefix with 503 SlowDown, as S3 does.

        A prefix is the bucket plus the first ``prefix_chars`` characters of the key (None: the
        whole bucket); each has a token bucket of ``burst`` (default: one second's worth). Only
        ``methods`` count (S3's write limit by default). Refused requests are logged with fault
        ``"throttled"``; the returned :class:`~streamio.testing.ratelimit.RateLimit` counts them.
        """
        limit = RateLimit(per_second, burst, prefix_chars, tuple(m.upper() for m in methods))
        self._table.set_rate_limit(limit)
        return limit

    def reset_after(
        self, nbytes: int, times: int | None = None, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Reset the connection (TCP RST) after ``nbytes`` of a response body.

        Applies to each 2xx response with a longer body, ``times`` times (None: until
        :meth:`clear`).
        """
        self._table.add(Fault(RESET, times, offset=nbytes, method=method, path_contains=path_contains))

    def truncate_next(
        self, n: int, after_bytes: int, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Send only ``after_bytes`` of the next ``n`` longer bodies under their full length, then close (FIN)."""
        self._table.add(Fault(TRUNCATE, n, offset=after_bytes, method=method, path_contains=path_contains))

    def corrupt_next(
        self, n: int, at_byte: int, *, method: str | None = None, path_contains: str | None = None
    ) -> None:
        """Flip every bit of byte ``at_byte`` of the next ``n`` longer response bodies (no error is raised)."""
        self._table.add(Fault(CORRUPT, n, offset=at_byte, method=method, path_contains=path_contains))

    def stall(self, times: int | None = None, *, method: str | None = None, path_contains: str | None = None) -> None:
        """Hold the next ``times`` matching requests (None: every one until :meth:`release`) without
        an answer: a store that stops answering. :meth:`release` forwards them as usual;
        :meth:`stop` ends them unanswered (their connections close). :meth:`held` counts them."""
        self._table.add(Fault(STALL, times, method=method, path_contains=path_contains))

    def release(self) -> None:
        """End every :meth:`stall`: the requests held are forwarded now, later ones are not held."""
        self._table.release_stalls()

    def held(self) -> int:
        """Requests a :meth:`stall` holds now."""
        return self._table.held()

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
        self._trigger.arm(nbytes, callback, forward_rest=forward_rest)

    def clear(self) -> None:
        """Forget the request log and every fault, latency, bandwidth cap, rate limit and trigger
        (requests a stall holds are forwarded)."""
        self._table.clear()
        self._trigger.disarm()

    # ------------------------------------------------------------------ the request log
    def count(self, method: str | None = None, path_contains: str | None = None) -> int:
        """Requests logged so far, optionally only one method and/or paths containing a string."""
        return sum(
            1
            for r in self._table.log()
            if (method is None or r.method == method.upper()) and (path_contains is None or path_contains in r.path)
        )

    def log(self) -> list[RequestRecord]:
        """A snapshot of the request log."""
        return self._table.log()
