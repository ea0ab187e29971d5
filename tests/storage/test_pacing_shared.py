"""A job's ranks pacing as one (issue 26): the pacer's share of a job-wide rate and cap, and the
job's rate from what its ranks learned. Pure: a fake clock drives the pacer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint.save.rates import RAMP_S, WriteCap, job_rate
from streamio.storage import Store
from streamio.storage.pacing import BETA, Pacer, ShareOutcome


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _pacer() -> tuple[Pacer, FakeTime]:
    t = FakeTime()
    return Pacer(clock=t.clock, sleep=t.sleep), t


def _seconds_for(pacer: Pacer, t: FakeTime, requests: int) -> float:
    start = t.now
    for _ in range(requests):
        pacer.wait()
        pacer.succeeded()
    return t.now - start


def test_a_share_of_a_cap_paces_a_process_that_never_met_a_throttle() -> None:
    pacer, t = _pacer()
    with pacer.sharing(0.25, rate=None, cap=40.0):
        assert pacer.enabled and pacer.rate == pytest.approx(10.0)
        assert _seconds_for(pacer, t, 100) == pytest.approx(10.0, rel=0.05)  # never above its part of the cap
    assert pacer.rate == pytest.approx(40.0) and pacer.cap == 40.0  # alone again: the whole cap


def test_no_rate_learned_and_no_cap_leaves_the_process_unpaced() -> None:
    pacer, t = _pacer()
    with pacer.sharing(0.5, rate=None, cap=None):
        assert not pacer.enabled and _seconds_for(pacer, t, 1000) == 0.0
    assert pacer.job_rate() is None


def test_a_learned_rate_is_shared_and_scaled_back_to_the_job_after() -> None:
    pacer, t = _pacer()
    with pacer.sharing(0.125, rate=80.0, cap=None):
        assert pacer.rate == pytest.approx(10.0) and pacer.job_rate() == pytest.approx(80.0)
        t.now += 0.5
        for _ in range(5):  # answers at its pace: the rate probes above the share slowly
            pacer.succeeded()
        assert 10.0 <= pacer.rate < 10.0 / BETA
    assert pacer.rate == pytest.approx(80.0, rel=0.3) and pacer.job_rate() == pytest.approx(pacer.rate)


def test_a_throttle_during_a_share_cuts_and_the_job_learns_the_cut() -> None:
    pacer, t = _pacer()
    with pacer.sharing(0.5, rate=100.0, cap=None):
        for _ in range(60):
            t.now += 1 / 50
            pacer.succeeded()
        t.now += 1.0
        pacer.throttled()
        cut = pacer.rate
        assert cut <= 50 * BETA * 1.05
    assert pacer.job_rate() == pytest.approx(cut * 2)


def test_a_cap_below_the_floor_still_holds() -> None:
    """At 16k ranks a rank's part of the cap is well under one write per second."""
    pacer, t = _pacer()
    with pacer.sharing(1 / 16384, rate=None, cap=3500.0):
        assert pacer.rate == pytest.approx(3500 / 16384)
        pacer.throttled()
        assert pacer.rate <= 3500 / 16384


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, float("nan")])
def test_a_fraction_outside_0_1_is_refused(fraction: float) -> None:
    pacer, _ = _pacer()
    with pytest.raises(ValueError, match="fraction"), pacer.sharing(fraction, rate=1.0, cap=None):
        pass


def test_a_share_records_what_it_met() -> None:
    pacer, t = _pacer()
    with pacer.sharing(0.5, rate=None, cap=20.0):
        _seconds_for(pacer, t, 30)
        pacer.throttled()
    outcome = pacer.last_share
    assert outcome is not None and outcome.admitted == 30 and outcome.throttles == 1
    assert outcome.seconds == pytest.approx(3.0, rel=0.05)


def test_a_throttled_save_teaches_the_job_the_rate_its_writes_were_admitted_at() -> None:
    """8 ranks, 40 writes each over 10 s (the slowest), one throttled: the store admitted 32/s."""
    outcomes = [ShareOutcome(40, 8.0 + r / 4, 1 if r == 3 else 0) for r in range(8)]
    assert job_rate(outcomes, [500.0] * 8) == pytest.approx(320 / 9.75)
    calm = [ShareOutcome(40, 2.0, 0)] * 8  # nothing throttled: no limit was met, what the pacers hold
    assert job_rate(calm, [None] * 8) is None and job_rate(calm, [10.0, None, 30.0]) == 20.0


