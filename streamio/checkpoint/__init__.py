"""Atomic, parallel checkpoints of training state to object storage.

Every rank saves its share of the state in the background and a compare-and-swap of one small
pointer (``latest.json``) makes a save the current checkpoint, so a crash at any instant costs at
most the save in progress; a restore walks back to the newest checkpoint that verifies and loads
it all or nothing, onto any number of ranks and any sharding. The names users need are here
(``__all__``); ``CheckpointManager`` is the facade.

The design, the formats and the commit protocol: docs/design.md "Checkpoints", which also maps
this package's modules ("Layout and the direction of dependencies"); what a root holds over time
(timelines, bad saves, retention, ``gc``, ``rm``): docs/checkpoint-lifecycle.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamio.lazy import lazy_exports

if TYPE_CHECKING:
    from streamio.checkpoint.dcp.reader import StreamioReader
    from streamio.checkpoint.dcp.writer import StreamioWriter
    from streamio.checkpoint.format.retention import KeepAll, KeepBest, KeepEvery, KeepLast, RetentionPolicy
    from streamio.checkpoint.manager import CheckpointManager
    from streamio.checkpoint.options import LocalTier, SaveOptions, SaveStats
    from streamio.checkpoint.rng import RNGState
    from streamio.checkpoint.tensors.app_state import ShardedModelState

#: public name -> the module defining it, imported on first use: the manager imports torch (and the
#: DCP pair torch DCP, a second more), which `streamio ckpt ls / inspect / rm` and `--help` do not need
_EXPORTS = {
    "CheckpointManager": "streamio.checkpoint.manager",
    "KeepAll": "streamio.checkpoint.format.retention",
    "KeepBest": "streamio.checkpoint.format.retention",
    "KeepEvery": "streamio.checkpoint.format.retention",
    "KeepLast": "streamio.checkpoint.format.retention",
    "LocalTier": "streamio.checkpoint.options",
    "RNGState": "streamio.checkpoint.rng",
    "RetentionPolicy": "streamio.checkpoint.format.retention",
    "SaveOptions": "streamio.checkpoint.options",
    "SaveStats": "streamio.checkpoint.options",
    "ShardedModelState": "streamio.checkpoint.tensors.app_state",
    "StreamioReader": "streamio.checkpoint.dcp.reader",
    "StreamioWriter": "streamio.checkpoint.dcp.writer",
}

__all__ = [
    "CheckpointManager",
    "KeepAll",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "LocalTier",
    "RNGState",
    "RetentionPolicy",
    "SaveOptions",
    "SaveStats",
    "ShardedModelState",
    "StreamioReader",
    "StreamioWriter",
]


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())  # each name imported on first use
