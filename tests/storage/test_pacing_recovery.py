"""The write pacer after a storm (issue 34): it climbs back to what the store admits within seconds,
a clock that steps back never becomes a sleep, and a cap of 0 or less is refused by name.

A storm of SlowDown answers once left a process at 0.5 writes/s for its whole life (6 small PUTs
took 12 s instead of 0.55 s): the rate grew only on a success, up to twice the answers of the last
second, and below one write per second the last second holds one answer, no rate to tell.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.errors import ConfigError
from streamio.storage import RetryPolicy, Store, write_pacer
from streamio.storage.pacing import _MIN_RATE, Pacer
from streamio.testing import FaultProxy, S3Endpoint
from streamio.testing.ratelimit import RateLimit


class FakeTime:
    """A clock moved by sleeps and by hand (also backwards); every sleep asked for is kept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _pacer() -> tuple[Pacer, FakeTime]:
    t = FakeTime()
    return Pacer(clock=t.clock, sleep=t.sleep), t


def _storm(pacer: Pacer, t: FakeTime, throttles: int = 12) -> None:
    """One writer whose every attempt is answered "slow down", retried after a growing backoff."""
    for i in range(throttles):
        pacer.wait()
        t.now += 0.05
        pacer.throttled()
        t.now += min(0.1 * 2**i, 5.0)


def _write(pacer: Pacer, t: FakeTime, store: RateLimit | None, n: int, latency: float = 0.09) -> float:
    """``n`` writes one after another (each ``latency`` long), answered by ``store`` (None: all
    admitted); the seconds they took."""
    start = t.now
    for _ in range(n):
        pacer.wait()
        t.now += latency
        if store is None or store.admit("PUT", "/bucket/key"):
            pacer.succeeded()
        else:
            pacer.throttled()
    return t.now - start


def test_after_a_storm_six_writes_go_in_seconds_not_at_the_floor() -> None:
    pacer, t = _pacer()
    _storm(pacer, t)
    assert pacer.rate <= 1.0  # the storm took it to the floor
    t.now += 60.0  # the storm is over
    assert _write(pacer, t, None, 6) < 2.5  # 10.5 s at 0.5 writes/s
    assert _write(pacer, t, None, 100, latency=0.0) < 4.0 and pacer.rate > 40  # and it keeps climbing


def test_after_a_storm_a_writer_climbs_back_to_what_the_store_admits() -> None:
    """The store admits 200 writes/s again once the storm ends; 16 s later the writer sends at
    that rate, and the store refuses few of its writes on the way."""
    pacer, t = _pacer()
    _storm(pacer, t)
    store = RateLimit(200.0, clock=t.clock)
    _write(pacer, t, store, 1, latency=0.0)
    while t.now - 1000.0 < 60.0 + 16.0:
        _write(pacer, t, store, 100, latency=0.0)
    admitted_before = store.admitted
    assert _write(pacer, t, store, 400, latency=0.0) == pytest.approx(2.0, rel=0.3)  # 400 at ~200/s
    assert store.admitted - admitted_before >= 0.9 * 400
    assert store.refused <= 0.05 * (store.admitted + store.refused)


def test_an_idle_writer_resumes_at_its_rate_not_in_a_burst() -> None:
    """The curve's clock stops while the writer sends less than its rate (CUBIC for a sender with
    nothing to send): after ten idle minutes it resumes at the rate it had."""
    pacer, t = _pacer()
    with pacer.sharing(1.0, rate=40.0, cap=None):
        _write(pacer, t, None, 40, latency=0.0)
        rate = pacer.rate
        t.now += 600.0
        _write(pacer, t, None, 2, latency=0.0)
        assert rate <= pacer.rate < 1.2 * rate  # not 0.4 * 600**3 writes/s: the curve ran 10 minutes


def test_a_queue_formed_at_the_floor_drains_at_the_rate_grown_since() -> None:
    """The 16th waiter at 0.5 writes/s once slept 32 s whatever the rate became meanwhile."""
    pacer, t = _pacer()
    _storm(pacer, t)
    start = t.now
    for _ in range(16):  # one waiter after another, as 16 threads' reservations are served
        pacer.wait()
    assert t.now - start < 8.0
    assert all(0 <= s <= 1 / _MIN_RATE for s in t.sleeps)


def test_a_clock_that_steps_back_never_becomes_a_sleep() -> None:
    pacer, t = _pacer()
    _storm(pacer, t)
    t.now -= 3600.0  # an hour back
    _write(pacer, t, None, 20)
    t.now = -math.inf
    _write(pacer, t, None, 3)
    t.now = math.nan
    _write(pacer, t, None, 3)
    assert all(0 <= s <= 1 / _MIN_RATE for s in t.sleeps), max(t.sleeps)
    assert 0 < pacer.rate < math.inf


