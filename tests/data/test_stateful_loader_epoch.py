"""Restoring a loader restores the dataset's epoch: the README loop resumes, over epoch boundaries.

The README loop is ``for epoch in range(ds.epoch, epochs): ds.set_epoch(epoch); for batch in
loader: ...``. torchdata's ``StatefulDataLoader`` hands the saved dataset state to the dataset only
when it is next iterated (and with workers only to the workers' copies), so without
:mod:`streamio.data.dataloader.stateful_loader` ``ds.epoch`` stayed 0 after ``load_state_dict`` and the loop
replayed the resumed epoch. Each case runs the loop uninterrupted and interrupted + resumed (a
fresh dataset and loader, ``load_state_dict``, the same loop) and compares every batch, with 0 and
2 real DataLoader workers, for both loaders, at points on both sides of an epoch boundary.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import streamio.data.dataset as dataset_module
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.errors import PlanError, StateMismatchError
from support.loaders import keys_of, small_dataset

EPOCHS = 2
Cut = tuple[int, int | str]  # (epoch, batches taken in it); 0 = after set_epoch, "end" = after the loop


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return small_dataset(str(tmp_path_factory.mktemp("ds") / "small"))


@pytest.fixture(autouse=True)
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")


def make(url: str, kind: str, workers: int, **kw: Any) -> tuple[StreamingDataset, Any]:
    ds = StreamingDataset(url, batch_size=4, **kw)
    if kind == "stateful":
        return ds, StatefulDataLoader(ds, batch_size=4, num_workers=workers, collate_fn=keys_of)
    return ds, StreamingDataLoader(ds, num_workers=workers, collate_fn=keys_of)


def readme_loop(
    new: Callable[[], tuple[StreamingDataset, Any]], *, state: Any = None, cut: Cut | None = None
) -> tuple[list[tuple[int, tuple[str, ...]]], Any, int]:
    """The README loop: (epoch, batch) pairs seen, the loader state at ``cut``, ``ds.epoch`` after restore."""
    ds, loader = new()
    if state is not None:
        loader.load_state_dict(state)
    restored_epoch = ds.epoch
    seen = []
    for epoch in range(ds.epoch, EPOCHS):
        ds.set_epoch(epoch)
        if cut == (epoch, 0):
            return seen, loader.state_dict(), restored_epoch
        for n, batch in enumerate(loader, 1):
            seen.append((epoch, batch))
            if cut == (epoch, n):
                return seen, loader.state_dict(), restored_epoch
        if cut == (epoch, "end"):
            return seen, loader.state_dict(), restored_epoch
    return seen, None, restored_epoch


# (cut, the epoch the restored dataset must say): mid-epoch 0; the last batch of epoch 0; after
# its loop ended (a finished iterator); after set_epoch(1) before its first batch; mid-epoch 1.
CUTS: list[tuple[Cut, int | None]] = [((0, 3), 0), ((0, 6), 0), ((0, "end"), None), ((1, 0), None), ((1, 1), 1)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["stateful", "streaming"])
def test_readme_loop_resumed_anywhere_is_the_uninterrupted_run(url: str, kind: str, workers: int) -> None:
    def new() -> tuple[StreamingDataset, Any]:
        return make(url, kind, workers)

    full, _, _ = readme_loop(new)
    assert len(full) == 12 and len({b for _, b in full}) == 12  # two epochs, differently shuffled
    wrong = []
    for cut, restored_epoch in CUTS:
        head, state, _ = readme_loop(new, cut=cut)
        rest, _, epoch = readme_loop(new, state=state)
        if head + rest != full:  # something replayed or skipped
            wrong.append((cut, f"{len(head)} + {len(rest)} batches, not {len(full)}"))
        if restored_epoch is not None and epoch != restored_epoch:  # ds.epoch right after load_state_dict
            wrong.append((cut, f"ds.epoch {epoch} after load_state_dict, not {restored_epoch}"))
    assert wrong == []


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_again_before_the_first_batch_keeps_the_position(url: str, workers: int) -> None:
    """Restore, save before the first batch (a job that dies again at once), restore: same position."""

    def new() -> tuple[StreamingDataset, Any]:
        return make(url, "stateful", workers)

    full, _, _ = readme_loop(new)
    head, state, _ = readme_loop(new, cut=(1, 2))
    _, again = new()
    again.load_state_dict(state)
    rest, _, epoch = readme_loop(new, state=again.state_dict())
    assert epoch == 1 and head + rest == full


def test_another_worker_count_is_refused_at_load_state_dict_and_changes_nothing(url: str) -> None:
    _, state, _ = readme_loop(lambda: make(url, "stateful", 2), cut=(1, 1))
    for workers in (1, 0):
        ds, loader = make(url, "stateful", workers)
        ds.set_epoch(3)
        with pytest.raises(PlanError, match=f"saved with num_workers=2, this loader has num_workers={workers}"):
            loader.load_state_dict(state)
        assert ds.epoch == 3 and loader.next_iter_state is None
    _, state0, _ = readme_loop(lambda: make(url, "stateful", 0), cut=(1, 1))
    with pytest.raises(PlanError, match="saved with num_workers=0, this loader has num_workers=2"):
        make(url, "stateful", 2)[1].load_state_dict(state0)


def test_worker_states_that_disagree_are_refused(url: str) -> None:
    _, state, _ = readme_loop(lambda: make(url, "stateful", 2), cut=(1, 1))
    bad = copy.deepcopy(state)
    bad["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]["epoch"] = 0
    with pytest.raises(PlanError, match="2 workers' dataset states start from different epochs"):
        make(url, "stateful", 2)[1].load_state_dict(bad)


def test_a_state_of_another_seed_is_refused_at_load_state_dict_and_changes_nothing(url: str) -> None:
    _, state, _ = readme_loop(lambda: make(url, "stateful", 0), cut=(1, 1))
    ds, loader = make(url, "stateful", 0, seed=7)
    ds.set_epoch(5)
    with pytest.raises(StateMismatchError, match="seed"):
        loader.load_state_dict(state)
    assert ds.epoch == 5 and len(ds) == 24 and loader.next_iter_state is None


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"something": 1}, "neither '_snapshot' \\(workers\\) nor '_num_yielded'"),
        ({"_snapshot": {"_worker_snapshots": {"worker_1": {}}}}, "has \\['worker_1'\\], not worker_0..worker_0"),
        ({"_snapshot": {"_worker_snapshots": ["worker_0"]}}, "_snapshot._worker_snapshots is a list, not a dict"),
        ({"_num_yielded": 3, "dataset_state": "epoch 1"}, "dataset_state is a str, not a dict"),
        ({"_num_yielded": 3, "dataset_state": {"version": 1, "epoch": -1}}, "dataset state has epoch -1"),
    ],
)
def test_a_malformed_loader_state_is_refused_naming_what_is_wrong(url: str, state: Any, match: str) -> None:
    ds, loader = make(url, "stateful", 0)
    with pytest.raises(PlanError, match=match):
        loader.load_state_dict(state)
    assert ds.epoch == 0


@pytest.mark.parametrize(
    "state",
    [
        {"version": 1, "epoch": "1"},
        {"version": 1, "epoch": True},
        {"version": 1, "epoch": 1, "plan": None, "worker": 0, "yielded": -4},
        {"version": 1, "epoch": 1, "plan": None, "worker": "0", "yielded": 4},
    ],
)
def test_a_dataset_state_with_bad_numbers_is_refused(url: str, state: dict[str, Any]) -> None:
    ds = StreamingDataset(url, batch_size=4)
    with pytest.raises(PlanError, match="not an int >= 0"):
        ds.load_state_dict(state)
    assert ds.epoch == 0


class _Counter(IterableDataset):  # type: ignore[type-arg]
    """Another library's stateful dataset: the wrapper leaves its loader to torchdata."""

    def __init__(self) -> None:
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        yield from range(self.start, 10)

    def state_dict(self) -> dict[str, int]:
        return {"start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["start"]


def test_loaders_of_other_datasets_are_left_to_torchdata(url: str) -> None:
    StreamingDataset(url)  # installs the wrapper
    assert getattr(StatefulDataLoader.load_state_dict, "__streamio_wrapped__", False)
    loader = StatefulDataLoader(_Counter(), batch_size=None)
    it = iter(loader)
    head = [int(next(it)) for _ in range(3)]
    state = loader.state_dict()
    again = StatefulDataLoader(_Counter(), batch_size=None)
    again.load_state_dict(state)
    again.load_state_dict({})  # torchdata's "no state"
    assert head == [0, 1, 2] and [int(x) for x in again] == list(range(10))


def test_streaming_loader_refuses_persistent_workers(url: str) -> None:
    """Persistent workers keep their dataset copy: set_epoch would not reach them (same order every epoch)."""
    with pytest.raises(PlanError, match="persistent_workers=True.*every epoch would repeat"):
        StreamingDataLoader(StreamingDataset(url, batch_size=4), num_workers=2, persistent_workers=True)


def _warns_in_worker(
    ds: StreamingDataset, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, *, asked_for_state: bool
) -> bool:
    """Whether reading ``ds`` in a (simulated) DataLoader worker warns that its position cannot be exact."""

    class Info:
        id, num_workers = 0, 2

    caplog.clear()
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="streamio.data.dataset"):
        m.setattr(dataset_module, "get_worker_info", lambda: Info())
        it = iter(ds)
        if asked_for_state:
            ds.state_dict()  # what StatefulDataLoader's worker does before the first sample
        next(it)
    return "cannot be exact" in caplog.text


def test_plain_dataloader_workers_warn_with_torchdata_imported_and_stateful_ones_do_not(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torchdata being imported (it is, here) no longer silences the plain-DataLoader warning."""
    assert _warns_in_worker(StreamingDataset(url, batch_size=4), monkeypatch, caplog, asked_for_state=False)
    assert not _warns_in_worker(StreamingDataset(url, batch_size=4), monkeypatch, caplog, asked_for_state=True)
