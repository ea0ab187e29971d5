"""The instruments' counts are exact under concurrent threads, and threads that ended leave their
counts but not their cells."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from streamio.metrics.instruments import Counter, Gauge, Histogram


def _run(threads: int, fn) -> None:  # type: ignore[no-untyped-def]
    workers = [threading.Thread(target=fn) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_counts_from_many_threads_are_exact_and_ended_threads_keep_no_cell() -> None:
    c = Counter("t_total", "test", ("op",))
    h = Histogram("t_seconds", "test", buckets=(0.1, 1.0))

    def work() -> None:
        for i in range(2000):
            c.add(1.0, "get")
            h.observe(0.05 if i % 2 else 5.0)

    for _ in range(5):  # 5 rounds of 8 threads: 40 threads started in all
        _run(8, work)
    assert c.values() == {("get",): 80_000.0}
    row = h.values()[()]
    assert row[:3] + row[4:] == [40_000, 0, 40_000, 80_000] and abs(row[3] - 202_000.0) < 1e-6
    assert len(c._cells) <= 8 and len(h._cells) <= 8  # the ended threads' cells were folded


def test_a_sum_gauge_adds_the_moves_of_every_thread_and_latest_keeps_the_newest() -> None:
    g = Gauge("t_depth", "test")
    _run(4, lambda: [g.add(d) for d in (1, 1, -1)])
    assert g.values() == {(): 4.0}
    times = iter([10.0, 5.0])
    latest = Gauge("t_bytes", "test", mode="latest", clock=lambda: next(times))
    latest.set(7)
    _run(1, lambda: latest.set(3))  # set later in wall time order, but its clock says earlier
    assert latest.values() == {(): (7.0, 10.0)}


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=50))
def test_a_histogram_puts_each_value_in_the_first_bucket_it_fits(values: list[float]) -> None:
    h = Histogram("t_h", "test", buckets=(1.0, 10.0))
    for v in values:
        h.observe(v)
    row = h.values().get((), [0, 0, 0, 0.0, 0])
    assert row[:3] == [sum(v <= 1.0 for v in values), sum(1.0 < v <= 10.0 for v in values),
                       sum(v > 10.0 for v in values)]
    assert row[4] == len(values) and abs(row[3] - sum(values)) < 1e-6
