"""What streamio keeps for one ``Accelerator``: its prepared streamio loaders and its RNG state.

Accelerate keeps the objects it prepared on the accelerator (``_models``, ``_optimizers``,
``_schedulers``, ``_dataloaders``, ``_custom_objects``) and saves them from there.
:func:`~streamio.accelerate.prepare` leaves streamio's loaders out of ``accelerator.prepare``, so
they are recorded here instead, in a table keyed weakly by the accelerator (nothing is set on the
Accelerate object, and the entry goes with it). The :class:`~streamio.checkpoint.RNGState` lives
here too, one per accelerator, so its count of re-seeds (a resume on another world size) carries
from a ``load_state`` to the next ``save_state``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from streamio.accelerate.loader import DeviceLoader
from streamio.checkpoint.rng import RNGState

__all__ = ["Attached", "attached"]


@dataclass
class Attached:
    """The streamio side of one accelerator.

    Attributes:
        loaders: the :class:`DeviceLoader` of each streamio loader prepared, in preparation order.
        rng: this rank's RNG streams, saved per rank.
    """

    loaders: list[DeviceLoader] = field(default_factory=list)
    rng: RNGState = field(default_factory=RNGState)

    def wrapper_of(self, loader: Any) -> DeviceLoader | None:
        """The wrapper already made for ``loader`` (the loader itself or its wrapper), if any."""
        return next((w for w in self.loaders if w is loader or w.loader is loader), None)


_TABLE: weakref.WeakKeyDictionary[Any, Attached] = weakref.WeakKeyDictionary()


def attached(accelerator: Any) -> Attached:
    """The streamio side of ``accelerator`` (made empty on first use)."""
    entry = _TABLE.get(accelerator)
    if entry is None:
        entry = _TABLE[accelerator] = Attached()
    return entry
