"""The small notes beside a root's checkpoints: bad saves, the retention policy, a local root's owner (PURE).

* ``<save dir>/bad.json`` (:class:`BadRecord`): a restore rejected this save (a part that does
  not verify, a damaged manifest) and walked back past it. Written by rank 0 of the restoring
  job, it lives and dies with the save: ``streamio ckpt ls`` flags the save, later restores skip
  it without reading its parts, and retention and ``streamio ckpt gc`` delete it (unless
  ``latest.json`` still names it: then the next save supersedes it, or ``streamio ckpt rm
  --force`` moves the pointer back first).
* ``ROOT/retention.json`` (:class:`RetentionRecord`): the retention policy the root's last
  saving job applied (:func:`~.retention.policy_to_json`), so that a job opened without
  ``retention=`` applies the same one instead of the library default.

Both are read back from storage others can write: bounded, every field checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamio.checkpoint.format import checks
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.retention import RetentionPolicy, policy_from_json, policy_to_json
from streamio.limits import MAX_JSON_DEPTH, load_json

__all__ = ["BadRecord", "OwnerRecord", "RetentionRecord", "bad_from_bytes", "bad_to_bytes", "owner_from_bytes",
           "owner_to_bytes", "retention_from_bytes", "retention_to_bytes"]

BAD_FORMAT = "streamio.checkpoint.bad/1"
RETENTION_FORMAT = "streamio.checkpoint.retention/1"
OWNER_FORMAT = "streamio.checkpoint.owner/1"
#: the most a root record (``retention.json``, ``bad.json``) may be
MAX_RECORD_BYTES = 64 << 10
_MAX_REASON = 2000
_MAX_ROOT = 4096


@dataclass(frozen=True)
class BadRecord:
    """Why a restore rejected a save.

    Attributes:
        step: the save's step.
        reason: the error the restore walked back past (cut to 2000 characters).
        recorded: ISO-8601 UTC time it was recorded.
    """

    step: int
    reason: str
    recorded: str = ""


@dataclass(frozen=True)
class RetentionRecord:
    """The retention policy recorded in a root.

    Attributes:
        policy: the policy, or ``None`` for one of the user's own (``custom``) that cannot be
            rebuilt from JSON.
        doc: its JSON form, as recorded (what is compared to decide whether it changed).
        recorded: ISO-8601 UTC time it was recorded.
    """

    policy: RetentionPolicy | None
    doc: dict[str, Any]
    recorded: str = ""


@dataclass(frozen=True)
class OwnerRecord:
    """Whose copies a local root holds.

    Attributes:
        root: the identity of the durable root (:func:`~..owner.root_identity`).
        recorded: ISO-8601 UTC time it was recorded.
    """

    root: str
    recorded: str = ""


def bad_to_bytes(r: BadRecord) -> bytes:
    doc = {"format": BAD_FORMAT, "step": r.step, "reason": r.reason[:_MAX_REASON], "recorded": r.recorded}
    return json.dumps(doc, separators=(",", ":")).encode()


def bad_from_bytes(data: bytes, what: str) -> BadRecord:
    """Parse a bad-save record; :class:`ManifestError` if it is not one."""
    doc = _load(data, what, BAD_FORMAT)
    return BadRecord(step=checks.integer(doc, "step", what), reason=checks.string(doc, "reason", what)[:_MAX_REASON],
                     recorded=checks.string(doc, "recorded", what) if "recorded" in doc else "")


def retention_to_bytes(policy: RetentionPolicy, recorded: str) -> bytes:
    doc = {"format": RETENTION_FORMAT, "policy": policy_to_json(policy), "recorded": recorded}
    return json.dumps(doc, separators=(",", ":")).encode()


def retention_from_bytes(data: bytes, what: str) -> RetentionRecord:
    """Parse ``retention.json``; :class:`ManifestError` if it is not a valid policy record."""
    doc = _load(data, what, RETENTION_FORMAT)
    raw = doc.get("policy")
    try:
        policy = policy_from_json(raw)
    except ValueError as exc:
        raise ManifestError(f"{what}: {exc}") from exc
    recorded = checks.string(doc, "recorded", what) if "recorded" in doc else ""
    return RetentionRecord(policy, raw, recorded)


def owner_to_bytes(r: OwnerRecord) -> bytes:
    doc = {"format": OWNER_FORMAT, "root": r.root, "recorded": r.recorded}
    return json.dumps(doc, separators=(",", ":")).encode()


def owner_from_bytes(data: bytes, what: str) -> OwnerRecord:
    """Parse ``owner.json``; :class:`ManifestError` if it is not an owner record."""
    doc = _load(data, what, OWNER_FORMAT)
    root = checks.string(doc, "root", what)
    if not root or len(root) > _MAX_ROOT:
        raise ManifestError(f"{what}: root must be 1..{_MAX_ROOT} characters, got {len(root)}")
    return OwnerRecord(root, checks.string(doc, "recorded", what) if "recorded" in doc else "")


def _load(data: bytes, what: str, fmt: str) -> dict[str, Any]:
    doc = load_json(data, what=what, error=ManifestError, max_bytes=MAX_RECORD_BYTES, max_depth=MAX_JSON_DEPTH)
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(doc).__name__}")
    found = doc.get("format")
    if found != fmt:
        newer = isinstance(found, str) and found.startswith(fmt.rsplit("/", 1)[0] + "/")
        hint = "upgrade streamio to read it" if newer else "not written by streamio"
        raise ManifestError(f"{what} has format {checks.short(found)}, not {fmt!r}: {hint}", unknown_version=True)
    return doc
