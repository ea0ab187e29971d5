"""A server (or a path to it) that lies, trickles or floods: every read is bounded in time and memory.

Over real HTTP through :class:`~streamio.testing.FaultProxy` to moto and fake-gcs-server:

* an error answer with a huge body (a 500 whose message is 64 MiB) is cut after its first
  64 KiB, the connection dropped, and the status still decides (retried, then
  ``TransientStorageError`` naming HTTP 500); before, the body was read whole and the message
  scrubbed by a quadratic regex (1 MiB: minutes; 256 MiB: > 9 GB of memory);
* a body that trickles in at a few bytes a second misses its deadline
  (:class:`~streamio.storage.deadline.BodyDeadline`) and fails as a stall, on the whole-read and
  the streaming path, where before both waited for ever; a slow but honest body still arrives;
* a document read whole (``Store.read_document``: ``latest.json``, a manifest, ``index.json``) is
  refused when larger than its limit, before its body is read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from streamio.errors import BodyStalledError, ObjectTooLargeError, TransientStorageError
from streamio.storage import RetryPolicy, Store
from streamio.storage.backends.s3 import sync_client
from streamio.storage.backends.s3_bodies import BoundedSession
from streamio.storage.bodies import ERROR_BODY_LIMIT
from streamio.storage.deadline import BodyDeadline, Pace, Watchdog
from streamio.storage.retry import RetryBudget
from streamio.testing import FaultProxy, GcsEndpoint, S3Endpoint

HUGE = 64 << 20
#: what the client may take of a huge body before it hangs up: its limit plus what loopback's
#: socket buffers hold in flight (a few MiB), far below the body
READ_AT_MOST = 16 << 20
#: a deadline a trickle misses in seconds: 1 s of grace, then 64 KiB/s
SHORT = BodyDeadline(grace=1.0, min_rate=64 << 10)


def _no_sleep(seconds: float) -> None:
    """The policy's sleep here (a module function: policies are pickled with their Store)."""


def policy(attempts: int = 2) -> RetryPolicy:
    return RetryPolicy(max_attempts=attempts, initial_backoff=0.01, body_deadline=SHORT, sleep=_no_sleep)


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def gcs_proxy(gcs_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_endpoint) as proxy:
        yield proxy


def s3_store(s3: S3Endpoint, proxy: FaultProxy, attempts: int = 2) -> Store:
    return Store(s3.url("root"), s3.storage_options(proxy.endpoint_url), retry=policy(attempts))


def gcs_store(gcs: GcsEndpoint, proxy: FaultProxy, attempts: int = 2) -> Store:
    return Store(gcs.url("root"), gcs.storage_options(proxy.endpoint_url), retry=policy(attempts))


def read_whole(store: Store) -> bytes:
    return store.read("obj")


def read_stream(store: Store) -> bytes:
    return b"".join(store.iter_bytes("obj", chunk_size=64 << 10))


READS = [pytest.param(read_whole, id="whole"), pytest.param(read_stream, id="stream")]


def failed_answers(proxy: FaultProxy, n: int) -> list[int]:
    """Body bytes the proxy got out of its ``n`` injected answers (each is logged once the
    client hangs up on it, which the proxy's thread notices a little after the client raised)."""
    deadline = time.monotonic() + 10
    while True:
        sent = [r.response_bytes for r in proxy.log() if r.fault == "fail"]
        if len(sent) >= n or time.monotonic() > deadline:
            return sent
        time.sleep(0.05)


# ------------------------------------------------------------------ huge error bodies
@pytest.mark.parametrize("read", READS)
def test_a_huge_s3_error_body_is_cut_and_its_status_decides(
    s3: S3Endpoint, s3_proxy: FaultProxy, read: object
) -> None:
    store = s3_store(s3, s3_proxy)
    store.put("obj", b"payload")
    s3_proxy.clear()
    s3_proxy.fail_next(2, 500, "InternalError", padding=HUGE, method="GET")
    began = time.monotonic()
    with pytest.raises(TransientStorageError, match="HTTP 500") as info:
        read(store)  # type: ignore[operator]
    assert time.monotonic() - began < 20, "the huge bodies were read"
    sent = failed_answers(s3_proxy, 2)
    assert len(sent) == 2 and max(sent) < READ_AT_MOST, sent  # the client hung up early, twice
    assert "aaaaaaaa" not in str(info.value)


