"""ThreadedBatches: the batches of a sequential loop, made on threads, in order, bounded (property test).

The reference is what ``DataLoader(num_workers=0)`` does with an iterable: cut the source into
batches (the last one partial unless ``drop_last``), make each, and stop at the first error, be it
the source's (the batch it was cutting never comes) or a batch's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.data.dataloader.threaded import ThreadedBatches


class SourceBroke(Exception):
    pass


class JobBroke(Exception):
    pass


def reference(n: int, size: int, drop_last: bool, bad_sample: int | None, source_fails_at: int | None) -> tuple[
        list[tuple[int, ...]], type[Exception] | None]:
    out: list[tuple[int, ...]] = []
    batch: list[int] = []
    for x in range(n):
        if x == source_fails_at:
            return out, SourceBroke
        batch.append(x)
        if len(batch) == size:
            if bad_sample in batch:
                return out, JobBroke
            out.append(tuple(batch))
            batch = []
    if batch and not drop_last:
        if bad_sample in batch:
            return out, JobBroke
        out.append(tuple(batch))
    return out, None


class Pipeline:
    """A source of ints that may break, a prepare that sleeps a little at random (batches finish out of
    order) and may break, and the counters the test reads."""

    def __init__(self, n: int, bad_sample: int | None, source_fails_at: int | None, seed: int) -> None:
        self.n, self.bad, self.source_fails_at = n, bad_sample, source_fails_at
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.taken = 0  # batches the consumer holds
        self.most_in_flight = 0
        self.closed_on = ""

    def source(self) -> Iterator[int]:
        try:
            for x in range(self.n):
                if x == self.source_fails_at:
                    raise SourceBroke(x)
                yield x
        finally:
            self.closed_on = threading.current_thread().name

    def prepare(self, x: int) -> int:
        time.sleep(self.rng.random() * 0.002)
        if x == self.bad:
            raise JobBroke(x)
        return x


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 40), size=st.integers(1, 5), drop_last=st.booleans(), threads=st.integers(1, 4),
    depth=st.integers(1, 6), bad=st.none() | st.integers(0, 45), source_fails=st.none() | st.integers(0, 45),
    seed=st.integers(0, 1000),
)
def test_batches_and_errors_are_the_sequential_loops_in_order_and_bounded(
    n: int, size: int, drop_last: bool, threads: int, depth: int, bad: int | None, source_fails: int | None,
    seed: int,
) -> None:
    p = Pipeline(n, bad, source_fails, seed)
    expected, error = reference(n, size, drop_last, bad, source_fails)
    before = set(threading.enumerate())
    started: list[int] = []

    def first_prepare(x: int) -> int:
        if x % size == 0:  # the first sample of its batch: the batch's making begins
            with p.lock:
                started.append(x)
                p.most_in_flight = max(p.most_in_flight, len(started) - p.taken)
        return p.prepare(x)

    got: list[tuple[int, ...]] = []
    raised: BaseException | None = None
    batches = ThreadedBatches(p.source(), prepare=first_prepare, collate=tuple, batch_size=size,
                              drop_last=drop_last, threads=threads, depth=depth)
    try:
        for b in batches:
            got.append(b)
            with p.lock:
                p.taken += 1
    except (SourceBroke, JobBroke) as exc:
        raised = exc
    finally:
        batches.close()
    assert got == expected
    assert type(raised) is error if error is not None else raised is None
    assert next(batches, "over") == "over"  # nothing after the end or an error
    # the consumer counts a batch just after next() freed its slot: one more may have begun by then
    assert p.most_in_flight <= depth + 1
    assert set(threading.enumerate()) <= before  # every thread of the pipeline joined
    assert p.closed_on.endswith("-feed")  # the source was closed by the thread that ran it


def test_in_flight_batches_stop_at_the_depth_while_the_consumer_waits() -> None:
    cut = []

    def source() -> Iterator[int]:
        for x in range(100):
            cut.append(x)
            yield x

    batches = ThreadedBatches(source(), prepare=lambda x: x, collate=list, batch_size=2, drop_last=False,
                              threads=2, depth=3)
    try:
        time.sleep(0.3)  # the consumer takes nothing
        assert len(cut) <= 2 * 3 + 2  # 3 batches queued or made, the 4th being cut (its first sample read)
        assert next(batches) == [0, 1]
        time.sleep(0.2)
        assert len(cut) <= 2 * 4 + 2  # one slot freed: one more batch
    finally:
        batches.close()


def test_a_jobs_error_keeps_its_thread_frames_in_the_traceback() -> None:
    import traceback

    def transform_that_breaks(x: int) -> int:
        if x == 3:
            raise ValueError(f"bad sample {x}")
        return x

    batches = ThreadedBatches(iter(range(8)), prepare=transform_that_breaks, collate=list, batch_size=2,
                              drop_last=False, threads=2)
    try:
        assert next(batches) == [0, 1]
        with pytest.raises(ValueError, match="bad sample 3") as info:
            next(batches)
    finally:
        batches.close()
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "transform_that_breaks" and "_work" in frames  # the pool thread's frames, under ours
    assert "__next__" in frames


def test_close_while_the_feeder_waits_for_a_slow_source_returns_once_the_sample_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()

    def slow() -> Iterator[Any]:
        yield 0
        gate.wait(5)
        yield 1

    batches = ThreadedBatches(slow(), prepare=lambda x: x, collate=list, batch_size=1, drop_last=False, threads=1)
    assert next(batches) == [0]
    threading.Timer(0.2, gate.set).start()
    began = time.monotonic()
    batches.close()  # the feeder is inside next(slow()): it stops when the sample arrives
    assert 0.1 < time.monotonic() - began < 3
    assert not [t for t in threading.enumerate() if t.name.startswith("streamio-loader")]
    assert "still run" not in caplog.text
