"""Forgetting ``set_epoch`` no longer repeats one order every epoch (issue 23, item 15).

mosaicml-streaming and litdata move to the next epoch by themselves; a StreamingDataset iterated
again after a complete pass repeated the same order, silently. Now an iteration that starts after
one that ran to its end reads the next epoch, unless ``set_epoch`` was called since (it wins). Each
case runs real DataLoader workers (0 and 2) with every loader that can see an iteration end: a
plain DataLoader without workers, StreamingDataLoader and torchdata's StatefulDataLoader.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import pytest

import streamio.data.position as position_module
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.errors import PlanError
from support.loaders import KINDS, Batch, LoaderJob, keys_of, small_dataset


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("ds") / "small"))


@pytest.fixture(autouse=True)
def one_rank(as_rank: Callable[[int, int], None]) -> None:
    as_rank(0, 1)


class Job(LoaderJob):
    """A dataset and a loader of one kind, with the loader's way to save and restore a position."""

    def run(self, passes: int, *, stop_after: int | None = None) -> list[list[Batch]]:
        """``passes`` loops over the loader, never calling set_epoch; the last stops after ``stop_after``."""
        out = []
        for p in range(passes):
            seen: list[Batch] = []
            for batch in self.loader:
                seen.append(batch)
                if p == passes - 1 and stop_after is not None and len(seen) == stop_after:
                    break
            out.append(seen)
        return out


def reference(url: str, kind: str, epoch: int) -> list[Batch]:
    """Epoch ``epoch`` read with set_epoch (the order depends on the worker count, not on the loader)."""
    job = Job(url, kind)
    job.ds.set_epoch(epoch)
    return job.run(1)[0]


@pytest.mark.parametrize("kind", KINDS)
def test_each_pass_without_set_epoch_reads_the_next_epoch(url: str, kind: str) -> None:
    job = Job(url, kind)
    passes = job.run(3)
    assert passes == [reference(url, kind, e) for e in range(3)]
    assert len({tuple(p) for p in passes}) == 3
    assert job.ds.epoch == 2


@pytest.mark.parametrize("kind", KINDS)
def test_set_epoch_wins_and_a_partial_pass_does_not_advance(url: str, kind: str) -> None:
    job = Job(url, kind)
    job.run(1, stop_after=2)  # abandoned after 2 batches
    assert job.run(1) == [reference(url, kind, 0)]  # restarted: epoch 0 again, from its start
    job.ds.set_epoch(5)  # after a complete pass: the explicit choice wins
    assert job.run(1) == [reference(url, kind, 5)]
    job.ds.set_epoch(5)  # and again: the same epoch once more
    assert job.run(1) == [reference(url, kind, 5)]
    assert job.run(1) == [reference(url, kind, 6)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cut", [(0, None), (1, 3), (1, 6)])
def test_a_resumed_job_moves_on_as_the_uninterrupted_one(url: str, kind: str, cut: tuple[int, int | None]) -> None:
    """Passes without set_epoch, saved after pass ``cut[0]`` ended or ``cut[1]`` batches into the next one.

    Six batches into a pass is its last batch: that pass ended there (issue 34, item 15), so the
    resumed job, like the live loader, goes on with the next pass.
    """
    full = [b for p in Job(url, kind).run(4) for b in p]
    done, into = cut
    job = Job(url, kind)
    head = [b for p in job.run(done + 1) for b in p] if into is None else []
    if into is not None:
        head = [b for p in job.run(done) for b in p] + job.run(1, stop_after=into)[0]
    state = job.stateful.state_dict()
    again = Job(url, kind)
    again.stateful.load_state_dict(state)
    rest = [b for p in again.run(4 - done - (into is None or into == 6)) for b in p]
    assert head + rest == full


def test_ranks_advance_alike_and_each_sample_is_read_once(url: str, as_rank: Callable[[int, int], None]) -> None:
    second: list[str] = []
    for rank in range(2):
        as_rank(rank, 2)
        job = Job(url, "streaming-2")
        passes = job.run(2)
        ds = StreamingDataset(url, batch_size=4)
        ds.set_epoch(1)
        assert passes[1] == [keys_of(b) for b in StreamingDataLoader(ds, num_workers=2, collate_fn=list)]
        second += [k for b in passes[1] for k in b]
    assert collections.Counter(second) == collections.Counter({k: 1 for k in second}) and len(second) == 24


def test_len_is_the_next_pass_and_the_state_says_the_epoch_ended(url: str) -> None:
    job = Job(url, "streaming-0")
    job.run(1)
    assert len(job.ds) == 24 and len(job.loader) == 6  # what the next pass yields (tqdm's total)
    state = job.loader.state_dict()
    assert state["dataset"]["epoch"] == 0 and state["dataset"]["ended"] is True
    job.ds.set_epoch(1)
    assert "ended" not in job.loader.state_dict()["dataset"]


def test_a_state_that_says_ended_with_batches_left_is_refused(url: str) -> None:
    ds = StreamingDataset(url, batch_size=4)
    state = {**ds.state_after(2), "ended": True}
    with pytest.raises(PlanError, match="says epoch 0 ended, but 4 of its batches per rank are left"):
        ds.load_state_dict(state)
    with pytest.raises(PlanError, match="ended 'yes', not true or false"):
        ds.load_state_dict({**ds.state_after(6), "ended": "yes"})


def test_a_plain_dataloader_with_workers_warns_when_set_epoch_was_never_called(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It cannot see an epoch end from the main process; the warning is logged in worker 0."""
    import streamio.data.dataset as dataset_module

    class Info:
        id, num_workers = 0, 2

    def warned(ds: StreamingDataset) -> bool:
        caplog.clear()
        with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger=position_module.__name__):
            m.setattr(dataset_module, "get_worker_info", lambda: Info())
            next(iter(ds))
        return "set_epoch() was never called" in caplog.text

    ds = StreamingDataset(url, batch_size=4)
    assert warned(ds)
    ds.set_epoch(0)
    assert not warned(ds)
