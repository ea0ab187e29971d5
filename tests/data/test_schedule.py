"""The read schedule: chains, segments in first-need order, whole chains when one is open at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamio.data.plan import Run, Sampling, Shuffle, Topology, Window, plan_epoch
from streamio.data.read.schedule import MIN_SEGMENT, build_schedule, segment_size

SAMPLE = 100_000  # bytes per sample in these tests


def _offsets(shard: int) -> np.ndarray:
    return np.arange(0, 10_001) * SAMPLE


def _replay(windows: list[Window], schedule) -> None:  # type: ignore[no-untyped-def]
    """Consume the windows as the reader does; every needed sample must come from its chain's segments."""
    pulled: dict[int, list[tuple[int, int]]] = {}  # chain -> samples fetched, in order
    taken: dict[int, int] = {}
    segments = iter(schedule.segments)
    for win, chains in zip(windows, schedule.chains, strict=True):
        for run, c in zip(win.runs, chains, strict=True):
            for i in range(run.first, run.end):
                have = pulled.setdefault(c, [])
                while taken.get(c, 0) >= len(have):
                    seg = next(segments)
                    assert seg.chain == c, "the next segment must be the one the consumer needs"
                    have.extend((seg.shard, j) for j in range(seg.first, seg.end))
                assert have[taken.get(c, 0)] == (run.shard, i)
                taken[c] = taken.get(c, 0) + 1
    assert next(segments, None) is None  # nothing fetched that is not needed


@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=12),
    st.sampled_from([Shuffle(), Shuffle(interleave=1), Shuffle(window=0, interleave=4), Shuffle.off()]),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_segments_feed_every_window_in_order(counts, shuffle, world, workers) -> None:
    plan = plan_epoch(counts, seed=3, epoch=1, topology=Topology(world, workers, 4), sampling=Sampling(shuffle))
    for stream in plan.streams(0):
        windows = list(stream.windows())
        schedule = build_schedule(windows, _offsets, max_bytes=4 * SAMPLE * 8, chunk_size=1 << 30)
        _replay(windows, schedule)
        if shuffle.interleave == 1:
            assert schedule.open_at_once <= 1
            assert len(schedule.segments) == len({c for ids in schedule.chains for c in ids})  # whole chains


def test_one_open_chain_is_read_whole_and_many_are_cut_in_segments() -> None:
    seq = [Window((Run(0, 0, 50),), None), Window((Run(0, 50, 100),), None)]
    one = build_schedule(seq, _offsets, max_bytes=1 << 20, chunk_size=1 << 20)
    assert [(s.first, s.end) for s in one.segments] == [(0, 100)]
    lanes = [Window((Run(0, i, i + 1), Run(1, i, i + 1)), np.array([0, 1])) for i in range(100)]
    many = build_schedule(lanes, _offsets, max_bytes=40 * SAMPLE, chunk_size=1 << 30)
    assert many.open_at_once == 2
    sizes = {s.end - s.first for s in many.segments}
    assert max(sizes) * SAMPLE <= max(MIN_SEGMENT, 40 * SAMPLE // 4) + SAMPLE  # about max_bytes / (2 x open)
    _replay(lanes, many)


def test_segment_size_is_bounded_both_ways() -> None:
    assert segment_size(1000, 256 << 20, 4 << 20) == MIN_SEGMENT
    assert segment_size(2, 256 << 20, 4 << 20) == 4 << 20
    assert segment_size(32, 256 << 20, 4 << 20) == 4 << 20
    assert segment_size(128, 256 << 20, 4 << 20) == 1 << 20


def test_a_chain_starts_with_a_small_segment_so_the_first_batch_waits_for_little() -> None:
    lanes = [Window(tuple(Run(s, 8 * i, 8 * i + 8) for s in range(4)), np.arange(32)) for i in range(40)]
    offsets = lambda shard: np.arange(0, 321) * 20_000  # noqa: E731 - 20 KB samples
    schedule = build_schedule(lanes, offsets, max_bytes=64 << 20, chunk_size=4 << 20)
    first = {}
    for seg in schedule.segments:
        first.setdefault(seg.chain, seg)
    assert schedule.open_at_once == 4
    # each chain's first segment is about MIN_SEGMENT (at least its first run), not 4 MiB
    assert [(s.first, s.end) for s in first.values()] == [(0, 14)] * 4
    assert 13 * 20_000 < MIN_SEGMENT <= 14 * 20_000
    later = [s.end - s.first for s in schedule.segments if s not in first.values()]
    assert max(later) * 20_000 >= (4 << 20) - 20_000  # then full-size segments
    assert schedule.segments[:4] == list(first.values())  # the first window's four come first
