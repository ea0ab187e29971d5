"""Atomic, parallel checkpoints of training state to object storage.

``CheckpointManager`` (manager.py) is the facade: it owns the host buffer and the one background
save thread. The protocol lives in modules of one concept each:

* snapshot.py: what ``save`` blocks on (state encoded, split per rank / replicated, copied to
  host memory);
* commit.py: the commit protocol (parts, done markers, barrier, create-only manifest,
  compare-and-swap pointer, then retention), conflict checks; comm.py: its collectives;
  pruning.py: applying the retention policy after a commit;
* restore.py: the restore walk (candidates, walk-back, verified load); restore_plan.py decodes
  and checks a whole state before any live object changes;
* catalog.py: what a root holds (committed steps, verified manifests, the pointer, deleting a
  step); admin.py: verify / gc / pointer check for ``streamio ckpt``;
* PURE (no torch, fsspec or storage): layout.py (paths), manifest.py (document schemas),
  records.py (their records), validate.py (checks on what a stored document declares),
  retention.py (which checkpoints to keep), options.py (SaveOptions, SaveStats);
* tree.py turns state dicts into JSON + tensor references and back without ever unpickling,
  serialize.py handles the tensor bytes; rng.py is ``RNGState``, every RNG of a rank.

See docs/design.md "Checkpoints" (layout, formats, commit protocol).
"""

from streamio.checkpoint.manager import CheckpointManager
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.retention import KeepAll, KeepBest, KeepEvery, KeepLast, RetentionPolicy
from streamio.checkpoint.rng import RNGState

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
]
