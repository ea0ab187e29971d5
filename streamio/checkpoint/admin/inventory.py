"""What ``streamio ckpt ls`` and ``inspect`` show: every save with its place and flags.

Each committed save of a root is listed with where it stands against the pointer's timeline
(:mod:`~..format.timeline`: ``current``, ``ahead``, ``abandoned``; ``unknown`` without a usable pointer
or a readable manifest), whether ``latest.json`` names it, and why a restore rejected it if one
did (``bad.json``). ``inspect`` adds the whole non-tensor state (:mod:`.describe`) and the
root's recorded retention policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamio.checkpoint.admin.describe import describe
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.timeline import Tip, classify
from streamio.checkpoint.root import (
    committed_saves,
    read_bad,
    read_manifest,
    read_manifests,
    read_pointer,
    read_retention,
    resolve_save,
)
from streamio.errors import CheckpointNotFoundError, StreamioError
from streamio.storage import Store

__all__ = ["default_step", "inspect_save", "list_saves", "manifest_fields"]


def _tip(store: Store) -> tuple[Tip | None, str | None]:
    """The pointer's tip and the save directory it names (``None``s without a usable pointer)."""
    try:
        pointer = read_pointer(store)
    except ManifestError:
        return None, None
    return (None, None) if pointer is None else (Tip(pointer.timeline, pointer.step), pointer.path)


def places(tip: Tip | None, manifests: Mapping[str, Manifest | StreamioError]) -> dict[str, str]:
    """Save directory -> ``"current"``, ``"ahead"``, ``"abandoned"`` (:mod:`~.format.timeline`), or
    ``"unknown"`` (no tip, or the manifest could not be read)."""
    out: dict[str, str] = {}
    for path, m in manifests.items():
        out[path] = classify(tip, m.line, m.step) if tip is not None and isinstance(m, Manifest) else "unknown"
    return out


def list_saves(store: Store) -> list[dict[str, Any]]:
    """One row per committed save, oldest first: ``step``, ``path``, ``latest``, ``place``,
    ``bad`` (the reason or ``None``) and, when its manifest reads, ``bytes``, ``files``,
    ``world_size``, ``created``, ``metrics``, ``timeline``; else ``error``."""
    tip, named = _tip(store)
    saves = committed_saves(store)
    manifests = read_manifests(store, saves)
    where = places(tip, manifests)
    rows = []
    for ref in saves:
        bad = read_bad(store, ref.path) if ref.bad else None
        row: dict[str, Any] = {"step": ref.step, "path": ref.path, "latest": ref.path == named,
                               "place": where[ref.path], "bad": bad.reason if bad else None}
        rows.append({**row, **manifest_fields(manifests[ref.path])})
    return rows


def manifest_fields(m: Manifest | StreamioError) -> dict[str, Any]:
    """What a ``ckpt ls`` row says of a save's manifest, or why it could not be read."""
    if not isinstance(m, Manifest):
        return {"error": str(m)}
    return {"bytes": m.total_bytes, "files": len(m.files), "world_size": m.world_size, "created": m.created,
            "metrics": dict(m.metrics), "timeline": m.line.id}


def default_step(store: Store) -> int:
    """The step ``inspect``/``verify`` look at without one: the pointer's, else the newest.

    Raises:
        CheckpointNotFoundError: no checkpoint under the root.
    """
    try:
        pointer = read_pointer(store)
    except ManifestError:
        pointer = None
    if pointer is not None:
        return pointer.step
    saves = committed_saves(store)
    if not saves:
        raise CheckpointNotFoundError(f"no checkpoint under {store.root_url}")
    return saves[-1].step


def inspect_save(store: Store, step: int | None) -> dict[str, Any]:
    """Everything ``inspect`` shows of the save of ``step`` (default: the pointer's); see
    :func:`~.describe.describe`.

    Raises:
        CheckpointNotFoundError: no such step (or no checkpoint at all).
        ManifestError: its manifest does not parse.
    """
    step = default_step(store) if step is None else step
    tip, _ = _tip(store)
    sdir = resolve_save(store, step)
    m = read_manifest(store, step, path=sdir)
    bad = read_bad(store, sdir)
    try:
        retention = read_retention(store).doc
    except (FileNotFoundError, ManifestError):
        retention = None
    place = classify(tip, m.line, m.step) if tip is not None else "unknown"
    return describe(m, path=sdir, place=place, bad=bad.reason if bad else None, retention=retention)
