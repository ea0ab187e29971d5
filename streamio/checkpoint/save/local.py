"""The local tier's commit: every save lands on node-local disk first (docs/design.md "Local tier").

Each rank's copies live in a checkpoint root of its own (:meth:`~..options.LocalTier.rank_root`),
with the layout and documents of the durable root. :meth:`LocalCommitter.commit` runs, for one
snapshot and the save's plan (the same save id, directory and timeline the root will get):

1. the rank writes its parts from the host buffer (:func:`~.parts.write_share`: temp file, fsync,
   link, as every local put) and its done marker;
2. the markers are gathered over the process group (a rank cannot read another node's disk), and
   rank 0 assembles the manifest exactly as the root's commit does, and broadcasts it;
3. every rank writes ``manifest.json`` and then its own ``latest.json`` (the pointer document,
   with the manifest's checksum): the local commit, atomic on its own;
4. local retention keeps the ``keep`` newest saves of the rank's root on the save's timeline
   (never one still to be uploaded) and deletes everything else in it (:meth:`LocalCommitter.prune`).

Steps 1 and 4 first check that the rank's local root records this job's root as its owner
(:mod:`~..owner`): another job's copies are never written over or pruned.

A rank's local pointer names the newest save it committed; whether a save is usable for a restore
is decided then, by every rank together (:mod:`~..restore.tiers`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from streamio.checkpoint import owner, root
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.timeline import Timeline, Tip, classify
from streamio.checkpoint.options import LocalTier, SaveOptions
from streamio.checkpoint.save.parts import Share, assemble_manifest, write_share
from streamio.checkpoint.save.plan import SavePlan
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.errors import CheckpointError, StreamioError
from streamio.storage import Store

__all__ = ["LocalCommitter", "LocalSave"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalSave:
    """A save committed on the local tier, as this rank holds it.

    Attributes:
        plan: where it goes (its directory is the same on every tier).
        store: this rank's local root.
        share: this rank's parts and done marker.
        manifest: the save's manifest (every rank's copy is the same).
    """

    plan: SavePlan
    store: Store
    share: Share
    manifest: Manifest
    started: float | None = None  # time.perf_counter() when save() was called (its durable phase counts from it)


class LocalCommitter:
    """Commits saves to this rank's local root (see the module docstring).

    Args:
        tier: where the local roots are and how many saves each keeps.
        comm: the collectives (every rank commits alike).
        owner: the identity of the durable root (:func:`~..owner.root_identity`): a local root
            that does not record it is neither written nor pruned.
        options: part size, concurrency, compression (as for the root).
        on_phase: called with ``"local-parts"``, ``"local-manifest"``, ``"local-pointer"`` as they
            complete (the kill tests stop the process there).
    """

    def __init__(
        self, tier: LocalTier, comm: Comm, *, owner: str, options: SaveOptions,
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        self.tier, self.comm, self.options, self.owner = tier, comm, options, owner
        self.store = Store(tier.rank_root(comm.rank))
        self._on_phase = on_phase
        self._lines: dict[str, Timeline | None] = {}  # save directory -> its timeline (None: unreadable)
        self._tip: Tip | None = None  # the save committed last

    def commit(self, job: Snapshot, plan: SavePlan) -> LocalSave:
        """Commit ``job`` as ``plan`` on every rank's local root (collective); :meth:`prune` follows.

        Raises:
            CheckpointError: a rank could not write its copy (every rank raises alike; what this
                rank wrote of it is removed).
        """
        store, comm = self.store, self.comm
        failure: str | None = None
        share: Share | None = None
        try:
            self._check_owner()
            share = write_share(store, job, plan, comm.rank, self.options, world=comm.world)
            root.write_marker(store, plan.place, share.marker)
            self._phase("local-parts")
        except Exception as exc:  # reported to every rank below
            failure = f"rank {comm.rank}: {type(exc).__name__}: {exc}"
            log.debug("local copy of step %d failed on rank %d", plan.step, comm.rank, exc_info=True)
        markers = comm.all_gather(None if failure else share.marker)  # type: ignore[union-attr]
        failures = [f"rank {r} could not write its copy" for r, m in enumerate(markers) if m is None]
        if failures:
            self._discard(plan)
            raise CheckpointError(
                f"the local copy of step {plan.step} under {self.tier.path} failed ({failure or failures[0]}); "
                f"the save goes to the root only"
            )
        manifest = comm.broadcast(assemble_manifest(plan, markers, job) if comm.rank == 0 else None)
        assert share is not None
        try:
            digest = root.create_manifest(store, plan.sdir, manifest)
            self._phase("local-manifest")
            pointer = Pointer(step=plan.step, path=plan.sdir, manifest_checksum=digest, save_id=plan.save_id,
                              created=manifest.created, timeline=plan.timeline)
            root.swap_pointer(store, pointer, None)  # this rank alone writes its local root
            self._phase("local-pointer")
        except Exception as exc:
            self._discard(plan)
            raise CheckpointError(
                f"rank {comm.rank} could not commit the local copy of step {plan.step} under {store.root_url}: {exc}"
            ) from exc
        self._lines[plan.sdir] = manifest.line
        self._tip = Tip(plan.timeline, plan.step)
        return LocalSave(plan, store, share, manifest, job.started)

    def prune(self, tip: Tip | None = None, keep_also: frozenset[str] = frozenset()) -> None:
        """Keep the ``tier.keep`` newest local saves of ``tip``'s timeline (default: the save this
        committer committed last; nothing is pruned before it committed one),
        and ``keep_also``; delete every other save directory of this rank's root: older saves, saves
        of other timelines (superseded by a restore, or a manifest a killed commit wrote before its
        pointer), and what a killed commit left without a manifest, temp files of unfinished writes
        included. Only this rank's save thread writes its root, and it is here: nothing unfinished
        in it belongs to a live writer."""
        tip = tip or self._tip
        if tip is None:
            return
        store = self.store
        try:
            self._check_owner()  # never another job's copies
            listing = root.objects(store)
            stale = store.incomplete_uploads()
        except (StreamioError, OSError) as exc:  # no root yet, the disk failed, not ours: nothing to prune
            log.debug("no local retention at %s: %s", store.root_url, exc)
            return
        saves = root.committed_saves(store, listing)  # by step, then path
        unread = [s for s in saves if s.path not in self._lines]  # a save's timeline never changes
        for path, m in root.read_manifests(store, unread, concurrency=self.options.concurrency).items():
            self._lines[path] = m.line if isinstance(m, Manifest) else None
        current = [s.path for s in saves if _on(tip, self._lines[s.path], s.step)]
        keep = set(current[-self.tier.keep:]) | keep_also
        dirs = {s.path: s.step for s in saves}
        heads = [found[0] for o in listing if (found := layout.locate(o.path))]  # a killed commit's: no manifest
        for head in [*heads, *_dir_names(self.tier.rank_root(self.comm.rank))]:  # a killed deletion's: empty
            parsed = layout.parse_save_dir(head)
            if parsed is not None:
                dirs.setdefault(head, parsed[0])
        try:
            for sdir in sorted(set(dirs) - keep):
                root.delete_save(store, sdir)
                _remove_empty_tree(self.tier.rank_root(self.comm.rank), sdir)
                self._lines.pop(sdir, None)
            for upload in stale:
                store.abort_upload(upload)
            root.remove_empty_dirs(store, {p for u in stale for p in layout.parents(u.path)})
        except OSError as exc:  # a note: the next save prunes again
            log.warning("could not delete old local checkpoint copies under %s: %s", store.root_url, exc)

    def drop(self, plan: SavePlan) -> None:
        """Remove this rank's copy of ``plan``'s save (another rank's did not commit)."""
        try:
            root.delete_save(self.store, plan.sdir, save_id=plan.save_id, prefixes=plan.prefixes)
        except Exception as exc:  # noqa: BLE001 - the next save prunes it
            log.debug("could not remove the local copy of step %d: %s", plan.step, exc)

    def _discard(self, plan: SavePlan) -> None:
        """Remove what this rank wrote of a local save that did not commit (never raises)."""
        try:
            root.delete_share(self.store, plan.place, plan.save_id, self.comm.rank)
            root.remove_empty_dirs(self.store, [plan.sdir])
        except Exception as exc:  # noqa: BLE001 - the disk may be what failed; the next save prunes
            log.debug("could not remove the local leftovers of step %d: %s", plan.step, exc)

    def _check_owner(self) -> None:
        """Raise unless this rank's local root records this job's root as its owner (:mod:`~..owner`)."""
        if not owner.owns(self.store, self.owner):
            raise CheckpointError(f"the local root {self.store.root_url} does not record {self.owner} as its owner")

    def _phase(self, name: str) -> None:
        if self._on_phase is not None:
            self._on_phase(name)


def _on(tip: Tip, line: Timeline | None, step: int) -> bool:
    """Whether a local save (its timeline, ``None`` if its manifest is unreadable) is on ``tip``'s timeline."""
    return line is not None and classify(tip, line, step) == "current"


def _subdirs(path: str) -> list[str]:
    """The names of the directories in ``path`` (none if it cannot be listed)."""
    try:
        return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _spread_names(base: str) -> list[str]:
    """The key-prefix directories (``p-03``) in the local root at ``base``."""
    return [n for n in _subdirs(base) if layout.is_spread_dir(n)]


def _dir_names(local_root: str) -> list[str]:
    """The directories in a local root and in its key-prefix directories."""
    base = local_root.removeprefix("file://")
    return [*_subdirs(base), *(n for s in _spread_names(base) for n in _subdirs(os.path.join(base, s)))]


def _remove_empty_tree(local_root: str, sdir: str) -> None:
    """Remove the directories left empty under ``sdir`` and its key prefixes' ``p-*/sdir`` (a
    deletion killed before its ``rmdir``s leaves a tree without a file, which no listing of
    objects shows), deepest first."""
    base = local_root.removeprefix("file://")
    tops = [os.path.join(base, sdir), *(os.path.join(base, n, sdir) for n in _spread_names(base))]
    for top in tops:
        for path, _, files in os.walk(top, topdown=False):
            if not files:
                try:
                    os.rmdir(path)
                except OSError:  # not empty after all (a subdirectory with a file), or gone
                    continue

