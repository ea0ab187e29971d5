"""Checks on what a stored checkpoint document declares (PURE: no torch, fsspec or storage).

A manifest, a done marker and ``latest.json`` are read back from storage that someone else can
write, so nothing they declare is trusted before it is checked here, at parse time, before any
object is read on their word:

* **paths** are plain relative names below the step directory: ``/``-separated segments of
  ``[A-Za-z0-9._-]``, none empty, ``.`` or ``..``. That refuses ``../../x``, ``/etc/hostname``,
  ``s3://other/x``, ``a\\..\\b``, NUL bytes and ``%``-escapes on every backend alike (a rule on
  characters, not a normalisation that one backend might undo);
* **numbers** are non-negative integers below 2**63 (a size, an offset), **checksums** have the
  one format streamio writes, **save ids** are short names (they become part of paths);
* **streams** are consistent: each rank's parts cover ``[0, total)`` of its byte stream one after
  another without gap or overlap, every tensor lies inside its rank's stream and no two tensors
  share a byte of it (a writer lays them out one after another), no path twice.
  The sizes a reader allocates for (a part's ``raw_size``) are therefore the ones the
  manifest accounts for, never what a zstd frame header claims.

The manifest also *seals* itself: its last field is the CRC32C of every byte before that field
(:func:`seal`, :func:`unseal`). ``latest.json`` records the checksum of the whole manifest it
names; the seal covers the manifest of any other step too (the ones a restore walks back to),
so the JSON half of a checkpoint (hyper-parameters, counters, RNG states, data position) is
always verified before it is loaded. Both are integrity checks against damage and careless
edits, not signatures: whoever can write the root can write a consistent checkpoint.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointFormatError

MAX_INT = (1 << 63) - 1
MAX_PATH_CHARS = 1024
SEAL_KEY = "checksum"

_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]{1,255}")
_CHECKSUM_RE = re.compile(r"crc32c:[0-9a-f]{8}")
_SAVE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ManifestError(CheckpointFormatError):
    """A manifest, marker or pointer document is invalid; ``unknown_version`` says why.

    ``unknown_version`` is set when the document is well formed but of a format this streamio
    does not read (newer, or another tool's): restore stops there instead of walking back past
    a checkpoint it merely cannot read.
    """

    def __init__(self, message: str, *, unknown_version: bool = False) -> None:
        super().__init__(message)
        self.unknown_version = unknown_version


def relative_path(value: Any, what: str) -> str:
    """``value`` if it is a plain relative name below its directory, else :class:`ManifestError`.

    Args:
        value: the path as the document holds it.
        what: names the document and field in the message (e.g. ``"manifest of step 2, file 0"``).
    """
    if not isinstance(value, str):
        raise ManifestError(f"{what}: path must be a string, got {type(value).__name__}")
    problem = None
    if not value or len(value) > MAX_PATH_CHARS:
        problem = f"its length {len(value)} is outside 1..{MAX_PATH_CHARS}"
    elif value.startswith("/"):
        problem = "it is absolute"
    else:
        for segment in value.split("/"):
            if segment in ("", ".", ".."):
                problem = f"it has a {segment!r} segment" if segment else "it has an empty segment"
                break
            if not _SEGMENT_RE.fullmatch(segment):
                problem = f"segment {short(segment)} has a character outside [A-Za-z0-9._-] (scheme, backslash ...)"
                break
    if problem:
        raise ManifestError(
            f"{what}: path {short(value)} is not a plain relative name below the step directory: {problem}"
        )
    return value


def integer(d: Mapping[str, Any], key: str, what: str) -> int:
    """``d[key]`` if it is an int in ``[0, 2**63)``, else :class:`ManifestError`."""
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_INT:
        raise ManifestError(f"{what}: field {key!r} must be an integer in [0, 2**63), got {short(v)}")
    return v


def string(d: Mapping[str, Any], key: str, what: str) -> str:
    """``d[key]`` if it is a string, else :class:`ManifestError`."""
    v = d.get(key)
    if not isinstance(v, str):
        raise ManifestError(f"{what}: field {key!r} must be a string, got {short(v)}")
    return v


def checksum(d: Mapping[str, Any], key: str, what: str) -> str:
    """``d[key]`` if it is a checksum as streamio writes them (``crc32c:`` + 8 hex digits)."""
    v = string(d, key, what)
    if not _CHECKSUM_RE.fullmatch(v):
        raise ManifestError(f"{what}: field {key!r} must be 'crc32c:<8 hex digits>', got {short(v)}")
    return v


def save_id(d: Mapping[str, Any], key: str, what: str, *, optional: bool = False) -> str:
    """``d[key]`` if it is a save id (it becomes part of part and marker names); ``optional``:
    absent or ``""`` is allowed (pointers written before they carried one)."""
    v = d.get(key, "") if optional else string(d, key, what)
    if optional and v == "":
        return ""
    if not isinstance(v, str) or not _SAVE_ID_RE.fullmatch(v):
        raise ManifestError(f"{what}: field {key!r} must be 1-64 characters of [A-Za-z0-9_-], got {short(v)}")
    return v


def mapping(d: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    """``d[key]`` as a dict (absent or null: empty), else :class:`ManifestError`."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ManifestError(f"{what}: field {key!r} must be an object, got {type(v).__name__}")
    return v


def streams(
    files: Iterable[Any], tensors: Iterable[tuple[str, Any]], *, world_size: int, what: str
) -> None:
    """Check that parts and tensors describe consistent per-rank byte streams.

    Args:
        files: :class:`~.entries.FileEntry` objects (``path``, ``rank``, ``start``, ``raw_size``).
        tensors: ``(key, TensorEntry)`` pairs (``rank``, ``offset``, ``nbytes``).
        world_size: ranks are ``0 .. world_size - 1``.
        what: names the document in messages.
    """
    files, tensors = list(files), list(tensors)
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise ManifestError(f"{what}: file {f.path!r} is listed twice")
        seen.add(f.path)
        if f.rank >= world_size:
            raise ManifestError(f"{what}: file {f.path!r} belongs to rank {f.rank}, but the world size is {world_size}")
    ends: dict[int, int] = {}
    for f in sorted(files, key=lambda f: (f.rank, f.start)):
        expected = ends.get(f.rank, 0)
        if f.start != expected:
            raise ManifestError(
                f"{what}: file {f.path!r} starts at byte {f.start} of rank {f.rank}'s stream, expected {expected} "
                f"(parts must follow one another without gap or overlap)"
            )
        ends[f.rank] = f.start + f.raw_size
    for key, t in tensors:
        if t.rank >= world_size:
            raise ManifestError(
                f"{what}: tensor {key!r} lives in rank {t.rank}'s stream, but the world size is {world_size}"
            )
        end = t.offset + t.nbytes
        if t.nbytes and end > ends.get(t.rank, 0):
            raise ManifestError(
                f"{what}: tensor {key!r} spans bytes [{t.offset}, {end}) of rank {t.rank}'s stream, "
                f"but its parts hold {ends.get(t.rank, 0)} bytes"
            )
    _disjoint(tensors, what)


def _disjoint(tensors: list[tuple[str, Any]], what: str) -> None:
    """No two tensors share a byte of a rank's stream (sorted by start, a neighbour would)."""
    spans = sorted((t.rank, t.offset, t.offset + t.nbytes, key) for key, t in tensors if t.nbytes)
    for (rank, _, end, first), (rank2, start, end2, second) in itertools.pairwise(spans):
        if rank == rank2 and start < end:
            raise ManifestError(
                f"{what}: tensor {second!r} at bytes [{start}, {end2}) of rank {rank}'s stream overlaps tensor "
                f"{first!r}, which ends at byte {end}"
            )


def seal(body: bytes) -> bytes:
    """``body`` (a JSON object) with a last field holding the CRC32C of everything before it."""
    if not body.endswith(b"}") or body == b"{}":
        raise ValueError("seal() takes a non-empty JSON object")
    head = body[:-1]
    return head + f',"{SEAL_KEY}":"{checksum_bytes(head)}"}}'.encode()


def unseal(data: bytes, doc: Mapping[str, Any], what: str) -> str:
    """Verify the seal of a parsed, sealed document; returns it, ``""`` if there is none.

    Raises:
        ManifestError: the seal is malformed, not the last field as written, or does not match.
    """
    if SEAL_KEY not in doc:
        return ""
    value = checksum(doc, SEAL_KEY, what)
    suffix = f',"{SEAL_KEY}":"{value}"}}'.encode()
    if not data.endswith(suffix):
        raise ManifestError(
            f"{what}: its {SEAL_KEY!r} field is not the last bytes as streamio writes them: "
            f"the document was rewritten after commit"
        )
    got = checksum_bytes(data[: -len(suffix)])
    if got != value:
        raise ManifestError(f"{what} has checksum {got}, but records {value}: it was modified or damaged after commit")
    return value


def short(v: Any) -> str:
    """``repr(v)`` cut to 80 characters (a hostile document's value in a message)."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."
