"""Where a :class:`~streamio.data.dataset.StreamingDataset` stands, and its state dict.

A dataset's position is:

* ``epoch``: the epoch the next (or the current) iteration reads;
* ``resume``: the planner state to start that epoch from (the batches each rank's consumer took,
  see :mod:`streamio.data.plan`), or None for its start;
* ``worker``: in a DataLoader worker that torchdata restored, that worker's id and the samples it
  had yielded (torchdata hands each worker its own position back);
* ``yielded``: the samples this process's current iteration has yielded;
* ``ended``: an iteration of the epoch handed out its last batch (its last sample, where the
  dataset counts itself), whether or not the loop then asked for one more: a loop that takes
  exactly ``len()`` batches never pulls the ``StopIteration``. The next iteration then reads the
  next epoch from its start, unless ``set_epoch()`` chose an epoch since (:meth:`Position.begin`):
  forgetting ``set_epoch`` no longer repeats one order every epoch, and calling it still wins.
  Every rank takes the same number of batches (equal work), so every rank advances alike. A
  partial iteration, abandoned before its last batch and restarted, never ends an epoch.

Who sees an iteration run to its end: the dataset itself when it is iterated in the process that
counts (no DataLoader workers); otherwise :class:`~streamio.data.loader.StreamingDataLoader` and
torchdata's ``StatefulDataLoader`` (:mod:`streamio.data.dataloader.stateful_loader`) in the main process,
through ``StreamingDataset.begin_iteration`` / ``end_iteration``. A plain DataLoader with workers
cannot tell the main process; the dataset warns there when ``set_epoch`` was never called.
``ended`` is part of the state (``"ended": true``, only at an epoch's end), so a job resumed from a
state saved after an iteration ended moves on exactly as the uninterrupted one would.

The state dict is ``{"version", "epoch", "plan"}`` (``"worker"``/``"yielded"`` added in a worker,
``"ended"`` at an epoch's end).
A loaded state is untrusted input: it may come from a checkpoint file. :func:`parse_state` checks
each field's type and bound before anything is planned for it; the plan state is then checked by
the planner against this dataset (fingerprint, epoch, topology bounds, consumed <= planned), and a
worker's ``yielded`` against its stream (:func:`check_worker`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from streamio.data.dataloader.stateful_loader import LoaderState
from streamio.data.plan import EpochPlan, WorkerStream
from streamio.data.plan.config import MAX_EPOCH, MAX_WORKERS
from streamio.errors import PlanError
from streamio.state_version import VERSION_KEY, check_version

__all__ = [
    "STATE_VERSION", "Loaded", "Position", "WorkerPosition", "check_ended", "check_loaded_worker", "check_worker",
    "load_loader_state", "parse_state", "state_of", "warn_plain_workers",
]

log = logging.getLogger(__name__)

STATE_VERSION = 1
K_VERSION, K_EPOCH, K_PLAN, K_WORKER, K_YIELDED = VERSION_KEY, "epoch", "plan", "worker", "yielded"
K_ENDED = "ended"
_FIX = "pass a dict made by state_dict()"


class WorkerPosition(NamedTuple):
    """A DataLoader worker's own position, as torchdata restores it."""

    id: int
    yielded: int


class Loaded(NamedTuple):
    """A parsed dataset state (:func:`parse_state`)."""

    epoch: int
    plan: Mapping[str, Any] | None
    worker: WorkerPosition | None
    ended: bool


