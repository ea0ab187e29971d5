"""torchdata's ``StatefulDataLoader``: restoring the loader restores the main process's dataset too.

``StatefulDataLoader.load_state_dict(state)`` only keeps ``state`` for its next iterator. The
dataset's own ``load_state_dict`` runs when the loader is next iterated: in the main process with
``num_workers=0``, and with workers only inside the worker processes, on their copies. So right
after a restore the main process's :class:`~streamio.data.dataset.StreamingDataset` (the object a
training loop reads ``ds.epoch`` from) still says epoch 0, and the README loop
``for epoch in range(ds.epoch, epochs)`` replays the resumed epoch in full, silently. With workers
it is worse at an epoch boundary: a state saved after an epoch ended restarts the loader from the
main process's dataset, which knows nothing of the resume, so that epoch is replayed too.

torchdata has no hook for this, so :func:`install` wraps ``StatefulDataLoader.load_state_dict``
once per process: when the loader reads a registered dataset class, the wrapper parses the
dataset states out of the loader state (:func:`parse`) and hands them to the dataset's
``load_loader_state`` *before* torchdata keeps the state, so a state that does not fit is refused
at ``load_state_dict`` time and the loader is left as it was. Loaders of other datasets are not
touched. The layout read here is torchdata 0.11's (the per-worker ``dataset_state`` of
``_snapshot._worker_snapshots``, the main process's ``dataset_state`` without workers); a layout
this module does not know is refused with an error, never guessed at.

It also wraps ``StatefulDataLoader.__iter__``: with workers, the main process's dataset never sees
an iteration, so the wrapper tells it when one starts (``begin_iteration``, before the workers
fork) and whether this loader's previous one handed out its last batch (``end_iteration``, from
torchdata's iterator: its ``_finished`` flag, or its count of batches yielded, since a loop that
takes exactly ``len(loader)`` batches never pulls the ``StopIteration`` that sets the flag): past a
whole epoch, and without ``set_epoch`` since, the dataset reads the next epoch, as it does without
workers, where it sees its own last sample go out. A state saved after the last batch (its workers
all at their streams' ends, the iterator not yet finished) is handed to torchdata as a finished
one, so the next iteration is a fresh pass of the next epoch, not the empty rest of this one.

:func:`handed_out` is the count both loaders compare with: the batches a DataLoader hands out over
one iteration of a plan.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from streamio.errors import PlanError

__all__ = ["LoaderState", "handed_out", "install", "parse"]

# torchdata's keys (torchdata.stateful_dataloader: incremental_state, stateful_dataloader).
_K_DATASET, _K_FINISHED = "dataset_state", "_iterator_finished"
_K_SNAPSHOT, _K_WORKERS = "_snapshot", "_worker_snapshots"  # only in a num_workers > 0 state
_K_MAIN_YIELDED = "_num_yielded"  # only in a num_workers=0 state
_K_STEP, _K_SINCE = "_snapshot_step", "_steps_since_snapshot"  # batches handed out: the sum of the two
_WRAPPED = "__streamio_wrapped__"
_TOKEN = "_streamio_iteration"  # on a loader: the dataset's token of the iteration it started last
_LAST = "_streamio_last_batch"  # on a loader: the batches that iteration hands out
_K_ITER_YIELDED = "_num_yielded"  # on torchdata's iterator: the batches it yielded (restored ones included)
_dataset_types: list[type] = []


@dataclass(frozen=True)
class LoaderState:
    """What a ``StatefulDataLoader`` state says about its dataset.

    Attributes:
        datasets: the dataset states it will load: the main process's (``num_workers=0``), or one
            per worker, by worker id. Empty when the state holds none.
        num_workers: the worker count the state was saved with (0 = main process).
        finished: the saved iterator had ended, so the loader starts a fresh pass of the dataset
            as the main process holds it once the saved (empty) rest is read.
        batches: with workers, the batches the saved iterator had handed out since its pass
            started (torchdata's snapshot step plus the steps since); None without workers.
    """

    datasets: tuple[Mapping[str, Any], ...]
    num_workers: int
    finished: bool
    batches: int | None = None


class _Plan(Protocol):
    @property
    def batches_per_rank(self) -> int: ...

    @property
    def stage_samples_per_rank(self) -> int: ...


def handed_out(plan: _Plan, batch_size: int, *, drop_last: bool) -> int:
    """The batches a DataLoader hands out over one iteration of ``plan`` (``drop_last`` drops the partial one)."""
    partial = drop_last and plan.batches_per_rank > 0 and plan.stage_samples_per_rank % batch_size > 0
    return plan.batches_per_rank - int(partial)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanError(
            f"StatefulDataLoader state: {where} is a {type(value).__name__}, not a dict; pass the dict "
            "StatefulDataLoader.state_dict() returned (torchdata 0.11 layout)"
        )
    return value


def _count(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PlanError(
            f"StatefulDataLoader state: {where} is {str(value)[:40]!r}, not a count >= 0; pass the dict "
            "StatefulDataLoader.state_dict() returned (torchdata 0.11 layout)"
        )
    return value


def parse(state: Mapping[str, Any]) -> LoaderState:
    """The dataset states inside ``state``, a ``StatefulDataLoader.state_dict()``.

    Raises:
        PlanError: ``state`` is not in the layout of a torchdata ``StatefulDataLoader`` state.
    """
    state = _mapping(state, "the state")
    finished = bool(state.get(_K_FINISHED, False))
    if _K_SNAPSHOT in state:
        workers = _mapping(_mapping(state[_K_SNAPSHOT], _K_SNAPSHOT).get(_K_WORKERS), f"{_K_SNAPSHOT}.{_K_WORKERS}")
        states = []
        for i in range(len(workers)):
            key = f"worker_{i}"
            if key not in workers:
                raise PlanError(
                    f"StatefulDataLoader state: {_K_SNAPSHOT}.{_K_WORKERS} has {sorted(workers)[:8]}, not "
                    f"worker_0..worker_{len(workers) - 1}; pass the dict StatefulDataLoader.state_dict() returned"
                )
            states.append(_mapping(workers[key], f"{_K_WORKERS}.{key}").get(_K_DATASET))
        if any(s is None for s in states):  # a dataset torchdata saw as not Stateful: nothing to restore
            return LoaderState((), len(states), finished)
        found = tuple(_mapping(s, f"{_K_WORKERS}.worker_{i}.{_K_DATASET}") for i, s in enumerate(states))
        step = _count(state[_K_SNAPSHOT].get(_K_STEP), f"{_K_SNAPSHOT}.{_K_STEP}")
        return LoaderState(found, len(states), finished, step + _count(state.get(_K_SINCE, 0), _K_SINCE))
    if _K_MAIN_YIELDED in state:
        main = state.get(_K_DATASET)
        return LoaderState((_mapping(main, _K_DATASET),) if main is not None else (), 0, finished)
    raise PlanError(
        f"StatefulDataLoader state has neither {_K_SNAPSHOT!r} (workers) nor {_K_MAIN_YIELDED!r} (num_workers=0) "
        f"(keys: {sorted(map(str, state))[:8]}); pass the dict StatefulDataLoader.state_dict() returned"
    )


def install(dataset_type: type) -> None:
    """Make ``StatefulDataLoader.load_state_dict`` restore datasets of ``dataset_type`` at once.

    Idempotent and cheap after the first call; does nothing when torchdata is not installed.
    ``dataset_type`` implements ``load_loader_state(state: LoaderState, *, num_workers: int)``,
    where ``num_workers`` is the restoring loader's, ``position.ended`` (true after that when the
    saved pass had handed out its last batch: torchdata is then given the state as finished),
    ``plan(num_workers)`` and ``begin_iteration() -> token`` / ``end_iteration(token)`` (called
    around iterations of a loader with workers).
    """
    if dataset_type not in _dataset_types:
        _dataset_types.append(dataset_type)
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return
    original = StatefulDataLoader.load_state_dict
    if getattr(original, _WRAPPED, False):
        return
    _wrap_iter(StatefulDataLoader)

    @functools.wraps(original)
    def load_state_dict(self: Any, state_dict: dict[str, Any]) -> None:
        dataset = getattr(self, "dataset", None)
        if state_dict and isinstance(dataset, tuple(_dataset_types)):
            dataset.load_loader_state(parse(state_dict), num_workers=self.num_workers)
            if dataset.position.ended:  # every batch was handed out: the next iteration is a fresh pass
                state_dict = {**state_dict, _K_FINISHED: True}
        original(self, state_dict)

    setattr(load_state_dict, _WRAPPED, True)
    StatefulDataLoader.load_state_dict = load_state_dict  # type: ignore[method-assign]


def _wrap_iter(loader_type: Any) -> None:
    """Wrap ``loader_type.__iter__`` to tell a registered dataset when an iteration starts and ended."""
    original = loader_type.__iter__

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        dataset = getattr(self, "dataset", None)
        if self.num_workers and isinstance(dataset, tuple(_dataset_types)):  # without workers the dataset sees it
            previous, token = self._iterator, getattr(self, _TOKEN, None)
            if token is not None and previous is not None and _went_out(previous, getattr(self, _LAST, None)):
                dataset.end_iteration(token)
            setattr(self, _TOKEN, dataset.begin_iteration())
            plan = dataset.plan(self.num_workers)
            setattr(self, _LAST, handed_out(plan, self.batch_size or 1, drop_last=self.drop_last))
        return original(self)

    setattr(__iter__, _WRAPPED, True)
    loader_type.__iter__ = __iter__


def _went_out(iterator: Any, last: int | None) -> bool:
    """Whether torchdata's ``iterator`` handed out its iteration's last batch (``last`` of them)."""
    if getattr(iterator, "_finished", False):
        return True
    yielded = getattr(iterator, _K_ITER_YIELDED, None)
    return last is not None and isinstance(yielded, int) and yielded >= last
