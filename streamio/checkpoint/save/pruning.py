"""What is deleted after a commit: abandoned and bad saves, then what the retention policy drops.

Runs on rank 0 after the pointer names the new checkpoint (docs/checkpoint-lifecycle.md), so
nothing is deleted before the pointer that supersedes it is committed, the checkpoint the
pointer names is never deleted, and a failure here costs only disk: it is logged, never raised.
Against the new pointer's timeline (:mod:`~..format.timeline`) every other save of the root is:

* **abandoned** (a step past the one a restore went back to, a save whose job died before its
  pointer swap, a loser of a race) or **bad** (a restore rejected it; its manifest is damaged):
  *retired*, whatever the policy says, and logged;
* **current**: ranked by the policy (:mod:`~..format.retention`, pure), in commit order, and deleted if
  it drops them;
* **ahead** (a save another job is committing on top of this one): left alone.

Deleting a save removes its manifest first (:func:`~.root.delete_save`).

The policy belongs to the root: it is recorded in ``retention.json``. A manager given no policy
applies the recorded one (``KeepLast(2)`` if none is, recorded then); one given another policy
logs the change and records its own. A recorded policy that cannot be rebuilt here (a class of
the user's own, or an unreadable record) keeps everything: the library default never deletes a
checkpoint that the recorded policy would keep.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.notes import RetentionRecord
from streamio.checkpoint.format.retention import (
    CheckpointRecord,
    KeepAll,
    KeepLast,
    RetentionPolicy,
    policy_to_json,
    steps_to_delete,
)
from streamio.checkpoint.format.timeline import Timeline, Tip, classify, compact
from streamio.checkpoint.root import (
    PhaseHook,
    SaveRef,
    committed_saves,
    delete_save,
    read_manifests,
    read_retention,
    record_retention,
)
from streamio.errors import StreamioError
from streamio.storage import Store

__all__ = ["DEFAULT_RETENTION", "Pruner"]

log = logging.getLogger(__name__)

DEFAULT_RETENTION = KeepLast(2)
"""What a root with no recorded policy keeps (and then records)."""

_UNREAD = object()

_ABANDONED = ("it is not on the current timeline (a step past the one a restore went back to, or a save that never "
              "swapped latest.json)")


class Pruner:
    """Retires abandoned and bad saves and applies the root's retention policy; see the module docstring.

    Args:
        store: the checkpoint root.
        policy: the policy this job applies; ``None``: the one the root records.
        on_phase: called with ``"delete"`` inside each deletion and ``"retention"`` when done.
    """

    def __init__(self, store: Store, policy: RetentionPolicy | None, *, on_phase: PhaseHook | None = None) -> None:
        self.store = store
        self._explicit = policy
        self._on_phase = on_phase
        self._recorded: object = _UNREAD  # RetentionRecord | None | _UNREAD
        self._manifests: dict[str, Manifest | StreamioError] = {}  # save dir -> manifest (immutable)

    @property
    def policy(self) -> RetentionPolicy:
        """The policy the next prune applies (the root's recorded one unless this job set one)."""
        if self._explicit is not None:
            return self._explicit
        record = self._record()
        if record is None:
            return DEFAULT_RETENTION
        return record.policy if record.policy is not None else KeepAll()

    @policy.setter
    def policy(self, policy: RetentionPolicy) -> None:
        self._explicit = policy

    def committed(self, sdir: str, manifest: Manifest) -> None:
        """Remember the manifest of a save this job committed (no read needed to rank it later)."""
        self._manifests[sdir] = manifest

    def prune(self, tip: Tip, current: str, *, continued: str = "") -> Timeline | None:
        """Retire what is not on ``tip``'s timeline, then delete what the policy drops, never the
        save in ``current`` (the one the pointer names). ``continued`` is the save the new one
        continues (restored or adopted): retiring it because the job saved its step or an earlier
        one again is what the job asked for, logged at INFO (other retirements warn).

        Returns:
            ``tip``'s timeline without the history entries no save is left of
            (:func:`~..format.timeline.compact`), or ``None`` if pruning failed (logged).
        """
        try:
            policy = self._settle_policy()
            saves = committed_saves(self.store)
            unknown = [s for s in saves if s.path not in self._manifests]
            self._manifests.update(read_manifests(self.store, unknown))
            records: dict[int, SaveRef] = {}
            for ref in saves:
                if ref.path == current:
                    records[tip.step] = ref
                    continue
                m = self._manifests.get(ref.path)
                why = self._retire_reason(tip, ref, m)
                if why is not None:
                    self._delete(ref, m, why, tip.step, asked=ref.path == continued and why == _ABANDONED)
                elif isinstance(m, Manifest) and classify(tip, m.line, m.step) == "current":
                    records[m.step] = ref
            ranked = [CheckpointRecord(s, self._metrics(records[s])) for s in sorted(records)]
            for step in steps_to_delete(policy, ranked, current=tip.step):
                self._delete(records[step], self._manifests.get(records[step].path), None, tip.step)
            if self._on_phase is not None:
                self._on_phase("retention")
            left = [(m.line.id, m.step) for m in self._manifests.values() if isinstance(m, Manifest)]
            return compact(tip.timeline, left)
        except Exception as exc:  # housekeeping: the new checkpoint is committed
            log.warning("retention under %s failed after committing step %d: %s", self.store.root_url, tip.step, exc)
            return None

    @staticmethod
    def _retire_reason(tip: Tip, ref: SaveRef, m: Manifest | StreamioError | None) -> str | None:
        if isinstance(m, ManifestError) and not m.unknown_version:
            return f"its manifest is unusable ({m})"
        if not isinstance(m, Manifest):
            return None  # gone meanwhile, or a newer streamio's: not ours to judge
        if ref.bad:
            return f"a restore rejected it ({layout.bad_path(ref.path)})"
        if classify(tip, m.line, m.step) == "abandoned":
            return _ABANDONED
        return None

    def _delete(self, ref: SaveRef, m: Manifest | StreamioError | None, why: str | None, current: int, *,
                asked: bool = False) -> None:
        known = m if isinstance(m, Manifest) else None
        delete_save(self.store, ref.path, save_id=known and known.save_id, prefixes=known and known.key_prefixes,
                    on_phase=self._on_phase)
        self._manifests.pop(ref.path, None)
        if why is None:
            log.info("retention deleted checkpoint step %d at %s", ref.step, self.store.url(ref.path))
        elif asked:
            log.info("retired checkpoint step %d at %s: step %d continues the save before it and supersedes it",
                     ref.step, self.store.url(ref.path), current)
        else:
            log.warning("retired checkpoint step %d at %s after committing step %d: %s",
                        ref.step, self.store.url(ref.path), current, why)

    def _metrics(self, ref: SaveRef) -> dict[str, object]:
        m = self._manifests.get(ref.path)
        return dict(m.metrics) if isinstance(m, Manifest) else {}

    # ------------------------------------------------------------------ the recorded policy
    def _record(self) -> RetentionRecord | None:
        """The root's recorded policy (read once); an unreadable record keeps everything."""
        if self._recorded is not _UNREAD:
            return self._recorded  # type: ignore[return-value]
        url = self.store.url(layout.RETENTION)
        record: RetentionRecord | None
        try:
            record = read_retention(self.store)
        except FileNotFoundError:
            record = None
        except ManifestError as exc:
            log.warning("%s is unusable (%s): keeping every checkpoint; give the manager retention= to "
                        "record a policy", url, exc)
            record = RetentionRecord(None, {}, "")
        else:
            if record.policy is None and self._explicit is None:
                log.warning("%s records the policy %s, which cannot be rebuilt here: keeping every checkpoint; "
                            "give the manager retention= to apply it", url, record.doc)
        self._recorded = record
        return record

    def _settle_policy(self) -> RetentionPolicy:
        """The policy to apply now, recorded in the root first if the root records another."""
        record, policy = self._record(), self.policy
        if self._explicit is None and record is not None:
            return policy  # the root's own
        doc = policy_to_json(policy)
        if record is not None and record.doc == doc:
            return policy
        if record is not None:
            log.warning("retention under %s changes: the root recorded %s, this manager applies %s (recorded now)",
                        self.store.root_url, record.doc, doc)
        recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
        record_retention(self.store, policy, recorded)
        self._recorded = RetentionRecord(policy, doc, recorded)
        return policy
