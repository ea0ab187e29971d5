"""The plugin's checkpoint managers: one per root it saves to, the recent ones kept for the next save.

Lightning saves to a few names over and over (``last.ckpt`` at every interval, a new top-k path
beside it). A fresh :class:`~streamio.checkpoint.CheckpointManager` per save paid, each time, a new
connection, a new host buffer (first-touch of ~100 MB: 0.4-0.7 s of a 2 s save on 2 shared CPUs),
two reads of the pointer (``adopt()``), a read of the root's retention record and of the
superseded save's manifest. A kept manager knows all of that from its own last save: the pointer's
version its swap wrote (so the next swap is still a compare-and-swap, and fails if anyone else
wrote the root since), its timeline and its retention record. It adopts the root again only when
that knowledge cannot serve: a root it has not saved to, or a step at or before the one it saved
last (``save_last`` after top-k at one step, a resumed job going back).

One :class:`~streamio.checkpoint.tensors.serialize.HostBuffer` serves every manager: saves through
the plugin run one at a time (Lightning's training thread, or ``AsyncCheckpointIO``'s one writer
thread; :meth:`Managers.saving` holds a lock), so a new top-k root reuses the memory ``last.ckpt``
touched. A root removed through the plugin forgets its manager (its pointer is gone).

Call order: :meth:`Managers.saving` (under its lock: the save) ... :meth:`Managers.forget` on
removal ... :meth:`Managers.close` at teardown.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from streamio.checkpoint import CheckpointManager
from streamio.checkpoint.tensors.serialize import HostBuffer
from streamio.storage import Store

__all__ = ["KEPT", "Managers"]

KEPT = 2
"""Managers kept: ``last.ckpt``'s and the newest top-k path's (Lightning's save of each interval)."""


class Managers:
    """The managers of the roots a plugin saves to, the :data:`KEPT` most recent kept.

    Args:
        make: a new manager for a root (solo, synchronous, ``KeepLast(1)``: the plugin's).
    """

    def __init__(self, make: Callable[[Store], CheckpointManager]) -> None:
        self._make = make
        self._kept: OrderedDict[str, CheckpointManager] = OrderedDict()
        self._buffer = HostBuffer()
        self._lock = threading.Lock()

    @contextmanager
    def saving(self, store: Store, step: int | None) -> Iterator[tuple[CheckpointManager, int]]:
        """The manager to save ``step`` to ``store`` with, ready to make it the root's current save,
        and the step; ``None`` (a Fabric state without ``global_step``): one past the root's current
        save, 0 for the first, so each save of a path counts on.

        Raises:
            CheckpointError: the root's pointer is unusable (from ``adopt()``).
            StorageError: the root cannot be reached.
        """
        with self._lock:
            manager = self._kept.pop(store.root_url, None)
            if manager is None:
                manager = self._make(store)
                manager._buffer = self._buffer  # noqa: SLF001 - one buffer for all: saves run one at a time
            try:
                last = manager.durable_step  # its own last save here (None: it has not saved here)
                if last is None or (step is not None and step <= last):
                    last = manager.adopt()  # the step the root holds (None: none)
                yield manager, step if step is not None else 0 if last is None else last + 1
            except BaseException:
                manager.close()  # its view of the root may be stale: the next save starts afresh
                raise
            self._kept[store.root_url] = manager
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)[1].close()

    def forget(self, store: Store) -> None:
        """Drop the manager of ``store`` (its root is being removed)."""
        with self._lock:
            manager = self._kept.pop(store.root_url, None)
        if manager is not None:
            manager.close()

    def close(self) -> None:
        """Close every kept manager and release the host buffer."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            self._buffer = HostBuffer()
        for manager in kept:
            manager.close()