def test_a_huge_s3_error_answer_to_a_listing_is_cut(s3: S3Endpoint, s3_proxy: FaultProxy) -> None:
    """Requests that read their answers whole (listings, s3fs's client) are bounded the same way."""
    store = s3_store(s3, s3_proxy)
    store.put("obj", b"payload")
    s3_proxy.clear()
    s3_proxy.fail_next(2, 503, "SlowDown", padding=HUGE)
    with pytest.raises(TransientStorageError, match="SlowDown|HTTP 503"):
        store.list()
    sent = failed_answers(s3_proxy, 2)
    assert len(sent) == 2 and max(sent) < READ_AT_MOST, sent


def test_a_huge_gcs_error_body_is_cut_on_a_stream(gcs: GcsEndpoint, gcs_proxy: FaultProxy) -> None:
    store = gcs_store(gcs, gcs_proxy)
    store.put("obj", b"payload")
    gcs_proxy.clear()
    gcs_proxy.fail_next(2, 503, "SlowDown", padding=HUGE, method="GET")
    with pytest.raises(TransientStorageError):
        read_stream(store)
    sent = failed_answers(gcs_proxy, 2)
    assert len(sent) == 2 and max(sent) < READ_AT_MOST, sent


def test_the_synchronous_s3_client_reads_through_the_bounded_session(s3: S3Endpoint) -> None:
    """Pins what the bound relies on in the pinned botocore: the client's endpoint session."""
    store = Store(s3.url("root"), s3.storage_options())
    store.put("obj", b"x")
    client = sync_client(store.fs)
    assert isinstance(client._endpoint.http_session, BoundedSession)
    assert ERROR_BODY_LIMIT <= 64 << 10


# ------------------------------------------------------------------ bodies that trickle
@pytest.mark.parametrize("read", READS)
def test_a_trickling_s3_body_fails_as_a_stall(s3: S3Endpoint, s3_proxy: FaultProxy, read: object) -> None:
    store = s3_store(s3, s3_proxy)
    store.put("obj", b"x" * (64 << 10))  # allowed 1 s + 1 s of waiting per attempt
    s3_proxy.set_bandwidth(4)  # bytes per second: a slow-loris
    began = time.monotonic()
    with pytest.raises(TransientStorageError, match="stalled|did not arrive") as info:
        read(store)  # type: ignore[operator]
    assert time.monotonic() - began < 15
    assert isinstance(info.value.__cause__, BodyStalledError)


def test_a_trickling_gcs_body_fails_as_a_stall(gcs: GcsEndpoint, gcs_proxy: FaultProxy) -> None:
    store = gcs_store(gcs, gcs_proxy)
    store.put("obj", b"x" * (64 << 10))
    gcs_proxy.set_bandwidth(4)
    began = time.monotonic()
    with pytest.raises(TransientStorageError, match="stalled"):
        read_stream(store)
    assert time.monotonic() - began < 15


@pytest.mark.parametrize("read", READS)
def test_a_slow_honest_s3_body_arrives(s3: S3Endpoint, s3_proxy: FaultProxy, read: object) -> None:
    """Four times the deadline's minimum rate: never cut."""
    store = s3_store(s3, s3_proxy, attempts=1)
    payload = bytes(range(256)) * 1024  # 256 KiB: 1 s at 256 KiB/s, 5 s allowed
    store.put("obj", payload)
    s3_proxy.set_bandwidth(256 << 10)
    assert read(store) == payload  # type: ignore[operator]


def test_stalls_are_counted_over_the_whole_read() -> None:
    """Progress between stalls does not forgive them (a trickle makes some progress every time)."""
    budget = RetryBudget(RetryPolicy(max_attempts=3, sleep=_no_sleep))
    for _ in range(2):
        budget.progress()
        budget.failed(BodyStalledError("stalled"), "s3://b/k")
    budget.progress()
    with pytest.raises(TransientStorageError, match="stalled"):
        budget.failed(BodyStalledError("stalled"), "s3://b/k")


