"""Strict parsing of the tar header fields and pax records the shard reader uses, and its limits.

A shard is untrusted input, and Python's ``int()`` is the wrong parser for it: it accepts a sign
(``-0001000`` moved the reader *backwards*, so a shard looped for ever), ``_`` between digits,
surrounding whitespace, and raises a bare ``ValueError`` (or, past 4,300 digits, a different
one) on anything else. Here every number is matched against exactly the grammar the format
allows before it is converted, and every failure is a :class:`~streamio.errors.ShardFormatError`
naming the shard and the byte offset of the header at fault:

* **size** (12 bytes): octal digits, optionally padded with spaces and ended by NUL or space (as
  ``tarfile`` reads it; an empty field is 0), or GNU base-256 (first byte ``0x80``, the number in
  the other 11 bytes). A negative base-256 number (``0xff``) and any other high-bit byte are
  refused.
* **checksum** (8 bytes): the same octal grammar; unsigned and signed sums are both accepted.
* **pax records** (``"<length> <key>=<value>\\n"``): the length is 1-19 ASCII digits and must cover
  at least its own digits, the space, a key, ``=`` and the newline, end inside the data and on a
  newline, so every record moves the parser forward and the loop ends in time linear in the
  data. NUL padding after the last record is accepted (tarfile does the same). A pax ``size`` is
  1-19 decimal digits.

Fields the reader does not use (mode, owner, mtime, device numbers) are not interpreted, so a
shard whose writer filled them oddly still reads.

Limits (sizes are checked against them *before* anything is read on their word):

* :data:`MAX_META_BYTES`: pax extended headers, GNU long names and long link names together, per
  member (1 MiB, the bound Go's ``archive/tar`` uses for the same records).
* :data:`streamio.data.format.layout.MAX_SAMPLE_BYTES`: the largest sample a reader accepts when no
  index declares sizes (scanning foreign shards with ``streamio index``, reading them without an
  index as ``streamio shard`` does, and decompressing samples of an index written before it
  recorded ``max_sample_bytes``): the bytes of its tar records (headers, data, padding), after
  decompression. Readers take it as the ``max_sample_bytes`` argument.
"""

from __future__ import annotations

import re
from typing import NoReturn

from streamio.errors import ShardFormatError

BLOCK = 512
#: Bytes of pax extended headers and GNU long names / link names accepted before one member.
MAX_META_BYTES = 1 << 20

_OCTAL = re.compile(rb" *([0-7]*) *")
_DECIMAL = re.compile(rb"[0-9]{1,19}")
_PAX_LENGTH_DIGITS = 19


def octal(field: bytes) -> int | None:
    """An octal header field as tar writers write it, or None if it is not one."""
    head = field.split(b"\0", 1)[0]
    if head.isdigit():  # the common case, "%011o\0": ASCII digits only (no sign, space or "_")
        try:
            return int(head, 8)
        except ValueError:
            return None  # an 8 or a 9
    match = _OCTAL.fullmatch(head)
    if match is None:
        return None
    digits = match.group(1)
    return int(digits, 8) if digits else 0


def member_size(block: bytes, *, url: str, at: int) -> int:
    """The size field of the header ``block`` at byte ``at`` of shard ``url``: non-negative, or an error."""
    field = block[124:136]
    if field[0] == 0x80:  # GNU base-256, positive
        return int.from_bytes(field[1:], "big")
    if field[0] & 0x80:
        kind = "a negative base-256 number" if field[0] == 0xFF else "not a number"
        raise ShardFormatError(
            f"shard {url!r}: the tar header at byte {at} has size field {field!r}, {kind}: the shard is damaged "
            f"or hostile. Re-create it, or remove it from the dataset."
        )
    size = octal(field)
    if size is None:
        raise ShardFormatError(
            f"shard {url!r}: the tar header at byte {at} has size field {field!r}, not an octal number: the shard "
            f"is damaged or hostile. Re-create it, or remove it from the dataset."
        )
    return size


def checksum_ok(block: bytes) -> bool:
    """Whether a 512-byte header's checksum field matches its bytes (unsigned or signed sum)."""
    stored = octal(block[148:156])
    if stored is None:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 256
    if stored == unsigned:
        return True
    signed = unsigned - 2 * sum(b for b in block if b > 127) + 2 * sum(b for b in block[148:156] if b > 127)
    return stored == signed


def pax_records(data: bytes, *, url: str, at: int) -> dict[str, str]:
    """The ``key -> value`` records of the pax extended header at byte ``at`` (its data ``data``)."""
    out: dict[str, str] = {}
    pos, n = 0, len(data)
    while pos < n:
        if data[pos] == 0:  # NUL padding after the last record
            if data.count(0, pos) != n - pos:
                _bad_pax(url, at, pos, "bytes after NUL padding")
            break
        space = data.find(b" ", pos, min(n, pos + _PAX_LENGTH_DIGITS + 1))
        if space < 0 or not _DECIMAL.fullmatch(data, pos, space):
            _bad_pax(url, at, pos, "no decimal length before a space")
        length = int(data[pos:space])
        end = pos + length
        if length < space - pos + 4:  # digits, ' ', a key byte, '=', '\n'
            _bad_pax(url, at, pos, f"length {length} does not cover the record's own header")
        if end > n:
            _bad_pax(url, at, pos, f"length {length} runs past the header's {n} bytes")
        if data[end - 1] != 0x0A:
            _bad_pax(url, at, pos, "the record does not end with a newline")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq or not key:
            _bad_pax(url, at, pos, "no 'key=' in the record")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


def pax_size(value: str, *, url: str, at: int) -> int:
    """A pax ``size`` record's value: 1-19 decimal digits, or an error."""
    raw = value.encode("utf-8", "surrogateescape")
    if not _DECIMAL.fullmatch(raw):
        raise ShardFormatError(
            f"shard {url!r}: the member whose header is at byte {at} has pax size={value[:40]!r}, not a decimal "
            f"number of at most 19 digits: the shard is damaged or hostile. Re-create it, or remove it from the "
            f"dataset."
        )
    return int(raw)


def _bad_pax(url: str, at: int, pos: int, why: str) -> NoReturn:
    raise ShardFormatError(
        f"shard {url!r}: malformed pax header at byte {at} (record at byte {pos} of its data: {why}); the shard "
        f"is damaged or not a tar. Re-create it, or remove it from the dataset."
    )
