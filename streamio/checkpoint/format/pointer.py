"""``latest.json``, the pointer: its name, its record and its JSON, to and from bytes (PURE).

The pointer is the only mutable object of a checkpoint root: it names the current checkpoint (its
step, save directory and the checksum of its manifest) and the current timeline (:mod:`.timeline`).
It is replaced last, in one conditional PUT, so at every instant it names a complete checkpoint
(docs/design.md "Commit protocol"). This module owns its format; the one module that reads,
writes or deletes it in a root is :mod:`streamio.checkpoint.root` (a test checks that no other
module names it).

Format 2 (docs/checkpoint-lifecycle.md) adds the ``timeline`` and a ``path`` that may name a
suffixed save directory (:func:`~.layout.save_dir`); a format-1 pointer is still read (its
timeline is ``""``), a newer one is refused with "upgrade streamio". Read back from storage that
others can write: bounded (:data:`MAX_POINTER_BYTES`), every field checked (:mod:`.checks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from streamio.checkpoint.format import checks
from streamio.checkpoint.format import entries as ent
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.layout import save_dir, step_dir
from streamio.checkpoint.format.timeline import Timeline, timeline_from_json, timeline_to_json

__all__ = ["LATEST", "MAX_POINTER_BYTES", "POINTER_FORMAT", "Pointer", "pointer_from_bytes", "pointer_to_bytes"]

LATEST = "latest.json"
"""The pointer's name, below the root."""

POINTER_FORMAT = "streamio.checkpoint.latest/2"
_POINTER_FORMAT_V1 = "streamio.checkpoint.latest/1"
_POINTER_FAMILY = "streamio.checkpoint.latest/"
#: the most ``latest.json`` may be (a pointer is a few hundred bytes; its timeline, a few KiB)
MAX_POINTER_BYTES = 64 << 10


@dataclass(frozen=True)
class Pointer:
    """``latest.json``: which checkpoint is current, and the timeline it is on.

    Attributes:
        step: the step of the current checkpoint.
        path: its save directory (:func:`~.layout.save_dir`).
        manifest_checksum: the checksum of its manifest's bytes.
        save_id: the id of the save that wrote it.
        created: ISO-8601 UTC time of the commit.
        timeline: the current timeline (the checkpoint's, with its whole history), so the
            pointer alone says which saves are current even when that manifest is damaged.
    """

    step: int
    path: str
    manifest_checksum: str
    save_id: str
    created: str = ""
    timeline: Timeline = field(default_factory=Timeline)


def pointer_to_bytes(p: Pointer) -> bytes:
    doc = {"format": POINTER_FORMAT, "step": p.step, "path": p.path, "manifest_checksum": p.manifest_checksum,
           "save_id": p.save_id, "created": p.created, "timeline": timeline_to_json(p.timeline)}
    return json.dumps(doc, separators=(",", ":")).encode()


def pointer_from_bytes(data: bytes) -> Pointer:
    """Parse and validate ``latest.json`` (format 1 or 2).

    ``path`` must be the step's directory, or (format 2) that directory suffixed with the
    pointer's save id; a format-1 pointer is on the timeline ``""``.

    Raises:
        ManifestError: it is not a valid pointer (``unknown_version``: a newer format).
    """
    what = LATEST
    doc = ent.load_doc(data, what, max_bytes=MAX_POINTER_BYTES)
    fmt = ent.check_format(doc, (POINTER_FORMAT, _POINTER_FORMAT_V1), _POINTER_FAMILY, what)
    step = checks.integer(doc, "step", what)
    path = checks.string(doc, "path", what)
    save_id = checks.save_id(doc, "save_id", what, optional=True)
    allowed = [step_dir(step)] + ([save_dir(step, save_id)] if fmt == POINTER_FORMAT and save_id else [])
    if path not in allowed:
        raise ManifestError(
            f"{what} names path {checks.short(path)} for step {step}; expected {' or '.join(map(repr, allowed))}"
        )
    timeline = timeline_from_json(doc.get("timeline"), what) if fmt == POINTER_FORMAT else Timeline()
    return Pointer(step=step, path=path, manifest_checksum=checks.checksum(doc, "manifest_checksum", what),
                   save_id=save_id, created=ent.optional_str(doc, "created", what), timeline=timeline)