@dataclass
class Position:
    """A dataset's position (see the module docstring); mutated only through its methods."""

    epoch: int = 0
    resume: Mapping[str, Any] | None = None
    worker: WorkerPosition | None = None
    yielded: int = 0
    ended: bool = False
    chosen: bool = False  # set_epoch() or a loaded state chose the epoch at least once
    generation: int = 0  # changes whenever the epoch or the resume point is set

    def select(self, epoch: int) -> None:
        """``set_epoch``: read ``epoch`` next; a resume point of another epoch is dropped."""
        if epoch != self.epoch:
            self.resume, self.worker = None, None
        self.epoch, self.ended, self.chosen = epoch, False, True
        self.generation += 1
        self.rewind()

    def load(self, state: Loaded) -> None:
        """Stand at a loaded state's position (checked by the caller)."""
        self.epoch, self.resume, self.worker, self.ended = state.epoch, state.plan, state.worker, state.ended
        self.chosen = True
        self.generation += 1
        self.rewind()

    def holds(self, state: Loaded) -> bool:
        """Whether this is already ``state``'s position (epoch, resume point, worker)."""
        return (self.epoch, self.resume, self.worker) == (state.epoch, state.plan, state.worker)

    def begin(self) -> int:
        """An iteration starts in the process that counts: past an ended epoch, read the next one.

        Returns:
            the token that :meth:`end` takes.
        """
        if self.ended:
            log.info(
                "epoch %d was read to its end and set_epoch() was not called since: reading epoch %d",
                self.epoch, self.epoch + 1,
            )
            self.epoch, self.resume, self.worker, self.ended = self.epoch + 1, None, None, False
            self.generation += 1
        self.rewind()
        return self.generation

    def end(self, token: int) -> None:
        """The iteration that :meth:`begin` returned ``token`` for took the whole epoch.

        Ignored when the epoch or the resume point was set since (``set_epoch`` wins).
        """
        if token == self.generation:
            self.ended = True

    def count(self, token: int | None, size: int) -> None:
        """One more sample goes out of the ``size`` of the iteration ``token`` is for (None: not counting).

        The last one ends the epoch now: a loop that takes ``len()`` batches never asks for more.
        """
        self.yielded += 1
        if token is not None and self.yielded >= size:
            self.end(token)

    def rewind(self) -> None:
        """Stand where the next iteration starts: at the resume point, nothing yielded since."""
        self.yielded = self.worker.yielded if self.worker is not None else 0


def _field(state: Mapping[str, Any], key: str, high: int) -> int:
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PlanError(f"dataset state has {key} {_short(value)}, not an int >= 0; {_FIX}")
    if value > high:
        raise PlanError(f"dataset state has {key} {value}, above the limit of {high}; {_FIX}")
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def parse_state(state: object) -> Loaded:
    """A dataset state's fields, each checked and bounded.

    Raises:
        PlanError: another version, or a field of the wrong type or beyond its bound (named with
            its value).
    """
    state = check_version(state, STATE_VERSION, what="dataset state", error=PlanError)
    epoch = _field(state, K_EPOCH, MAX_EPOCH)
    plan = state.get(K_PLAN)
    if plan is not None and not isinstance(plan, Mapping):
        raise PlanError(f"dataset state has plan {_short(plan)}, not a dict or None; {_FIX}")
    ended = state.get(K_ENDED, False)
    if not isinstance(ended, bool):
        raise PlanError(f"dataset state has ended {_short(ended)}, not true or false; {_FIX}")
    if K_WORKER not in state:
        return Loaded(epoch, plan, None, ended)
    # a worker yields at most its stream; check_worker compares it with the stream once planned
    worker = WorkerPosition(_field(state, K_WORKER, MAX_WORKERS - 1), _field(state, K_YIELDED, 1 << 62))
    return Loaded(epoch, plan, worker, False)


def check_worker(position: Position, stream: WorkerStream) -> None:
    """Refuse a restored worker position that is not ``stream``'s (another worker, or past its end).

    Raises:
        PlanError: naming the worker and the counts.
    """
    mine = position.worker
    if mine is None:
        return
    if mine.id != stream.worker:
        raise PlanError(f"worker state of worker {mine.id} was given to worker {stream.worker}")
    if mine.yielded > stream.size:
        raise PlanError(
            f"dataset state of worker {mine.id} says it yielded {mine.yielded} samples of epoch {position.epoch}, "
            f"but its stream holds {stream.size}; the state was not made for this data set and topology"
        )