def test_resets_after_progress_still_start_a_fresh_series() -> None:
    budget = RetryBudget(RetryPolicy(max_attempts=2, sleep=_no_sleep))
    for _ in range(5):
        budget.progress()
        budget.failed(ConnectionResetError("reset"), "s3://b/k")


def test_pace_counts_only_waiting_and_allows_grace_plus_rate() -> None:
    pace = Pace(BodyDeadline(grace=2.0, min_rate=100.0), "s3://b/k")
    assert pace.budget(100) == pytest.approx(3.0)
    pace.record(100, 2.5)  # 100 bytes after 2.5 s of waiting: within 2 + 100/100
    assert pace.budget(100) == pytest.approx(1.5)
    pace.record(0, 1.5)
    with pytest.raises(BodyStalledError, match="100 bytes in 4.0 s"):
        pace.budget(100)


def test_a_body_deadline_needs_positive_settings() -> None:
    from streamio.errors import ConfigError

    with pytest.raises(ConfigError, match="grace > 0"):
        BodyDeadline(grace=0)
    with pytest.raises(ConfigError, match="min_rate"):
        BodyDeadline(min_rate=-1)


def test_the_watchdog_fires_due_timers_only_and_never_disarmed_ones() -> None:
    now = [100.0]
    dog = Watchdog(clock=lambda: now[0])
    fired: list[str] = []
    early = dog.arm(1.0, lambda: fired.append("early"))
    late = dog.arm(5.0, lambda: fired.append("late"))
    gone = dog.arm(0.5, lambda: fired.append("gone"))
    gone.disarm()
    now[0] = 102.0
    dog.fire_due()
    assert fired == ["early"] and early.fired and not late.fired and not gone.fired
    late.disarm()
    now[0] = 110.0
    dog.fire_due()
    assert fired == ["early"]


def test_the_watchdog_thread_unblocks_a_waiter() -> None:
    dog = Watchdog()
    release = threading.Event()
    began = time.monotonic()
    timer = dog.arm(0.2, release.set)
    assert release.wait(5) and timer.fired
    assert time.monotonic() - began < 2


# ------------------------------------------------------------------ documents read whole
@pytest.mark.parametrize("size", [1000, 1001])
def test_a_document_larger_than_its_limit_is_refused(store: Store, size: int) -> None:
    store.put("doc.json", b"x" * size)
    if size <= 1000:
        assert store.read("doc.json", max_bytes=1000) == b"x" * size
        return
    with pytest.raises(ObjectTooLargeError, match="the most this kind of object may be is 1000 bytes"):
        store.read("doc.json", max_bytes=1000)


def test_a_huge_local_document_is_refused_before_it_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with open(tmp_path / "latest.json", "wb") as f:
        f.truncate(1 << 30)  # sparse: nothing on disk
    began = time.monotonic()
    with pytest.raises(ObjectTooLargeError, match="is 1073741824 bytes"):
        Store(str(tmp_path)).read("latest.json", max_bytes=64 << 10)
    assert time.monotonic() - began < 1


def test_a_large_s3_document_is_refused_by_its_announced_length(s3: S3Endpoint, s3_proxy: FaultProxy) -> None:
    Store(s3.url("root"), s3.storage_options()).put("latest.json", b"{" * HUGE)
    store = s3_store(s3, s3_proxy)
    with pytest.raises(ObjectTooLargeError, match=f"is {HUGE} bytes"):
        store.read("latest.json", max_bytes=64 << 10)
    deadline = time.monotonic() + 10
    while not (sent := [r.response_bytes for r in s3_proxy.log() if r.method == "GET"]):
        assert time.monotonic() < deadline, "the proxy never logged the GET"
        time.sleep(0.05)
    assert max(sent) < READ_AT_MOST, sent  # the connection was dropped, the body not drained
