"""``DeviceLoader``: a streamio loader as Accelerate's training loop sees it, with its sharding kept.

``accelerator.prepare(loader)`` replaces a loader with a ``DataLoaderShard`` (each rank keeps every
``num_processes``-th batch of what the loader yields) or a ``DataLoaderDispatcher`` (rank 0 reads,
then concatenates and scatters tensors). A :class:`~streamio.StreamingDataLoader` already yields a
disjoint share of equal size on every rank, so the first halves the data on 2 ranks silently and
the second raises ``TypeError`` on the ``__key__`` strings of a batch (measured, accelerate 1.16).

What is left of ``prepare`` for such a loader is done here, and nothing else:

* each batch goes to ``accelerator.device`` (``accelerate.utils.send_to_device``: tensors move,
  strings and bytes pass through);
* the wrapper is a ``DataLoaderStateMixin``: while it iterates, Accelerate's ``GradientState``
  knows the active loader, and the last batch of the epoch sets ``end_of_dataloader``, so
  ``accelerator.accumulate`` syncs gradients at the epoch's end as with a prepared loader. The last
  batch is known from ``len(loader)`` taken as the iteration starts (the rest of the epoch after a
  resume), never by reading one batch ahead: the loader counts the batches it hands out, and one
  read ahead would be saved as consumed.

``state_dict`` / ``load_state_dict`` / ``len`` and every other attribute are the loader's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from streamio.accelerate.requirement import require
from streamio.data.loader import StreamingDataLoader

__all__ = ["DeviceLoader"]

_data_loader = require("accelerate.data_loader")
_state = require("accelerate.state")
_operations = require("accelerate.utils.operations")


class DeviceLoader(_data_loader.DataLoaderStateMixin):  # type: ignore[misc]
    """A :class:`~streamio.StreamingDataLoader` whose batches land on ``device``; made by
    :func:`streamio.accelerate.prepare` (see the module docstring).

    Args:
        loader: the streamio loader; its sharding, order and state are used as they are.
        device: where batches go (``accelerator.device``).
        non_blocking: passed to ``Tensor.to`` (the accelerator's ``DataLoaderConfiguration.non_blocking``).
    """

    def __init__(self, loader: StreamingDataLoader, device: torch.device, *, non_blocking: bool = False) -> None:
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.gradient_state = _state.GradientState()
        self._drop_last = True  # DataLoaderStateMixin.begin: no remainder (every rank's batches are its own)

    def __repr__(self) -> str:
        return f"streamio.accelerate.DeviceLoader({self.loader.dataset!r}, device={str(self.device)!r})"

    def __iter__(self) -> Iterator[Any]:
        total = len(self.loader)  # this iteration's batches (the rest of the epoch after a resume)
        self.begin()
        try:
            for n, batch in enumerate(self.loader, start=1):
                if n == total:
                    self.end_of_dataloader = True
                yield _operations.send_to_device(batch, self.device, non_blocking=self.non_blocking)
        finally:
            self.end()

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """The loader's exact position (:meth:`StreamingDataLoader.state_dict`)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the loader at ``state`` (:meth:`StreamingDataLoader.load_state_dict`)."""
        self.loader.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling, a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
