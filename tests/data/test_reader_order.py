"""A shuffled window's runs are read in the order their samples are first yielded; the yield order is kept."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamio.data.plan import Run, Window
from streamio.data.read.reader import _by_need


def yielded(win: Window) -> list[tuple[int, int]]:
    """(shard, sample) in the order the window yields them."""
    flat = [(r.shard, i) for r in win.runs for i in range(r.first, r.end)]
    order = range(len(flat)) if win.order is None else win.order.tolist()
    return [flat[i] for i in order]


@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1))
def test_runs_come_in_first_need_order_and_the_samples_in_the_same_order(sizes: list[int], seed: int) -> None:
    runs = tuple(Run(shard, 10, 10 + n) for shard, n in enumerate(sizes))
    win = Window(runs, np.random.default_rng(seed).permutation(sum(sizes)))
    out = _by_need(win)
    assert yielded(out) == yielded(win)
    assert sorted(out.runs) == sorted(win.runs)
    first_seen = [next(k for k, (shard, _) in enumerate(yielded(out)) if shard == r.shard) for r in out.runs]
    assert first_seen == sorted(first_seen)  # the reader can take run k + 1 when the yield first needs it


def test_a_sequential_window_or_one_already_in_need_order_is_left_as_it_is() -> None:
    runs = (Run(0, 0, 4), Run(1, 0, 4))
    seq = Window(runs, None)
    assert _by_need(seq) is seq
    ordered = Window(runs, np.array([0, 4, 1, 5, 2, 6, 3, 7]))
    assert _by_need(ordered) is ordered
    late = Window(runs, np.array([4, 0, 5, 1, 6, 2, 7, 3]))
    assert _by_need(late).runs == (Run(1, 0, 4), Run(0, 0, 4))
