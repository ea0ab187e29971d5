"""A save that fails: its cause in words, and removing what it wrote.

A save that fails after writing parts used to leave them: on a local disk that filled up, the
failed save's parts kept the space, so every later save failed too until ``streamio ckpt gc
--min-age 0``. Now each rank removes its own share of a failed save (:func:`discard_share`):
the objects whose names carry the save's id below its rank's directory (parts, done marker) and
its unfinished multipart uploads, then, on a local root, the directories left empty. The save id
is random per save, so this never touches another writer's objects; and it runs only when the
save is known not to be committed: every rank reported its failure at the barrier (so no
manifest was attempted), or rank 0's publishing failed and it found no manifest of this save
(:func:`uncommitted`; one it cannot read, or an unknown outcome, keeps everything). A barrier
that itself failed (a rank died, the collective timed out) decides nothing, and nothing is
removed. A discard that fails is logged and tried again at the start of the next save
(:class:`FailedShares`); what it cannot reach (the process died) ``gc`` removes.

Writes that fail for lack of room (``ENOSPC``, ``EDQUOT``, ``EFBIG``) say so and name the object
(:func:`writing`), instead of a generic storage error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator

from streamio.checkpoint.format.layout import Placement, manifest_at
from streamio.checkpoint.root import delete_objects, delete_share, read_manifest
from streamio.errors import CheckpointError, CheckpointNotFoundError
from streamio.storage import Store

__all__ = ["FailedShares", "discard_share", "room_problem", "uncommitted", "withdraw_manifest", "writing"]

log = logging.getLogger(__name__)

_NO_ROOM = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for this filesystem or process (RLIMIT_FSIZE)",
}


def room_problem(exc: BaseException) -> str | None:
    """What ran out, in words, if ``exc`` or one of its causes is a write that found no room."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _NO_ROOM:
            return _NO_ROOM[cur.errno]
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def writing(url: str) -> Iterator[None]:
    """Turn a write to ``url`` that found no room into a :class:`CheckpointError` saying so."""
    try:
        yield
    except OSError as exc:
        problem = room_problem(exc)
        if problem is None:
            raise
        raise CheckpointError(
            f"{problem} writing {url}: free space there or save to another root (what this failed save wrote "
            f"is removed; `streamio ckpt gc` removes what killed saves left)"
        ) from exc


def discard_share(store: Store, place: Placement, save_id: str, rank: int) -> bool:
    """Delete ``rank``'s objects of the uncommitted save ``save_id`` at ``place``; see the module docstring.

    Returns:
        Whether everything went (else logged; the caller tries again later).
    """
    try:
        delete_share(store, place, save_id, rank)
    except Exception as exc:  # noqa: BLE001 - the save's own error is the one raised; this is housekeeping
        log.warning("could not remove rank %d's share of the failed save %s at %s (%s: %s): the next save tries "
                    "again; `streamio ckpt gc` removes it too", rank, save_id, store.url(place.sdir),
                    type(exc).__name__, exc)
        return False
    log.info("removed rank %d's share of the failed save %s at %s", rank, save_id, store.url(place.sdir))
    return True


def uncommitted(store: Store, step: int, sdir: str, save_id: str) -> bool:
    """Whether the save ``save_id`` of ``step`` in ``sdir`` surely has no manifest: there is none,
    or it is another save's. ``False`` when it has one or that cannot be told."""
    try:
        return read_manifest(store, step, path=sdir).save_id != save_id
    except CheckpointNotFoundError:
        return True
    except Exception:  # noqa: BLE001 - unreadable or unreachable: it may be committed, keep everything
        return False


def withdraw_manifest(store: Store, step: int, sdir: str, save_id: str) -> None:
    """Rank 0, when a save ran out of time (``SaveOptions.save_timeout_s``) after its manifest was
    written but before its pointer swap was sent: delete that manifest, if it is this save's, so
    that no listing offers a step the pointer never named and never will (:mod:`.bound`)."""
    try:
        if read_manifest(store, step, path=sdir).save_id == save_id:
            delete_objects(store, [manifest_at(sdir)])
            log.warning("removed the manifest of step %d at %s: its save ran out of time before its pointer swap",
                        step, store.url(sdir))
    except Exception as exc:  # noqa: BLE001 - housekeeping after the save's own error: `gc` removes it too
        log.warning("could not remove the manifest of the timed-out save %s at %s (%s: %s): `streamio ckpt gc` "
                    "removes it", save_id, store.url(sdir), type(exc).__name__, exc)


class FailedShares:
    """This rank's shares of failed saves: removed now, or at the next save if that failed.

    Args:
        store: the checkpoint root.
        rank: this rank (whose objects alone it removes).
    """

    def __init__(self, store: Store, rank: int) -> None:
        self.store, self.rank = store, rank
        self._left: list[tuple[Placement, str]] = []  # (where the save is, its id) not removed yet

    def discard(self, place: Placement, save_id: str) -> None:
        """Remove this rank's share of the uncommitted save ``save_id`` at ``place``."""
        if not discard_share(self.store, place, save_id, self.rank):
            self._left.append((place, save_id))

    def retry(self) -> None:
        """Try again to remove the shares that could not be removed before."""
        self._left = [(d, i) for d, i in self._left if not discard_share(self.store, d, i, self.rank)]
