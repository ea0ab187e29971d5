"""Applying retention after a commit: what the policy drops is deleted, manifest first.

The policy (:mod:`.retention`, pure) decides which committed steps to keep from what is known of
each (:class:`~.retention.CheckpointRecord`: step and metrics); this module gathers those records
from the root and deletes the rest (:func:`~.catalog.delete_step`: the manifest first, so a
half-deleted step is never taken for a complete one). It runs on rank 0 after the pointer names
the new step, so the step the pointer names is never deleted and a failure here costs only disk:
it is logged, never raised (the new checkpoint is committed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streamio.checkpoint import layout
from streamio.checkpoint import manifest as mf
from streamio.checkpoint.catalog import PhaseHook, committed_steps, delete_step
from streamio.checkpoint.retention import CheckpointRecord, RetentionPolicy, steps_to_delete
from streamio.checkpoint.validate import ManifestError
from streamio.storage import Store

__all__ = ["Pruner"]

log = logging.getLogger(__name__)


class Pruner:
    """Deletes the committed steps ``policy`` drops under one root.

    Args:
        store: the checkpoint root.
        policy: which committed checkpoints to keep (may be replaced between saves).
        on_phase: called with ``"delete"`` inside each deletion and ``"retention"`` when done.
    """

    def __init__(self, store: Store, policy: RetentionPolicy, *, on_phase: PhaseHook | None = None) -> None:
        self.store, self.policy = store, policy
        self._on_phase = on_phase
        self._metrics: dict[int, Mapping[str, Any]] = {}  # step -> metrics (read once per step)

    def committed(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Remember the metrics of a step this job committed (no read needed to rank it later)."""
        self._metrics[step] = metrics

    def prune(self, current: int) -> None:
        """Delete what the policy drops, never ``current`` (the step the pointer names)."""
        try:
            for step in steps_to_delete(self.policy, self._records(), current=current):
                delete_step(self.store, step, on_phase=self._on_phase)
                self._metrics.pop(step, None)
                log.info("retention deleted checkpoint step %d under %s", step, self.store.root_url)
            if self._on_phase is not None:
                self._on_phase("retention")
        except Exception as exc:  # retention is housekeeping: the new checkpoint is committed
            log.warning("retention under %s failed after committing step %d: %s", self.store.root_url, current, exc)

    def _records(self) -> list[CheckpointRecord]:
        """What the policy knows of every committed step (metrics of steps not seen read once)."""
        steps = committed_steps(self.store)
        unknown = [s for s in steps if s not in self._metrics]
        if unknown:
            for s, data in zip(unknown, self.store.read_many([layout.manifest_path(s) for s in unknown]), strict=True):
                try:
                    self._metrics[s] = mf.manifest_from_bytes(data).metrics
                except ManifestError:
                    self._metrics[s] = {}
        return [CheckpointRecord(s, self._metrics[s]) for s in steps]
