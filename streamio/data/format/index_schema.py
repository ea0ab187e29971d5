"""Checks on what a stored ``index.json`` declares, before anything is read on its word.

An index is read back from storage that someone else can write, so, like the shards, it is
untrusted input. :func:`check_document` takes the parsed JSON (already size- and depth-limited by
:func:`streamio.limits.load_json`) and returns plain checked values, or raises
:class:`~streamio.errors.IndexFormatError` naming the field at fault:

* **numbers** (``bytes``, ``samples``, offsets, ``max_sample_bytes``) are integers in
  ``[0, 2**63)`` (not bools, floats or strings); a shard holds at most one sample per byte;
  offsets increase strictly inside their shard; CRC32C values fit 32 bits; the total matches.
* **paths** (shards and layout sidecars) are plain relative names below the dataset root
  (:func:`streamio.data.format.layout.shard_path_problem`), and no shard is named twice;
* **tokens** (optional, per shard): at most :data:`MAX_TOKEN_FIELDS` fields, each a plain member
  extension, each with one integer token count per sample in ``[0, MAX_DOCUMENT_TOKENS]``, and
  no more than the bytes that hold them can: a token takes at least :data:`TOKEN_BYTES` bytes, so
  a sample of ``N`` bytes (its span between offsets in a ``.tar``; its ``max_sample_bytes``, or
  the readers' default, decompressed in a ``.tar.zst``) holds at most ``N // TOKEN_BYTES`` tokens,
  and a shard at most its ``bytes // TOKEN_BYTES`` (``.tar``). A packing plan sized by a count is
  then sized by data that exists;
* **shards_url** (optional: the index lives apart from its shards) is an absolute
  ``scheme://...`` URL without userinfo; which stores it may point at is decided where the index
  is opened (:mod:`streamio.data.locate`), which knows where the index itself came from.

The rule for paths refuses what can leave the root on some backend (``..``, absolute paths,
schemes and drives, backslashes, control characters) and nothing else: foreign WebDataset shards
carry all sorts of names, so it is not an allow-list of characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from streamio.checksum import parse_checksum
from streamio.data.format.layout import MAX_SAMPLE_BYTES, shard_compression, shard_path_problem
from streamio.data.format.tokens import TOKEN_DTYPES
from streamio.errors import IndexFormatError
from streamio.limits import MAX_DOCUMENT_TOKENS
from streamio.storage.secrets import has_userinfo

MAX_INT = (1 << 63) - 1
MAX_URL = 2048
#: Most token fields one shard entry may declare.
MAX_TOKEN_FIELDS = 16
#: The fewest bytes one token takes (the narrowest token type, uint16).
TOKEN_BYTES = min(d.itemsize for d in TOKEN_DTYPES)

_ABSOLUTE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\x00-\x1f\x7f]*")


class ShardEntry(NamedTuple):
    """One checked entry of ``shards``: the layout inline (offsets, crcs) or in a sidecar."""

    path: str
    bytes: int
    samples: int
    checksum: str
    offsets: tuple[int, ...] | None
    crcs: tuple[int, ...] | None
    sidecar: tuple[str, str] | None  # (path, checksum)
    max_sample_bytes: int | None
    tokens: dict[str, tuple[int, ...]] | None = None  # field -> each sample's token count


class IndexDocument(NamedTuple):
    """The checked content of an ``index.json``."""

    shards: list[ShardEntry]
    samples: int
    keys: tuple[str, ...]
    compression: str | None
    shards_url: str | None = None


def bad(url: str, what: str) -> IndexFormatError:
    """The error for an invalid field of the index at ``url``."""
    return IndexFormatError(f"{url}: {what}; rebuild it with `streamio index {url.rsplit('/', 1)[0]}`")


def short(value: Any) -> str:
    """``repr(value)``, cut to a readable length for a message."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def integer(value: Any, url: str, what: str) -> int:
    """``value`` if it is an int in ``[0, 2**63)``, else :func:`bad`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise bad(url, f"{what} is {short(value)}, not an integer in [0, 2**63)")
    return value


def check_layout(offsets: Sequence[Any], crcs: Sequence[Any], *, samples: int, size: int, path: str, url: str) -> None:
    """``samples + 1`` integer offsets increasing within ``size`` bytes, ``samples`` 32-bit CRC32C."""
    if len(offsets) != samples + 1 or len(crcs) != samples:
        raise bad(url, f"shard {path!r} has {samples} samples but {len(offsets)} offsets and {len(crcs)} crc32c values")
    if not all(type(x) is int for x in offsets) or not all(type(c) is int and 0 <= c < 1 << 32 for c in crcs):
        raise bad(url, f"offsets / crc32c of shard {path!r} are not all 32/64-bit integers")
    increasing = all(b > a for a, b in zip(offsets, offsets[1:], strict=False))
    if offsets and (offsets[0] < 0 or offsets[-1] > size or not increasing):
        raise bad(url, f"offsets of shard {path!r} are not increasing within its {size} bytes")


def _path(value: Any, url: str, what: str) -> str:
    problem = shard_path_problem(value)
    if problem:
        raise bad(url, f"{what} is {short(value)}, not a plain relative name below the dataset: {problem}")
    return value  # type: ignore[no-any-return]


def _checksum(value: Any, url: str, what: str) -> str:
    try:
        parse_checksum(value)
    except (ValueError, TypeError, AttributeError):
        raise bad(url, f"{what} is {short(value)}, not 'crc32c:<8 hex digits>'") from None
    return value  # type: ignore[no-any-return]


class Room(NamedTuple):
    """The bytes that hold a shard's tokens: per sample (None: not known here), and in all (None: no bound)."""

    samples: Sequence[int] | None
    total: int | None


