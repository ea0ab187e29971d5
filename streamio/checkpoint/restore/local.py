"""What a restore can take from the local tier: its saves, its manifests, its parts.

docs/design.md "Local tier". Every rank lists the saves of its own local root: the one its
``latest.json`` names and the others of that pointer's timeline, newest first
(:meth:`LocalCopies.candidates`); the restore walk gathers every rank's list and tries the union
with the root's candidates, newest first, every rank agreeing on each outcome, so the save loaded
is the newest that every rank can get, each part from the nearest copy: this rank's local root or
its node's siblings' (for the parts another rank wrote), else the root (:meth:`LocalCopies.places`).
A local copy that is missing, damaged or cannot be read falls back to the root, never loads; a
local root that does not record this job's root as its owner (:mod:`~..owner`) is not read at all.

The tiers may disagree on the timeline: a rollback saved on the local tier only, or a stale local
tier while a job elsewhere went back past its saves. Of the root's pointer and the ranks' local
pointers, the restore stands on the one that continued or went back past the others
(:func:`current_tip`), and only saves of its timeline are candidates, whatever their step: as with
the root alone, a save a restore went back past is abandoned, on whichever tier it is.
"""

from __future__ import annotations

import logging
import os

from streamio.checkpoint import owner, root
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.timeline import Tip, classify, newest
from streamio.checkpoint.options import LocalTier
from streamio.checkpoint.restore.candidates import Candidate
from streamio.checkpoint.tensors.fetch import Places
from streamio.errors import StreamioError
from streamio.storage import Store

__all__ = ["LocalCopies", "current_tip", "merge", "on_tip"]

log = logging.getLogger(__name__)


class LocalCopies:
    """This rank's view of the local tier (its own root and its node's siblings').

    Args:
        tier: where the local roots are.
        rank: this rank.
        owner: the identity of the durable root (:func:`~..owner.root_identity`): a local root
            that does not record it is never read (another job's copies).
    """

    def __init__(self, tier: LocalTier, rank: int, *, owner: str) -> None:
        self.tier, self.rank, self.owner = tier, rank, owner
        self.store = Store(tier.rank_root(rank))
        self._siblings: dict[int, Store | None] = {}  # rank -> its local root, if this job's (per restore)

    def candidates(self) -> list[Candidate]:
        """This rank's local saves a restore may try, newest first (none if its root is unreadable
        or not this job's); the start of a restore, which checks every local root's owner again."""
        self._siblings = {}
        if self._sibling(self.rank) is None:
            return []
        try:
            pointer = root.read_pointer(self.store)
            if pointer is None:
                return []
            saves = root.committed_saves(self.store)
        except (StreamioError, OSError) as exc:
            log.warning("the local checkpoint copies at %s cannot be read (%s); restoring from the root",
                        self.store.root_url, exc)
            return []
        tip = Tip(pointer.timeline, pointer.step)
        found = [Candidate(pointer.step, pointer.path, pointer.manifest_checksum, line=pointer.timeline,
                           created=pointer.created)]
        for ref in reversed(saves):
            if ref.path == pointer.path:
                continue
            try:
                m = root.read_manifest(self.store, ref.step, path=ref.path)
            except (StreamioError, OSError):
                continue
            if classify(tip, m.line, m.step) == "current":
                found.append(Candidate(ref.step, ref.path, line=m.line))
        return found

    def manifest(self, c: Candidate) -> Manifest | None:
        """``c``'s manifest from this rank's local root, verified, or None if it has none that verifies."""
        if self._sibling(self.rank) is None:
            return None
        try:
            return root.read_manifest(self.store, c.step, path=c.path, checksum=c.checksum)
        except FileNotFoundError:
            return None
        except (ManifestError, OSError) as exc:
            log.warning("the local copy of step %d's manifest at %s is unusable (%s); reading the root's",
                        c.step, self.store.url(c.path), exc)
            return None

    def places(self, durable: Store) -> Places:
        """Where parts are read: the local root of the rank that wrote each (if on this node), then ``durable``."""
        return Places(durable, self._sibling)

    def _sibling(self, rank: int) -> Store | None:
        """``rank``'s local root on this node, if it is there and records this job's root as its owner."""
        if rank not in self._siblings:
            path = self.tier.rank_root(rank).removeprefix("file://")
            store = self.store if rank == self.rank else Store(path)
            mine = os.path.isdir(path) and owner.owns(store, self.owner)
            if not mine and os.path.lexists(path):
                log.warning("the local copies at %s are not read: they do not record %s as their owner",
                            store.root_url, self.owner)
            self._siblings[rank] = store if mine else None
        return self._siblings[rank]


def current_tip(durable: list[Candidate], local: list[list[Candidate]]) -> Tip | None:
    """Where a restore stands: of the root's pointer and every rank's local pointer (each list's
    first candidate, when it carries the pointer's checksum), the one every other came before
    (:func:`~..format.timeline.newest`: it continued them, or went back past them). Where their
    timelines do not record it (two restores of the same save, or unrelated timelines), the
    pointer written last (the root's on a tie); ``None`` without any pointer."""
    pointers = [*durable[:1], *(c for found in local for c in found[:1])]
    tips = {Tip(c.line, c.step): c.created for c in pointers if c.checksum and c.line is not None}
    found = newest(tips)
    if found is None and tips:
        found = max(tips, key=lambda t: tips[t])  # the first (the root's) of the latest
    return found


def on_tip(tip: Tip | None, c: Candidate) -> bool:
    """Whether a restore standing at ``tip`` may load ``c``: a save of its timeline (one whose
    timeline is unknown, or any without a tip, is tried as before)."""
    return tip is None or c.line is None or classify(tip, c.line, c.step) == "current"


def merge(durable: list[Candidate], local: list[list[Candidate]]) -> list[Candidate]:
    """The root's candidates and every rank's local ones as one list, newest first, each save once
    (the root's entry wins: it carries what a restore recorded of it; a local pointer's checksum
    fills in where the root's has none)."""
    by_path = {c.path: c for c in durable}
    for found in local:
        for c in found:
            have = by_path.get(c.path)
            if have is None:
                by_path[c.path] = c
            elif have.checksum is None and c.checksum is not None and not have.skip:
                by_path[c.path] = Candidate(have.step, have.path, c.checksum, line=have.line or c.line)
    return sorted(by_path.values(), key=lambda c: (-c.step, c.path))
