"""What a checkpoint root holds: committed steps, verified manifests, the pointer; deleting a step.

The few reads and the one delete that the commit protocol (:mod:`.commit`), the restore walk
(:mod:`.restore`) and the CLI's maintenance verbs (:mod:`.admin`) share. Each reads storage
fresh (a listing or a GET), never a cached view: another job, or an earlier run of this one, may
have written the root since.

A step is *committed* iff its ``manifest.json`` exists; the pointer (``latest.json``) names the
current one. Deleting a step removes its manifest first, so a half-deleted step is never taken
for a complete one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from streamio.checkpoint import layout
from streamio.checkpoint import manifest as mf
from streamio.checkpoint.records import Manifest
from streamio.checkpoint.validate import ManifestError
from streamio.errors import CheckpointNotFoundError
from streamio.storage import Store

__all__ = ["PhaseHook", "committed_steps", "delete_step", "detect_foreign", "pointed_step", "read_manifest"]

log = logging.getLogger(__name__)

PhaseHook = Callable[[str], None]
"""Called with the name of each commit phase as it completes (see :mod:`.commit`)."""

_FOREIGN = {
    ".metadata": "a torch.distributed.checkpoint directory: load it with torch.distributed.checkpoint",
    ".pt": "a torch.save file: load it with torch.load(weights_only=True)",
    ".pth": "a torch.save file: load it with torch.load(weights_only=True)",
    ".ckpt": "a Lightning/torch.save checkpoint: load it with its own tool",
    ".safetensors": "a safetensors file: load it with safetensors",
    "latest": "a DeepSpeed checkpoint directory: load it with DeepSpeed",
}


def committed_steps(store: Store) -> list[int]:
    """Steps under ``store`` that have a manifest, oldest first (one fresh listing)."""
    steps = set()
    for o in store.list():
        head, _, tail = o.path.partition("/")
        if tail == layout.MANIFEST:
            s = layout.parse_step_dir(head)
            if s is not None:
                steps.add(s)
    return sorted(steps)


def read_manifest(store: Store, step: int, *, checksum: str | None = None) -> Manifest:
    """Read, verify and parse ``step``'s manifest.

    Args:
        checksum: what ``latest.json`` recorded for this manifest, when it names ``step``.

    Raises:
        CheckpointNotFoundError: no manifest (the step was never committed or was deleted).
        ManifestError: (a :class:`CheckpointFormatError`) an unknown format version
            (``unknown_version``), or a manifest that is invalid, claims another step, names a
            path outside its step directory, or does not match its own or ``checksum``.
    """
    path = layout.manifest_path(step)
    try:
        data = store.read(path)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"{store.url(path)} does not exist: step {step} was never committed or was deleted"
        ) from exc
    try:
        return mf.manifest_from_bytes(data, step=step, checksum=checksum)
    except ManifestError as exc:
        prefix = f"{store.url(path)}:" if exc.unknown_version else f"{store.url(path)} is unusable:"
        raise ManifestError(f"{prefix} {exc}", unknown_version=exc.unknown_version) from exc


def pointed_step(store: Store) -> int | None:
    """The step ``latest.json`` names (read fresh), or ``None`` if there is no valid pointer."""
    try:
        return mf.pointer_from_bytes(store.read(layout.LATEST)).step
    except FileNotFoundError:
        return None
    except ManifestError as exc:
        log.warning("%s is unusable: %s", store.url(layout.LATEST), exc)
        return None


def delete_step(store: Store, step: int, *, on_phase: PhaseHook | None = None) -> None:
    """Delete a checkpoint: its manifest first (so it is never seen half-deleted), then the rest.

    Args:
        on_phase: called with ``"delete"`` between the manifest and the rest (a test hook).
    """
    sdir = layout.step_dir(step)
    store.delete(layout.manifest_path(step))
    if on_phase is not None:
        on_phase("delete")
    for o in store.list(sdir + "/"):
        store.delete(o.path)


def detect_foreign(store: Store) -> str | None:
    """What another tool's checkpoint under ``store`` looks like, or ``None``."""
    url = store.root_url.lower()
    for suffix, what in _FOREIGN.items():
        if suffix.startswith(".") and url.endswith(suffix):
            return what
    try:
        listing = store.list()
    except FileNotFoundError:
        return None
    for o in listing:
        name = o.path.rsplit("/", 1)[-1]
        for suffix, what in _FOREIGN.items():
            if name == suffix or (suffix.startswith(".") and name.endswith(suffix)):
                return what
    return None
