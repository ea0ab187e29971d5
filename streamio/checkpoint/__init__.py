"""Atomic, parallel checkpoints of training state to object storage.

``CheckpointManager`` (manager.py) is the facade: it owns the host buffer and the one background
save thread. The protocol lives in modules of one concept each:

* snapshot.py: what ``save`` blocks on (state encoded, split per rank / replicated, copied to
  host memory);
* commit.py: the commit protocol (parts, done markers, barrier, create-only manifest,
  compare-and-swap pointer, then retention), conflict checks; comm.py: its collectives, each
  with a bounded wait (every rank must reach a save/restore within a timeout); inflight.py:
  the async saves nobody waited for yet, waited for at interpreter exit; abandon.py: a failed
  save removes what it wrote and names a full disk;
  pruning.py: after a commit, retiring abandoned and bad saves and applying the root's
  recorded retention policy;
* restore.py: the restore walk (walk-back, verified load, bad saves recorded); candidates.py:
  which saves it tries (the current timeline only); restore_plan.py decodes and checks a whole
  state before any live object changes;
* catalog.py: what a root holds (its saves, verified manifests, the pointer, deleting a save);
  admin.py: verify / gc / pointer check, removal.py: ``rm``, inventory.py: ``ls`` / ``inspect``
  for ``streamio ckpt``;
* PURE (no torch, fsspec or storage): layout.py (paths), manifest.py (document schemas),
  records.py (their records), validate.py (checks on what a stored document declares),
  timeline.py (which saves are current, ahead, abandoned), retention.py (which checkpoints to
  keep), root_records.py (bad-save and retention records), describe.py (what ``inspect``
  shows), options.py (SaveOptions, SaveStats);
* wrappers.py: a module's state under wrapper-independent keys (DDP, torch.compile);
* tree.py turns state dicts into JSON + tensor references and back without ever unpickling,
  serialize.py handles the tensor bytes; rng.py is ``RNGState``, every RNG of a rank;
  entries.py (PURE) the JSON of a document's entries (parts, tensors, sharded tensors);
* sharded/: DTensor state (FSDP2, tensor parallelism): saving local shards without a gather,
  restoring onto any sharding with ranged verified reads, ``ShardedModelState``, and
  ``StreamioWriter`` / ``StreamioReader``, a torch DCP storage pair over the same protocol
  (docs/sharded-checkpoints.md). The DCP pair is imported on first access (torch DCP costs a
  second to import).

See docs/design.md "Checkpoints" (layout, formats, commit protocol) and
docs/checkpoint-lifecycle.md (timelines, bad saves, retention, gc, rm).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamio.checkpoint.dcp.reader import StreamioReader
    from streamio.checkpoint.dcp.writer import StreamioWriter
    from streamio.checkpoint.format.retention import KeepAll, KeepBest, KeepEvery, KeepLast, RetentionPolicy
    from streamio.checkpoint.manager import CheckpointManager
    from streamio.checkpoint.options import SaveOptions, SaveStats
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
    "RNGState",
    "RetentionPolicy",
    "SaveOptions",
    "SaveStats",
    "ShardedModelState",
    "StreamioReader",
    "StreamioWriter",
]


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