@given(st.lists(st.one_of(st.none(), st.floats(0.5, 1e5)), min_size=1, max_size=64))
def test_the_job_rate_is_the_mean_of_what_the_ranks_learned(learned: list[float | None]) -> None:
    known = [r for r in learned if r is not None]
    rate = job_rate([None] * len(learned), learned)
    if not known:
        assert rate is None
    else:
        assert rate is not None and min(known) - 1e-6 <= rate <= max(known) + 1e-6


def test_a_throttle_on_the_first_writes_of_a_save_cuts_from_the_share_not_from_the_idle_second() -> None:
    """Measured over the last second, a save's first answers after an idle spell looked like one
    write per second: a rank throttled at once was cut to 0.7 writes/s and took 16 s for 34 writes
    (benchmarks.bench_throttle, 8 ranks at 40 writes/s) while the others took 5-8 s."""
    pacer, t = _pacer()
    _seconds_for(pacer, t, 50)  # an earlier save's writes
    t.now += 30.0  # the training steps between two saves
    with pacer.sharing(0.125, rate=40.0, cap=None):
        pacer.wait()
        pacer.throttled()  # the save's first answer
        assert pacer.rate == pytest.approx(5.0 * BETA, rel=0.01)  # the share, grown a little while it waited
        for _ in range(3):  # a burst at the share's rate, then a throttle: cut from what it sent at
            pacer.wait()
            pacer.succeeded()
        t.now += 0.3  # past the cooldown
        pacer.wait()
        pacer.throttled()
        assert pacer.rate >= 0.5 * 5.0 * BETA * BETA


# ------------------------------------------------------------------------------ the job's cap
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _aws_cap(clock: _Clock, monkeypatch: pytest.MonkeyPatch) -> WriteCap:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return WriteCap("store", Store("s3://bucket/ckpt"), clock=clock)


def test_a_documented_cap_doubles_after_twenty_unthrottled_minutes_up_to_the_prefixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    cap = _aws_cap(clock, monkeypatch)
    caps = []
    for _ in range(8):  # a save every 15 minutes, never throttled
        caps.append(cap.next(prefixes=4, throttled=False, due=cap.due()))
        clock.now += 15 * 60
    assert caps == [3500.0, 3500.0, 7000.0, 7000.0, 14000.0, 14000.0, 14000.0, 14000.0]  # at most 4 x 3,500


def test_a_throttled_save_halves_the_cap_and_restarts_the_twenty_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    cap = _aws_cap(clock, monkeypatch)
    cap.next(prefixes=16, throttled=False, due=False)
    cap.factor = 8
    clock.now += RAMP_S
    assert cap.next(prefixes=16, throttled=True, due=cap.due()) == 4 * 3500.0  # halved, not doubled
    clock.now += RAMP_S - 1
    assert cap.next(prefixes=16, throttled=False, due=cap.due()) == 4 * 3500.0  # twenty minutes from the throttle
    for _ in range(5):
        clock.now += RAMP_S
        cap.next(prefixes=16, throttled=True, due=cap.due())
    assert cap.next(prefixes=16, throttled=False, due=False) == 3500.0  # never below the documented rate


def test_rank_0s_clock_decides_so_every_rank_keeps_the_same_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    early, late = _Clock(), _Clock()
    a, b = _aws_cap(early, monkeypatch), _aws_cap(late, monkeypatch)
    for cap in (a, b):
        cap.next(prefixes=8, throttled=False, due=False)
    early.now, late.now = RAMP_S + 1, RAMP_S - 1  # the ranks' clocks straddle the twenty minutes
    due = a.due()  # rank 0's, as every rank receives it
    assert a.next(prefixes=8, throttled=False, due=due) == b.next(prefixes=8, throttled=False, due=due) == 7000.0


@pytest.mark.parametrize(("setting", "url", "want"), [
    (250.0, "s3://bucket/ckpt", 250.0), (None, "s3://bucket/ckpt", None), ("store", "file:///tmp/ckpt", None),
])
def test_a_set_cap_never_ramps_and_no_cap_stays_none(
    setting: float | str | None, url: str, want: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    clock = _Clock()
    cap = WriteCap(setting, Store(url), clock=clock)
    for _ in range(6):
        assert cap.next(prefixes=16, throttled=False, due=cap.due()) == want
        clock.now += RAMP_S
