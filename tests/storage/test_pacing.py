"""Pacing writes to a store that throttles (issue 26): the adaptive rate and its effect over HTTP."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from streamio.storage import RetryPolicy, Store
from streamio.storage.pacing import BETA, Pacer, pacer_for
from streamio.storage.retry import is_throttle
from streamio.testing import FaultProxy, S3Endpoint


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def _answers(pacer: Pacer, t: FakeTime, per_second: float, seconds: float) -> None:
    """Successes at ``per_second`` for ``seconds`` (what the pacer measures)."""
    for _ in range(int(per_second * seconds)):
        t.now += 1 / per_second
        pacer.succeeded()


def _throttled_after(per_second: float) -> tuple[Pacer, FakeTime]:
    """A pacer that saw 2 s of answers at ``per_second``, then its first throttle."""
    t = FakeTime()
    pacer = Pacer(clock=t.clock, sleep=t.sleep)
    _answers(pacer, t, per_second, 2.0)
    pacer.throttled()
    return pacer, t


def test_unpaced_until_the_store_first_throttles() -> None:
    t = FakeTime()
    pacer = Pacer(clock=t.clock, sleep=t.sleep)
    _answers(pacer, t, 200, 2.0)
    for _ in range(1000):
        pacer.wait()
    assert t.slept == 0 and not pacer.enabled


def test_a_throttle_cuts_the_rate_to_beta_of_what_was_measured_once_per_cooldown() -> None:
    t = FakeTime()
    pacer = Pacer(clock=t.clock, sleep=t.sleep, cooldown=1.0)
    _answers(pacer, t, 100, 3.0)
    pacer.throttled()
    assert pacer.enabled and pacer.rate == pytest.approx(100 * BETA, rel=0.05)
    first = pacer.rate
    for _ in range(20):  # the requests already in flight answer 503 too: one cut, not twenty
        pacer.throttled()
    assert pacer.rate == first and pacer.throttles == 21
    t.now += 1.1
    pacer.throttled()
    assert pacer.rate < first


def test_while_paced_requests_leave_at_the_rate() -> None:
    """One after another, each at the rate of its moment (the rate grows back along the curve as
    they leave)."""
    pacer, t = _throttled_after(50)
    pacer.wait()
    for _ in range(200):
        before, left = pacer.rate, t.now
        pacer.wait()
        assert 1 / pacer.rate - 1e-9 <= t.now - left <= 1 / before + 1e-9
    assert pacer.rate > 50 * BETA  # grown back (from the cut) while they left


def test_successes_grow_the_rate_back_past_the_last_maximum() -> None:
    pacer, t = _throttled_after(100)
    cut = pacer.rate
    rates = []
    while t.now < 20:  # 20 s of writes at what the pacer allows
        pacer.wait()
        pacer.succeeded()
        rates.append(pacer.rate)
    assert rates[0] >= cut and rates == sorted(rates)  # never cut without a throttle
    assert rates[-1] > 100  # beyond the last maximum: the store may have scaled up


def test_throttles_are_recognised_by_code_and_status() -> None:
    class ClientError(Exception):
        def __init__(self, code: str, status: int) -> None:
            super().__init__(code)
            self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}

    assert is_throttle(ClientError("SlowDown", 503)) and is_throttle(ClientError("TooManyRequests", 429))
    assert not is_throttle(ClientError("InternalError", 500)) and not is_throttle(ClientError("NoSuchKey", 404))
    wrapped = OSError("upload failed")
    wrapped.__cause__ = ClientError("SlowDown", 503)
    assert is_throttle(wrapped)


def test_one_pacer_per_bucket_and_endpoint() -> None:
    a = pacer_for("s3://one/x", {"endpoint_url": "http://e1"})
    assert pacer_for("s3://one/y/z", {"endpoint_url": "http://e1"}) is a
    assert pacer_for("s3://two/x", {"endpoint_url": "http://e1"}) is not a
    assert pacer_for("s3://one/x", {"client_kwargs": {"endpoint_url": "http://e2"}}) is not a


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.mark.timeout(120)
def test_many_writers_through_a_rate_limit_finish_near_the_limit(s3: S3Endpoint, s3_proxy: FaultProxy) -> None:
    """16 threads writing 300 objects through a limit of 60 PUT/s: no error, close to the time the
    limit allows, few requests refused once the pacer found the rate."""
    limit = s3_proxy.limit_rate(60)
    store = Store(s3.url("paced"), s3.storage_options(s3_proxy.endpoint_url),
                  retry=RetryPolicy(max_attempts=20, max_total=300))
    n = 300
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.put(f"obj-{i:04d}", b"x" * 1024), range(n)))
    elapsed = time.monotonic() - t0
    refused = limit.refused / (limit.admitted + limit.refused)
    print(f"{n} PUTs at 60/s: {elapsed:.1f} s (ideal {(n - 60) / 60:.1f} s after the burst), {refused:.1%} refused")
    assert len(store.list()) == n
    # A client starved of CPU is slower paced or not: the bound stretches only when the machine is
    # overloaded (two test workers beside other multi-process tests measured 23 s here at load 6).
    stretch = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert elapsed <= 1.3 * n / 60 * stretch, (elapsed, stretch)
    assert refused <= 0.25, refused
