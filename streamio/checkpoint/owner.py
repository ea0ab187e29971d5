"""A local tier's owner: which durable root the copies in a rank's local root belong to.

docs/design.md "Local tier". A local tier's directory is the user's choice, and nothing stops two
jobs from being given the same one (a node-wide ``/nvme/ckpt``, a rerun under a new root). The
copies there are then another job's: restoring them loads that job's weights as this one's, and
pruning them deletes saves that may never have been made durable. So each rank's local root
records its owner, in ``owner.json`` (:class:`~.format.notes.OwnerRecord`; this module is the one
that reads and writes it):

1. When a manager is made, each rank claims its local root (:func:`claim`). A record that names
   this job's root: the tier is this job's. One that names another root, or cannot be parsed
   (whose copies they are is then unknown): :class:`~streamio.errors.ConfigError` naming both
   roots, and nothing in the directory is read or deleted. No record: the rank writes it,
   create-only (a process racing it for the same directory loses the write and compares).
2. A local root that holds saves but no record (written before owners were recorded) is adopted
   only if one of its saves is in the durable root with the same manifest bytes (save ids are
   random: the same manifest is the same save, so the same job); otherwise it is refused as
   another owner's. When the durable root does not answer, it is left alone for this run.
3. Before a rank commits a local save or prunes its local root, and before a restore reads a
   local root (its own or a node sibling's), the record is read again (:func:`owns`): a local root
   that does not name this job's root is not written, pruned or read.

A local root that cannot be read or written at all (the path is a regular file, the disk fails)
is not refused: a warning says so, and the tier is then used as a failing disk is (each save goes
to the root, agreed by every rank; restores read the root).

The identity (:func:`root_identity`) is the root URL normalised: the scheme in lower case (``gcs``
and ``s3a`` as ``gs`` and ``s3``, by the storage layer's one table of protocol names), no
userinfo, query or fragment (where credentials hide), the path without ``.``, ``..`` or repeated
``/``; a local root is its resolved absolute path. The endpoint is not part of it: one job may
reach its bucket through different endpoints.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import urllib.parse
from datetime import datetime, timezone

from streamio.checkpoint import root
from streamio.checkpoint.format import layout, notes
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.notes import OwnerRecord
from streamio.errors import ConfigError, ObjectTooLargeError, StreamioError, WriteConflictError
from streamio.storage import Store
from streamio.storage.backends import canonical, is_file_url

__all__ = ["claim", "owns", "read_owner", "root_identity"]

log = logging.getLogger(__name__)

_FIX = "give each job a LocalTier path of its own"


def root_identity(url: str) -> str:
    """The identity of the checkpoint root at ``url`` (see the module docstring): what
    ``owner.json`` records, with no credential in it."""
    if is_file_url(url):
        return "file://" + os.path.realpath(url.split("://", 1)[1] if "://" in url else url)
    parts = urllib.parse.urlsplit(url)
    path = re.sub("/+", "/", parts.path)
    path = posixpath.normpath(path).rstrip("/") if path.strip("/") else ""
    return f"{canonical(parts.scheme.lower())}://{parts.netloc.rpartition('@')[2]}{path}"


def read_owner(store: Store) -> OwnerRecord | None:
    """The owner record of the local root ``store``, ``None`` if it has none.

    Raises:
        ManifestError: the record is not a valid one.
        StorageError: it cannot be read (a failing disk; the path is not a directory).
    """
    url = store.url(layout.OWNER)
    try:
        data = store.read(layout.OWNER, max_bytes=notes.MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except ObjectTooLargeError as exc:
        raise ManifestError(str(exc)) from exc
    return notes.owner_from_bytes(data, url)


def owns(store: Store, identity: str) -> bool:
    """Whether the local root ``store`` records the root ``identity`` as its owner (a record that
    is missing, invalid or unreadable: no)."""
    try:
        found = read_owner(store)
    except (StreamioError, OSError) as exc:
        log.debug("the owner of %s cannot be read: %s", store.root_url, exc)
        return False
    return found is not None and found.root == identity


def claim(store: Store, durable: Store) -> None:
    """Make the local root ``store`` the copies of ``durable``, or refuse it (steps 1 and 2 of the
    module docstring); a local root that cannot be used at all is left to fail as a disk does.

    Raises:
        ConfigError: it holds another root's copies, copies whose owner is unknown, or copies that
            record no owner and are not in ``durable``.
    """
    identity = root_identity(durable.root_url)
    try:
        found = read_owner(store)
        if found is None:
            _check_unowned(store, durable, identity)
            try:
                recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
                store.put(layout.OWNER, notes.owner_to_bytes(OwnerRecord(identity, recorded)), mode="create")
                return
            except WriteConflictError:  # another process recorded one first: compare with it
                found = read_owner(store)
    except ManifestError as exc:
        raise ConfigError(
            f"the local tier {store.root_url} has an owner record that cannot be read ({exc}), so whose "
            f"checkpoint copies it holds is unknown: {_FIX}, or delete {store.root_url} if no job needs them"
        ) from exc
    except ConfigError:
        raise
    except (StreamioError, OSError) as exc:
        log.warning("the local tier %s is not used by this job (%s): saves go to the root %s only and restores "
                    "read it", store.root_url, exc, durable.root_url)
        return
    if found is not None and found.root != identity:
        raise ConfigError(
            f"the local tier {store.root_url} holds the checkpoint copies of {found.root}, not of {identity} (this "
            f"manager's root): {_FIX}, or delete {store.root_url} if {found.root} needs them no more"
        )


def _check_unowned(store: Store, durable: Store, identity: str) -> None:
    """Raise unless the local root ``store``, which records no owner, is empty or holds a save that
    ``durable`` holds too, with the same manifest bytes."""
    try:
        saves = root.committed_saves(store)
    except FileNotFoundError:  # no local root yet
        return
    for ref in reversed(saves):
        try:
            if root.manifest_digest(store, ref.path) == root.manifest_digest(durable, ref.path):
                log.info("the local tier %s records no owner; its save %s is in %s: it is this job's",
                         store.root_url, ref.path, identity)
                return
        except FileNotFoundError:  # not in the root (pruned there, never uploaded, another job's)
            continue
    if saves:
        steps = ", ".join(str(s.step) for s in saves[-5:])
        raise ConfigError(
            f"the local tier {store.root_url} holds {len(saves)} checkpoint copies (steps {steps}) that record no "
            f"owner (written by an older streamio) and none of them is in {identity}: they may be another job's. "
            f"{_FIX[0].upper()}{_FIX[1:]}, or delete {store.root_url} if no job needs them"
        )