@pytest.mark.parametrize("cap", [0, 0.0, -1.0, -math.inf, math.inf, math.nan])
def test_a_cap_of_zero_or_less_is_refused_by_name(cap: float) -> None:
    pacer, _ = _pacer()
    with pytest.raises(ConfigError, match=rf"write cap must be a positive finite number .* got {cap!r}"):
        with pacer.sharing(0.5, rate=10.0, cap=cap):
            pass
    assert not pacer.enabled and pacer.cap is None  # nothing changed


@pytest.mark.parametrize("cooldown", [-0.1, math.nan, math.inf])
def test_a_cooldown_below_zero_is_refused_by_name(cooldown: float) -> None:
    with pytest.raises(ConfigError, match=rf"cooldown must be a finite number of seconds >= 0, got {cooldown!r}"):
        Pacer(cooldown=cooldown)


@pytest.mark.parametrize("rate", [0.0, -5.0, math.nan, math.inf])
def test_a_job_rate_that_is_not_a_rate_counts_as_nothing_learned(rate: float) -> None:
    """What the ranks report is a claim from outside: it never becomes a zero, negative or NaN rate."""
    pacer, t = _pacer()
    with pacer.sharing(0.5, rate=rate, cap=20.0):
        assert pacer.rate == 10.0
        _write(pacer, t, None, 5)
    assert all(0 <= s <= 1 / _MIN_RATE for s in t.sleeps)


# ------------------------------------------------------------------ properties over any history
_EVENTS = st.lists(
    st.tuples(st.sampled_from(["throttled", "succeeded", "wait", "back"]), st.floats(0.0, 30.0)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(history=_EVENTS, cap=st.floats(1.0, 100.0))
def test_after_throttling_stops_the_rate_reaches_the_cap_in_bounded_time(
    history: list[tuple[str, float]], cap: float,
) -> None:
    """Whatever came before (throttles, successes, waits, a clock stepped back), a writer the pacer
    holds back reaches the cap within CUBIC's time from the floor to the cap, and no sleep is
    negative or longer than one token at the floor."""
    pacer, t = _pacer()
    with pacer.sharing(1.0, rate=None, cap=cap):
        for event, seconds in history:
            if event == "back":
                t.now -= seconds
            else:
                t.now += seconds
                getattr(pacer, event)()
        start = t.now
        bound = (0.75 * cap) ** (1 / 3) + (2.5 * cap) ** (1 / 3) + 1.0  # back to the last maximum, then up
        while pacer.rate < cap and t.now - start <= bound:
            pacer.wait()
            pacer.succeeded()
        assert pacer.rate == pytest.approx(cap), (t.now - start, bound)
    assert all(0 <= s <= 1 / _MIN_RATE for s in t.sleeps)


@settings(max_examples=60, deadline=None)
@given(history=_EVENTS)
def test_one_writers_wait_is_never_negative_nor_longer_than_a_token_at_the_floor(
    history: list[tuple[str, float]],
) -> None:
    pacer, t = _pacer()
    for event, seconds in history:
        if event == "back":
            t.now -= seconds
            continue
        t.now += seconds
        before = t.now
        getattr(pacer, event)()
        assert 0 <= t.now - before <= 1 / _MIN_RATE + 1e-9
    assert all(s >= 0 for s in t.sleeps)


# ------------------------------------------------------------------ over HTTP, through the proxy
@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.mark.timeout(120)
def test_a_slowdown_storm_then_calm_six_puts_take_seconds_not_twelve(s3: S3Endpoint, s3_proxy: FaultProxy) -> None:
    store = Store(s3.url("storm"), s3.storage_options(s3_proxy.endpoint_url),
                  retry=RetryPolicy(max_attempts=30, initial_backoff=0.01, max_backoff=0.05))
    s3_proxy.fail_next(16, 503, "SlowDown", method="PUT")
    t0 = time.monotonic()
    store.put("first", b"x")  # through the storm: every attempt but the last answered SlowDown
    pacer = write_pacer(store)
    assert pacer is not None and pacer.throttles == 16
    print(f"storm {time.monotonic() - t0:.1f} s, rate {pacer.rate:.2f}")
    assert pacer.rate < 4.0  # cut from about 20 writes/s (to 0.5 before the fix, for good)
    t0 = time.monotonic()
    for i in range(6):  # the storm is over
        store.put(f"after-{i}", b"x" * 100)
    elapsed = time.monotonic() - t0
    print(f"6 PUTs after the storm: {elapsed:.2f} s, rate {pacer.rate:.2f}")
    assert elapsed < 6.0, elapsed  # 10-12 s at 0.5 writes/s
    assert sorted(o.path for o in store.list()) == [f"after-{i}" for i in range(6)] + ["first"]
    assert [store.read(f"after-{i}") for i in range(6)] == [b"x" * 100] * 6
