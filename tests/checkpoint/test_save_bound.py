"""The pure parts of bounded saves (streamio/checkpoint/save/bound.py) and the detached pool
(streamio/pool.py:run_detached), without a store: the deadline arithmetic, the error message's
bounds, abandoning a thread that never ends, and refusing its later requests."""

from __future__ import annotations

import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checkpoint.save.bound import (
    KEY_CHARS,
    SHOWN_KEYS,
    SHOWN_RANKS,
    BoundExpired,
    Expired,
    SaveBound,
    Stuck,
    remaining,
    timeout_message,
)
from streamio.pool import run_detached

_finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


@given(_finite, _finite)
def test_remaining_is_never_negative_and_counts_down(deadline: float, now: float) -> None:
    left = remaining(deadline, now)
    assert left is not None and left >= 0.0 and left == max(0.0, deadline - now)
    assert remaining(None, now) is None


_stuck = st.lists(
    st.builds(Stuck, st.integers(0, 10_000), st.sampled_from(["uploading its share", "publishing"]),
              st.lists(st.text(min_size=1, max_size=2 * KEY_CHARS), max_size=6).map(tuple)),
    min_size=1, max_size=12, unique_by=lambda s: s.rank,
)


@settings(max_examples=40)
@given(st.integers(0, 10**9), st.floats(min_value=0.001, max_value=1e6), _stuck)
def test_timeout_message_names_a_few_ranks_and_keys_then_counts_the_rest(
    step: int, bound: float, stuck: list[Stuck]
) -> None:
    message = timeout_message(step, bound, "s3://b/run/step-x", stuck)
    head = f"saving step {step} to s3://b/run/step-x did not commit within save_timeout_s={bound:g} s: "
    assert message.startswith(head)
    named = [int(r) for r in re.findall(r"(?:^|; )rank (\d+) was ", message.split(": ", 1)[1])]
    ranks = sorted(s.rank for s in stuck)
    assert named == ranks[:SHOWN_RANKS]
    more = len(ranks) - SHOWN_RANKS
    assert (f"; and {more} more rank(s)." in message) == (more > 0)
    assert "SaveOptions(save_timeout_s=...)" in message
    longest = max(len(s.doing) for s in stuck)
    per_rank = 80 + longest + SHOWN_KEYS * (KEY_CHARS + 2) + 40
    assert len(message) <= 600 + SHOWN_RANKS * per_rank  # bounded whatever the claims


def test_timeout_message_of_one_rank_lists_three_keys_then_a_count() -> None:
    keys = tuple(f"s3://b/r/part-{i}" for i in range(5))
    message = timeout_message(7, 2.5, "s3://b/r", [Stuck(1, "uploading its share", keys)])
    assert ("rank 1 was uploading its share, waiting for s3://b/r/part-0, s3://b/r/part-1, s3://b/r/part-2 "
            "and 2 more object(s).") in message
    assert "The previous checkpoint stays current." in message
    pointer = timeout_message(7, 2.5, "s3://b/r", [Stuck(0, "publishing", ("s3://b/r/latest.json",))],
                              pointer="s3://b/r/latest.json")
    assert "The pointer write was in flight: if it still lands, the step becomes current" in pointer
    idle = timeout_message(7, 2.5, "s3://b/r", [Stuck(0, "uploading its share", ())])
    assert "waiting for no request (its time went to the host copy or to waiting for other ranks)" in idle


def test_a_bound_abandons_a_thread_that_does_not_end_and_refuses_its_later_requests() -> None:
    bound = SaveBound(0.3, time.perf_counter(), rank=3)
    release, after = threading.Event(), {}
    ended = threading.Event()

    def stuck() -> str:
        with bound.request("s3://b/a"):
            release.wait()
        try:
            with bound.request("s3://b/marker"):
                after["sent"] = True
        except Expired as exc:
            after["refused"] = str(exc)
            raise
        return "never"

    began = time.monotonic()
    with pytest.raises(BoundExpired) as info:
        bound.run(stuck, doing="uploading its share", on_abandoned=ended.set)
    assert 0.25 <= time.monotonic() - began < 2.0
    assert info.value.stuck == Stuck(3, "uploading its share", ("s3://b/a",)) and bound.expired
    release.set()
    assert ended.wait(5)  # on_abandoned once the abandoned thread ended
    assert after == {"refused": "s3://b/marker: the save's bound ran out, the request is not sent"}


def test_a_bound_returns_or_raises_what_the_function_did_in_time() -> None:
    bound = SaveBound(5.0, time.perf_counter(), rank=0)
    assert bound.run(lambda: 42, doing="x") == 42
    with pytest.raises(KeyError):
        bound.run(lambda: {}["missing"], doing="x")
    assert not bound.expired
    late = SaveBound(1.0, time.perf_counter() - 2.0, rank=0)  # the host copy took the whole bound
    with pytest.raises(BoundExpired):
        late.run(lambda: time.sleep(0.5), doing="x")
    with pytest.raises(BoundExpired) as info:  # its next phase: refused at once, nothing in flight
        late.run(lambda: late.request("s3://b/m").__enter__(), doing="publishing")
    assert info.value.stuck.keys == ()
    unbounded = SaveBound(None, 0.0, rank=0)
    assert unbounded.run(threading.current_thread, doing="x") is threading.current_thread()  # in place


def test_run_detached_keeps_order_raises_the_first_error_once_running_jobs_ended_and_leaves_daemon_threads() -> None:
    assert run_detached(lambda x: x * 2, range(20), concurrency=4) == [x * 2 for x in range(20)]
    assert run_detached(lambda x: x, [], concurrency=4) == []
    started, finished = [], []

    def job(x: int) -> int:
        started.append(x)
        if x == 1:
            raise ValueError("part 1 failed")
        if x == 0:
            time.sleep(0.2)
        finished.append(x)
        return x

    with pytest.raises(ValueError, match="part 1 failed"):
        run_detached(job, range(50), concurrency=2, name="t-detached")
    assert 0 in finished  # a failed save's cleanup must not race a part still being written
    assert len(started) < 50  # jobs not started when it failed are skipped
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-detached"))