def token_room(
    path: str, size: int, samples: int, offsets: Sequence[int] | None, biggest: int | None
) -> Room:
    """The :class:`Room` of a shard: a ``.tar`` sample spans its offsets and the shard its ``size``; a
    ``.tar.zst`` sample decompresses to at most ``biggest`` bytes (else :data:`MAX_SAMPLE_BYTES`)."""
    if shard_compression(path) is not None:
        return Room([biggest or MAX_SAMPLE_BYTES] * samples, None)
    spans = None if offsets is None else [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    return Room(spans, size)


def check_tokens(value: Any, *, samples: int, path: str, url: str, room: Room) -> dict[str, tuple[int, ...]]:
    """A shard's ``tokens``: ``{field: [one count per sample]}``, every count in ``[0, MAX_DOCUMENT_TOKENS]``
    and no more than ``room`` holds (:data:`TOKEN_BYTES` bytes a token)."""
    if not isinstance(value, dict) or len(value) > MAX_TOKEN_FIELDS:
        what = f"not an object of at most {MAX_TOKEN_FIELDS} fields"
        raise bad(url, f"'tokens' of shard {path!r} is {short(value)}, {what}")
    out = {}
    for ext, counts in value.items():
        if not ext or len(ext) > 255 or "/" in ext or not ext.isprintable():
            raise bad(url, f"'tokens' of shard {path!r} names the field {short(ext)}, not a member extension")
        if not isinstance(counts, list) or len(counts) != samples:
            got = len(counts) if isinstance(counts, list) else short(counts)
            raise bad(url, f"'tokens' {ext!r} of shard {path!r} has {got} counts for {samples} samples")
        for j, c in enumerate(counts):
            if type(c) is not int or not 0 <= c <= MAX_DOCUMENT_TOKENS:
                raise bad(
                    url, f"shard {path!r} sample {j}: token count {short(c)} of {ext!r} is not an integer in "
                    f"[0, {MAX_DOCUMENT_TOKENS}]"
                )
        check_room(counts, room, ext=ext, path=path, url=url)
        out[ext] = tuple(counts)
    return out


def check_room(counts: Sequence[int], room: Room, *, ext: str, path: str, url: str) -> None:
    """A shard's token ``counts`` of field ``ext``, each and summed, within ``room`` (:data:`TOKEN_BYTES` a token).

    Also what a layout read later from a sidecar is checked with (the sample spans were unknown
    when the index was parsed).
    """
    where = "the sample spans" if room.total is not None else "the sample decompresses to at most"
    for j, (c, held) in enumerate(zip(counts, room.samples or (), strict=False)):
        if c * TOKEN_BYTES > held:
            raise bad(
                url, f"shard {path!r} sample {j}: token count {c} of {ext!r} needs at least {c * TOKEN_BYTES} "
                f"bytes ({TOKEN_BYTES} a token), but {where} {held} bytes"
            )
    total = sum(counts)
    if room.total is not None and total * TOKEN_BYTES > room.total:
        raise bad(
            url, f"the token counts of {ext!r} of shard {path!r} add up to {total}, which need at least "
            f"{total * TOKEN_BYTES} bytes ({TOKEN_BYTES} a token), but the shard holds {room.total} bytes"
        )


def check_entry(i: int, entry: Any, url: str) -> ShardEntry:
    """Entry ``i`` of ``shards``, checked."""
    if not isinstance(entry, dict):
        raise bad(url, f"shard {i} is not an object")
    path = _path(entry.get("path"), url, f"the path of shard {i}")
    checksum = _checksum(entry.get("checksum"), url, f"the checksum of shard {path!r}")
    size = integer(entry.get("bytes"), url, f"'bytes' of shard {path!r}")
    samples = integer(entry.get("samples"), url, f"'samples' of shard {path!r}")
    if samples > size:
        raise bad(url, f"'samples' of shard {path!r} is {samples}, more than its {size} bytes can hold")
    biggest = entry.get("max_sample_bytes")
    if biggest is not None:
        biggest = integer(biggest, url, f"'max_sample_bytes' of shard {path!r}")
    offsets = crcs = None
    if "offsets" in entry:
        offsets, crcs = entry.get("offsets"), entry.get("crc32c")
        if not isinstance(offsets, list) or not isinstance(crcs, list):
            raise bad(url, f"shard {path!r} has 'offsets' without a 'crc32c' list")
        check_layout(offsets, crcs, samples=samples, size=size, path=path, url=url)
    tokens = None
    if "tokens" in entry:
        room = token_room(path, size, samples, offsets, biggest)
        tokens = check_tokens(entry["tokens"], samples=samples, path=path, url=url, room=room)
    if offsets is not None and crcs is not None:
        return ShardEntry(path, size, samples, checksum, tuple(offsets), tuple(crcs), None, biggest, tokens)
    sidecar = None
    if "layout" in entry:
        lpath = _path(entry.get("layout"), url, f"'layout' of shard {path!r}")
        sidecar = (lpath, _checksum(entry.get("layout_checksum"), url, f"'layout_checksum' of shard {path!r}"))
    return ShardEntry(path, size, samples, checksum, None, None, sidecar, biggest, tokens)


def check_document(doc: Any, url: str, *, fmt: str) -> IndexDocument:
    """Every field of a parsed ``index.json`` of format ``fmt``, checked."""
    if not isinstance(doc, dict):
        raise bad(url, "is not a JSON object")
    if doc.get("format") != fmt:
        raise IndexFormatError(
            f"{url} has format {short(doc.get('format'))}; this streamio reads {fmt!r}. "
            f"Upgrade streamio if it was written by a newer one, or rebuild it with `streamio index`."
        )
    raw = doc.get("shards")
    if not isinstance(raw, list):
        raise bad(url, "'shards' is not a list")
    entries: list[ShardEntry] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        entry = check_entry(i, item, url)
        if entry.path in seen:
            raise bad(url, f"shard path {entry.path!r} appears more than once")
        seen.add(entry.path)
        entries.append(entry)
    total = integer(doc.get("samples"), url, "'samples'")
    if total != sum(e.samples for e in entries):
        raise bad(url, f"'samples' is {total} but the shards hold {sum(e.samples for e in entries)}")
    keys = doc.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise bad(url, "'keys' is not a list of strings")
    compression = doc.get("compression")
    if compression not in (None, "zstd", "mixed"):
        raise bad(url, f"'compression' is {short(compression)}")
    located = doc.get("shards_url")
    located = None if located is None else shards_url(located, url)
    return IndexDocument(entries, total, tuple(keys), compression, located)


def shards_url(value: Any, url: str) -> str:
    """``value`` if it is an absolute URL (``scheme://...``) without userinfo, spaces or control characters."""
    if not isinstance(value, str) or len(value) > MAX_URL or not _ABSOLUTE_URL.fullmatch(value):
        raise bad(url, f"'shards_url' is {short(value)}, not an absolute URL such as 's3://bucket/prefix'")
    if has_userinfo(value):
        raise bad(url, "'shards_url' holds a user name or password; an index never records credentials")
    return value