def check_loaded_worker(position: Position, plan: EpochPlan, rank: int, worker: int | None) -> None:
    """Refuse a loaded worker position that ``plan`` cannot hold: :func:`check_worker` in that worker,
    elsewhere (the main process, where no worker stream is known) a count above the rank's stage.

    Raises:
        PlanError: naming the worker and the counts.
    """
    mine = position.worker
    if mine is None:
        return
    if worker is not None:
        check_worker(position, plan.stream(rank, worker))
    elif mine.yielded > plan.stage_samples_per_rank:
        raise PlanError(
            f"dataset state of worker {mine.id} says it yielded {mine.yielded} samples of epoch {position.epoch}, "
            f"but each rank reads {plan.stage_samples_per_rank}; the state was not made for this data set"
        )


def state_of(
    epoch: int, plan: Mapping[str, Any] | None, worker: WorkerPosition | None = None, *, ended: bool = False
) -> dict[str, Any]:
    """The state dict of a position."""
    state: dict[str, Any] = {K_VERSION: STATE_VERSION, K_EPOCH: epoch, K_PLAN: plan}
    if worker is not None:
        state[K_WORKER], state[K_YIELDED] = worker.id, worker.yielded
    if ended:
        state[K_ENDED] = True
    return state


def check_ended(state: Loaded, plan: EpochPlan) -> None:
    """Refuse a state that says its epoch ended while ``plan`` (its rest) still has batches.

    Raises:
        PlanError: naming the epoch and the batches left.
    """
    if state.ended and plan.batches_per_rank:
        raise PlanError(
            f"dataset state says epoch {state.epoch} ended, but {plan.batches_per_rank} of its batches per rank "
            f"are left; {_FIX}"
        )


def warn_plain_workers(num_workers: int, epoch_chosen: bool) -> None:
    """Say, in worker 0 of a plain DataLoader, what the main process cannot know from there."""
    log.warning(
        "StreamingDataset is read by %d DataLoader workers: a plain DataLoader cannot tell the main "
        "process what its workers yielded, so state_dict() there cannot be exact (it is the epoch's "
        "start). Use streamio.StreamingDataLoader or torchdata's StatefulDataLoader for exact resume.",
        num_workers,
    )
    if not epoch_chosen:
        log.warning(
            "StreamingDataset.set_epoch() was never called: with a plain DataLoader and workers the dataset "
            "cannot see an epoch end, so every epoch repeats this order. Call ds.set_epoch(epoch) before each "
            "epoch, or use streamio.StreamingDataLoader, which moves to the next epoch by itself."
        )


class _Dataset(Protocol):
    position: Position

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def plan(self, num_workers: int = 0) -> EpochPlan: ...


def load_loader_state(ds: _Dataset, state: LoaderState, num_workers: int) -> None:
    """``StreamingDataset.load_loader_state``'s work (see there)."""
    if state.num_workers != num_workers:
        raise PlanError(
            f"StatefulDataLoader state was saved with num_workers={state.num_workers}, this loader has "
            f"num_workers={num_workers}: StatefulDataLoader resumes only with the same worker count; use "
            "streamio.StreamingDataLoader to resume on another one"
        )
    if not state.datasets:
        return
    if num_workers == 0:
        ds.load_state_dict(state.datasets[0])
        return
    what = "dataset state of a worker"
    states = [check_version(s, STATE_VERSION, what=what, error=PlanError) for s in state.datasets]
    starts = {repr((s.get(K_EPOCH), s.get(K_PLAN))) for s in states}
    if len(starts) != 1:
        raise PlanError(
            f"StatefulDataLoader state: its {len(states)} workers' dataset states start from different epochs "
            f"or positions ({[_short(s) for s in sorted(starts)[:2]]}...); it was not saved by one loader of "
            "this dataset"
        )
    first = states[0]  # the position the workers' iteration started from: epoch and plan, no worker
    ds.load_state_dict(state_of(first.get(K_EPOCH), first.get(K_PLAN)))  # type: ignore[arg-type]
    plan = ds.plan(num_workers)
    handed = state.batches is not None and state.batches >= plan.batches_per_rank  # the last batch went out
    if state.finished or handed:  # the loader restarts from this object: the next epoch
        ds.position.resume = plan.state_dict(plan.batches_per_rank)
        ds.position.ended = True  # it ran to its end: the next iteration reads the next epoch

