"""Which saves are on which tier: ``streamio ckpt ls ROOT --local DIR``.

A local tier (:class:`~streamio.checkpoint.LocalTier`) keeps one checkpoint root per rank below
its directory (``rank-00003/``), with the same layout and documents as the durable root, and a save
keeps its save directory on both (docs/design.md "Local tier"). So a save is named by its
directory on every tier, and :func:`list_tiers` puts the two listings side by side: the root's
rows (:func:`~.inventory.list_saves`) each with ``tier`` ``"durable"`` or ``"both"``, plus one row
per save only the local tier holds (``"local"``), each with the ranks whose copy it is. Only the
local roots that record the root as their owner are listed (:mod:`~..owner`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from streamio.checkpoint import owner
from streamio.checkpoint.admin.inventory import list_saves, manifest_fields
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.options import LocalTier
from streamio.checkpoint.root import committed_saves, read_manifest, read_pointer
from streamio.errors import ConfigError, StreamioError
from streamio.storage import Store

__all__ = ["list_tiers", "local_roots"]

_RANK_DIR = re.compile(r"rank-(\d{5})")


def local_roots(tier: LocalTier) -> dict[int, Store]:
    """Rank -> the local root of its copies found under ``tier.path`` (this node's ranks).

    Raises:
        ConfigError: ``tier.path`` is not a directory, or holds no ``rank-NNNNN`` root.
    """
    path = tier.path.removeprefix("file://")
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise ConfigError(f"the local tier {tier.path!r} cannot be listed: {exc.strerror or exc}") from exc
    ranks = sorted(int(m.group(1)) for n in names if (m := _RANK_DIR.fullmatch(n)))
    if not ranks:
        raise ConfigError(f"{tier.path!r} holds no local checkpoint copies (rank-NNNNN directories "
                          f"written by LocalTier): is it the directory given to LocalTier?")
    return {rank: Store(tier.rank_root(rank)) for rank in ranks}


def list_tiers(store: Store, tier: LocalTier) -> list[dict[str, Any]]:
    """The root's saves and the local tier's, one row per save directory, by step.

    Rows are :func:`~.inventory.list_saves`' with ``tier`` (``"durable"``, ``"local"`` or
    ``"both"``), ``local_ranks`` (the ranks holding a committed local copy) and ``local_latest``
    (a rank's local pointer names it). A save only the local tier holds has ``place`` ``"local"``
    and ``latest`` false (the root's pointer cannot name it).
    """
    copies = _local_copies(tier, owner.root_identity(store.root_url))
    rows = list_saves(store)
    for row in rows:
        held = copies.pop(row["path"], None)
        row.update(tier="both" if held else "durable", local_ranks=held["ranks"] if held else [],
                   local_latest=bool(held and held["latest"]))
    for path, held in copies.items():
        rows.append({"step": held["step"], "path": path, "latest": False, "place": "local", "bad": None,
                     "tier": "local", "local_ranks": held["ranks"], "local_latest": held["latest"],
                     **manifest_fields(held["manifest"])})
    return sorted(rows, key=lambda r: (r["step"], r.get("created") or "", r["path"]))


def _local_copies(tier: LocalTier, identity: str) -> dict[str, dict[str, Any]]:
    """Save directory -> ``step``, ``ranks``, ``latest`` and one rank's ``manifest`` (or its error),
    of the local roots that record ``identity`` as their owner.

    Raises:
        ConfigError: none of the tier's local roots records ``identity`` as its owner.
    """
    found: dict[str, dict[str, Any]] = {}
    roots = local_roots(tier)
    mine = {rank: local for rank, local in roots.items() if owner.owns(local, identity)}
    if not mine:
        raise ConfigError(_not_mine(tier, identity, next(iter(roots.values()))))
    for rank, local in mine.items():
        try:
            pointer = read_pointer(local)
            saves = committed_saves(local)
        except (StreamioError, OSError):
            continue  # an unreadable copy is no copy: restore falls back to the root for it too
        for ref in saves:
            entry = found.setdefault(ref.path, {"step": ref.step, "ranks": [], "latest": False, "manifest": None})
            entry["ranks"].append(rank)
            entry["latest"] = entry["latest"] or (pointer is not None and pointer.path == ref.path)
            if entry["manifest"] is None or not isinstance(entry["manifest"], Manifest):
                entry["manifest"] = _manifest(local, ref.step, ref.path)
    return found


def _not_mine(tier: LocalTier, identity: str, local: Store) -> str:
    """Why no local root of ``tier`` is shown: whose it is, as its first local root (``local``) says."""
    try:
        record = owner.read_owner(local)
        whose = "record no owner (written by an older streamio)" if record is None else f"are {record.root}'s"
    except (StreamioError, OSError) as exc:
        whose = f"have an owner that cannot be read ({exc})"
    return (f"the local copies under {tier.path!r} {whose}, not {identity}'s: `streamio ckpt ls` lists a tier "
            f"with the root that wrote it")


def _manifest(local: Store, step: int, path: str) -> Manifest | StreamioError:
    try:
        return read_manifest(local, step, path=path)
    except StreamioError as exc:
        return exc
