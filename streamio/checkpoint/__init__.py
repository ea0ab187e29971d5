"""Atomic, parallel checkpoints of training state to object storage.

``CheckpointManager`` (manager.py) runs the commit protocol; manifest.py holds the pure layout,
schemas and retention policies; serialize.py turns state dicts into raw tensor bytes + JSON and
back without ever unpickling. See docs/design.md "Checkpoints" (layout, formats, commit protocol).
"""

from streamio.checkpoint.manager import CheckpointManager, SaveOptions, SaveStats
from streamio.checkpoint.manifest import KeepAll, KeepBest, KeepEvery, KeepLast, RetentionPolicy

__all__ = [
    "CheckpointManager",
    "KeepAll",
    "KeepBest",
    "KeepEvery",
    "KeepLast",
    "RetentionPolicy",
    "SaveOptions",
    "SaveStats",
]
