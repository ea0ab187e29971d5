"""Atomic, parallel checkpoints of training state to object storage.

``CheckpointManager`` (manager.py) runs the commit protocol; manifest.py holds the pure layout
and document schemas (records.py their records, validate.py the checks on what a stored document
declares, retention.py the retention policies); tree.py turns state dicts into JSON + tensor
references and back without ever unpickling, serialize.py handles the tensor bytes; and
restore_plan.py decodes and checks a whole state before any live object changes. See
docs/design.md "Checkpoints" (layout, formats, commit protocol).
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
