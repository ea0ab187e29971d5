"""A loop that takes exactly ``len(loader)`` batches per epoch, and a job resumed anywhere in it (issue 34, 14-15).

Lightning's fetcher and ``for _, batch in zip(range(len(loader)), loader)`` take ``len(loader)``
batches and never pull the ``StopIteration``, and they never call ``set_epoch``. The epoch used to
end only at that ``StopIteration``: every epoch replayed epoch 0 in the same order, and a state
saved after an epoch's last batch restored to an empty epoch (``len(loader) == 0``: a framework
ended training at once). Now the epoch ends as its last batch is handed out. Every case runs real
DataLoader workers (0 and 2) over a real dataset on disk, with each loader that can see an epoch
end: a plain DataLoader without workers (the dataset counts itself), StreamingDataLoader, and
torchdata's StatefulDataLoader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from streamio.data.dataset import StreamingDataset
from streamio.errors import PlanError
from support.dataset import make_dataset
from support.loaders import KINDS, Batch, LoaderJob, keys_of, small_dataset

PASSES = 3


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("ds") / "small"))


@pytest.fixture(autouse=True)
def one_rank(as_rank: Callable[[int, int], None]) -> None:
    as_rank(0, 1)


class Job(LoaderJob):
    """A dataset and a loader of one kind, and the object whose state_dict() a framework saves."""

    def framework(self, passes: int, on_batch: Callable[[int, int], None] | None = None) -> list[list[Batch]]:
        """``passes`` epochs as Lightning runs them: ``len(loader)`` batches each, no set_epoch, no StopIteration."""
        out = []
        for p in range(passes):
            seen: list[Batch] = []
            for _, batch in zip(range(len(self.loader)), self.loader, strict=False):
                seen.append(batch)
                if on_batch is not None:
                    on_batch(p, len(seen))
            out.append(seen)
        return out


def reference(url: str, kind: str, epoch: int) -> list[Batch]:
    """Epoch ``epoch`` read to its end after set_epoch (the order depends on the worker count only)."""
    job = Job(url, kind)
    job.ds.set_epoch(epoch)
    return list(job.loader)


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_of_len_batches_reads_the_next_epoch_each_pass(url: str, kind: str) -> None:
    job = Job(url, kind)
    passes = job.framework(PASSES)
    assert passes == [reference(url, kind, e) for e in range(PASSES)]
    assert len({tuple(p) for p in passes}) == PASSES  # three orders, not epoch 0 three times
    assert job.ds.epoch == PASSES - 1 and len(job.loader) == 6


def test_the_dataset_iterated_for_len_samples_reads_the_next_epoch(url: str) -> None:
    """Without any loader: ``len(ds)`` samples per pass, each pass a new epoch."""
    ds = StreamingDataset(url, batch_size=4)
    passes = [[s["__key__"] for _, s in zip(range(len(ds)), ds, strict=False)] for _ in range(2)]
    ds1 = StreamingDataset(url, batch_size=4)
    ds1.set_epoch(1)
    assert passes[1] == [s["__key__"] for s in ds1] and passes[0] != passes[1]
    assert ds.epoch == 1 and ds.state_dict()["ended"] is True


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_job_resumed_at_every_batch_is_the_uninterrupted_run(url: str, kind: str) -> None:
    """For every cut k in 0..len of each epoch (k == len included): state, fresh loader, rest == uninterrupted.

    The framework restores its own counters too: after k batches of pass p it runs the rest of
    that pass, or, at k == len, the passes after it. ``len(loader)`` right after the restore is
    what is left of the pass, or the next pass at k == len; StatefulDataLoader with workers keeps
    each worker's position in the worker, so its main process only knows the pass's start and
    reports the whole pass mid-epoch (its iteration still stops where the rest ends).
    """
    passes = 2  # every cut of epoch 0, whose rest crosses into epoch 1, and epoch 1's end
    states: list[tuple[int, int, Any]] = []
    job = Job(url, kind)
    states.append((0, 0, job.stateful.state_dict()))
    full = job.framework(passes, lambda p, k: states.append((p, k, job.stateful.state_dict())))
    states = [(p, k, state) for p, k, state in states if p == 0 or k == len(full[p])]  # epoch 1: k == len only
    flat = [b for p in full for b in p]
    wrong = []
    for p, k, state in states:
        again = Job(url, kind)
        again.stateful.load_state_dict(state)
        ended = k == len(full[p])
        expect_len = len(full[p + 1]) if ended and p + 1 < passes else len(full[p]) - k
        if kind == "stateful-2" and not ended:
            expect_len = len(full[p])
        if p + ended < passes and len(again.loader) != expect_len:
            wrong.append((p, k, f"len(loader) {len(again.loader)} after the restore, not {expect_len}"))
        rest = [b for q in again.framework(passes - p - ended) for b in q]
        done = sum(len(q) for q in full[:p]) + k
        if flat[:done] + rest != flat:
            wrong.append((p, k, f"{done} + {len(rest)} batches, not the uninterrupted {len(flat)}"))
    assert wrong == [], "\n".join(map(str, wrong))


def test_a_stateful_state_after_the_last_batch_between_snapshots_reads_the_next_epoch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """torchdata snapshots the workers every 2 batches; 5 batches per epoch: the state at the last
    batch holds the workers at batch 4 plus one step. It is the epoch's end all the same."""
    url = str(tmp_path_factory.mktemp("ds") / "odd")
    make_dataset(url, None, [5, 7, 3, 5])  # 20 samples: 5 batches of 4

    def stateful() -> tuple[StreamingDataset, StatefulDataLoader]:
        ds = StreamingDataset(url, batch_size=4)
        return ds, StatefulDataLoader(ds, batch_size=4, num_workers=2, collate_fn=keys_of, snapshot_every_n_steps=2)

    ds, loader = stateful()
    first = [b for _, b in zip(range(len(loader)), loader, strict=False)]
    state = loader.state_dict()
    assert len(first) == 5 and state["_snapshot"]["_snapshot_step"] == 4
    again_ds, again = stateful()
    again.load_state_dict(state)
    ds.set_epoch(1)
    assert again_ds.epoch == 0 and len(again) == 5
    assert [b for _, b in zip(range(len(again)), again, strict=False)] == list(loader)  # epoch 1
    assert again_ds.epoch == 1
    bad = {**state, "_steps_since_snapshot": -1}
    with pytest.raises(PlanError, match="_steps_since_snapshot is '-1', not a count >= 0"):
        stateful()[1].load_state_dict(bad)
