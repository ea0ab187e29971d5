"""HF Accelerate with streamio: streamio's loader through ``prepare``, ``save_state`` / ``load_state`` over S3/GCS.

``streamio.accelerate`` is importable without Accelerate; using a name from it without Accelerate
installed raises :class:`~streamio.errors.MissingDependencyError` saying what to install
(``pip install 'streamio-torch[accelerate]'``). ``import streamio`` never imports it.

* :func:`prepare`: ``accelerator.prepare`` for every object except a
  :class:`~streamio.StreamingDataLoader`, which already shards by rank and worker with equal batches
  on every rank: Accelerate would shard it again (half the data on 2 ranks) or dispatch its string
  keys (``TypeError``). It is wrapped in a :class:`DeviceLoader` that only moves batches to
  ``accelerator.device`` and tells Accelerate's gradient accumulation where the epoch ends.
  Combinations that cannot work are refused, never re-sharded silently.
* :func:`save_state` / :func:`load_state`: what ``accelerator.save_state`` saves (models,
  optimizers, schedulers, grad scaler, registered objects, ``accelerator.step``), plus every
  rank's RNG streams and every prepared streamio loader's position, as one collective save of a
  :class:`~streamio.CheckpointManager`: parallel parts, atomic pointer, nothing pickled.

docs/accelerate.md is the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio.lazy import lazy_exports

__all__ = ["DeviceLoader", "load_state", "prepare", "save_state"]

_EXPORTS = {"DeviceLoader": "streamio.accelerate.loader", "prepare": "streamio.accelerate.preparation",
            "save_state": "streamio.accelerate.state", "load_state": "streamio.accelerate.state"}

if TYPE_CHECKING:
    from streamio.accelerate.loader import DeviceLoader
    from streamio.accelerate.preparation import prepare
    from streamio.accelerate.state import load_state, save_state


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use


def __dir__() -> list[str]:
    return __all__
