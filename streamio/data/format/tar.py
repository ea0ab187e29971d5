"""Tar bytes <-> members: the deterministic tar encoding the writer uses, and a streaming parser.

A shard is a WebDataset tar (docs/design.md "Dataset format"); this module knows its records and
nothing of samples, layouts or indexes. :func:`member_record` and :func:`encode_sample` write
them; :func:`iter_members` reads them back as ``(offset, name, data)``, and
:mod:`streamio.data.format.samples` groups those into samples and verifies them.

Design and reasons:

* **Deterministic bytes**: fixed mtime (0), owner (0/0, no names) and mode (0644); a pax extended
  header only for names that are not ASCII or longer than 100 bytes and for members of 8 GiB or
  more. The same members give the same bytes on any machine, at any time.
* **Our own 512-byte header parser** (ustar, GNU longname ``L``, pax ``path``/``size``), not
  ``tarfile``: tarfile costs a ``TarInfo`` object and several small reads per member and stops
  *silently* on a shard cut at a header boundary. Here a stream that ends without the
  end-of-archive block, inside a header or inside a member is a :class:`ShardFormatError` naming
  the shard, the byte offset and the member.
* **Streaming**: bytes arrive as an iterable of chunks (``Store.iter_bytes``) read through a
  :class:`ChunkReader`; only the member being assembled is held. A member lying inside one chunk
  costs one copy (the slice handed out); one straddling chunks is joined once.
* **Bounded**: a shard is untrusted input. Header fields are parsed strictly and every size is
  checked before anything is read on its word (:mod:`streamio.data.format.tarfields`: no negative or
  unparseable size, pax records that always advance, extended headers of at most 1 MiB), so
  time is linear in the bytes given and memory is one member of at most ``max_sample_bytes``.
* **Safe names**: absolute paths, ``..`` components, links, devices and FIFOs are refused
  (nothing is ever extracted; only regular files become members). Directory entries are skipped.

A problem confined to one member (an unsafe name or type, a member over the size limit) is a
:class:`MemberError`, which a ``handler(exc) -> bool`` may skip (see :mod:`streamio.data.format.samples`);
any other :class:`ShardFormatError` means the rest of the stream cannot be located.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from streamio.data.format.layout import GZIP_MAGIC, MAX_SAMPLE_BYTES, gzip_advice, unsafe_reason
from streamio.data.format.tarfields import BLOCK, MAX_META_BYTES, checksum_ok, member_size, pax_records, pax_size
from streamio.errors import ShardFormatError

END_OF_ARCHIVE = bytes(2 * BLOCK)
_ZERO_BLOCK = bytes(BLOCK)
# Fixed header fields: same input -> identical bytes, whoever writes and whenever.
MTIME = 0
MODE = 0o644
_PAX_NAME = b"././@PaxHeader"
_MAX_OCTAL_SIZE = 8**11 - 1
_REGULAR = (b"0", b"\0", b"7")
_META_KINDS = {  # headers that describe the next member: their size counts against MAX_META_BYTES
    b"x": "pax extended header", b"g": "pax global header", b"L": "GNU long name", b"K": "GNU long link name",
}
_META = tuple(_META_KINDS)
_UNSAFE_TYPES = {b"1": "hard link", b"2": "symbolic link", b"3": "character device", b"4": "block device", b"6": "FIFO"}

#: ``handler(exc) -> bool``: True skips what ``exc`` is about (the WebDataset convention).
Handler = Callable[[Exception], bool]


# ----------------------------------------------------------------------------- writing
def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(key: bytes, value: bytes) -> bytes:
    payload = len(key) + len(value) + 3  # ' ', '=', '\n'
    n = payload + len(str(payload))
    while n != payload + len(str(n)):
        n = payload + len(str(n))
    return b"%d %s=%s\n" % (n, key, value)


def _template() -> bytes:
    h = bytearray(BLOCK)
    h[100:108] = _octal(MODE, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    h[136:148] = _octal(MTIME, 12)
    h[148:156] = b" " * 8  # the checksum field counts as spaces
    h[257:265] = b"ustar\x0000"
    return bytes(h)


_TEMPLATE = _template()
_TEMPLATE_SUM = sum(_TEMPLATE)


def _header(name: bytes, size: int, typeflag: bytes) -> bytearray:
    h = bytearray(_TEMPLATE)
    h[0 : len(name)] = name
    if size <= _MAX_OCTAL_SIZE:
        field = _octal(size, 12)
    else:  # GNU base-256; the pax "size" record says it too
        field = b"\x80" + size.to_bytes(11, "big")
    h[124:136] = field
    h[156:157] = typeflag
    h[148:156] = b"%06o\0 " % (_TEMPLATE_SUM + sum(name) + sum(field) + typeflag[0])
    return h


def _padding(size: int) -> bytes:
    return _ZERO_BLOCK[: -size % BLOCK]


def member_record(name: str, size: int) -> bytes:
    """The header block(s) of a regular-file member ``name`` of ``size`` bytes (deterministic).

    Names that are not ASCII or longer than 100 bytes, and sizes of 8 GiB or more, get a pax
    extended header first (POSIX.1-2001; read by tarfile, GNU tar, webdataset).
    """
    raw = name.encode("utf-8")
    if len(raw) <= 100 and raw.isascii() and size <= _MAX_OCTAL_SIZE:
        return bytes(_header(raw, size, b"0"))
    records = _pax_record(b"path", raw)
    if size > _MAX_OCTAL_SIZE:
        records += _pax_record(b"size", b"%d" % size)
    fallback = raw[:100].decode("utf-8", "ignore").encode("ascii", "replace")
    return b"".join(
        (
            bytes(_header(_PAX_NAME, len(records), b"x")), records, _padding(len(records)),
            bytes(_header(fallback, size, b"0")),
        )
    )


def encode_sample(members: Iterable[tuple[str, bytes]]) -> list[bytes]:
    """Tar records of one sample's members, as pieces (headers, data, padding) to join or hash."""
    pieces: list[bytes] = []
    for name, data in members:
        pieces.append(member_record(name, len(data)))
        pieces.append(data)
        pad = -len(data) % BLOCK
        if pad:
            pieces.append(_ZERO_BLOCK[:pad])
    return pieces


# ----------------------------------------------------------------------------- reading
class ChunkReader:
    """Exact-size reads from an iterable of chunks, tracking the absolute byte offset."""

    __slots__ = ("_it", "_buf", "_pos", "offset")

    def __init__(self, chunks: Iterable[bytes], offset: int) -> None:
        self._it = iter(chunks)
        self._buf: bytes | memoryview = b""
        self._pos = 0
        self.offset = offset

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer only at the end of the stream), copied at most once."""
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            self.offset += n
            if type(buf) is bytes:
                return buf if (pos == 0 and end == len(buf)) else buf[pos:end]
            return bytes(buf[pos:end])  # a memoryview chunk (e.g. of an mmapped cache file)
        parts: list[Any] = [memoryview(buf)[pos:]] if pos < len(buf) else []
        have = len(buf) - pos
        self._buf, self._pos = b"", 0
        while have < n:
            chunk = next(self._it, None)
            if chunk is None:
                break
            if type(chunk) is not bytes:
                view = memoryview(chunk)
                # a read-only view (an mmapped cache file) is sliced without a copy; a writable
                # buffer is copied, as its producer may refill it once the next chunk is asked for
                chunk = view.cast("B") if view.readonly else bytes(view)
            need = n - have
            if len(chunk) <= need:
                parts.append(chunk)
                have += len(chunk)
            else:
                parts.append(memoryview(chunk)[:need])
                self._buf, self._pos = chunk, need
                have = n
        self.offset += have
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)

    def view(self, n: int) -> bytes | memoryview:
        """The next ``n`` bytes (fewer only at the end), as a view into the current chunk when they lie inside it.

        No copy for a range inside one ``bytes`` chunk (the common case: a sample inside a 1 MiB
        piece); the view keeps that chunk alive, not the reader. Otherwise as :meth:`take`.
        """
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf) and type(buf) is bytes:
            self._pos = end
            self.offset += n
            return memoryview(buf)[pos:end]
        return self.take(n)

    def skip(self, n: int) -> int:
        """Pass over the next ``n`` bytes without keeping them; returns how many there were."""
        left = n
        while left:
            avail = len(self._buf) - self._pos
            if avail <= 0:
                chunk = next(self._it, None)
                if chunk is None:
                    break
                self._buf, self._pos = chunk, 0
                continue
            k = min(avail, left)
            self._pos += k
            left -= k
        self.offset += n - left
        return n - left


class MemberError(ShardFormatError):
    """A problem confined to one member (or one sample's grouping); a handler may skip it."""


def iter_members(
    chunks: Iterable[bytes],
    *,
    url: str,
    start_offset: int = 0,
    require_end: bool = True,
    handler: Handler | None = None,
    on_end: Callable[[int], None] | None = None,
    max_sample_bytes: int = MAX_SAMPLE_BYTES,
    keep_data: bool | Callable[[str], int] = True,
) -> Iterator[tuple[int, str, bytes]]:
    """Regular-file members of a tar byte stream: ``(offset of its first header, name, data)``.

    Every header field used is parsed strictly (:mod:`streamio.data.format.tarfields`) and every size is
    checked against its limit before a byte is read on its word, so time is linear in the bytes
    given and memory is one member (at most ``max_sample_bytes``) plus its extended headers (at
    most :data:`~streamio.data.format.tarfields.MAX_META_BYTES`).

    Args:
        chunks: the tar bytes, in pieces of any size.
        url: the shard, for messages.
        start_offset: absolute offset of the first byte of ``chunks`` (for messages and offsets).
        require_end: a stream that ends at a header boundary without the end-of-archive block is
            truncated (True), or simply the end of a run of samples (False).
        handler: may skip a :class:`MemberError` (True); see :mod:`streamio.data.format.samples`.
        on_end: called with the offset of the end-of-archive block when the parser reaches it.
        max_sample_bytes: a member declaring more is refused (a handler may skip it).
        keep_data: False passes over member data without keeping it (``data`` is ``b""``): what
            an index scan needs; a function of the member's name keeps that many first bytes of
            it, as a :class:`MemberHead` that also says the whole member's size (0: ``b""``).

    Raises:
        ShardFormatError: truncated or non-tar bytes, an invalid or over-limit header field, an
            unsafe or over-limit member (unless the handler skips it).
    """
    src = ChunkReader(chunks, start_offset)
    ext: _Extended | None = None  # extended headers read for the next member, if any
    last_name = None
    while True:
        at = src.offset
        block = _next_header(src, url, last_name, ending_ok=not require_end and ext is None, on_end=on_end)
        if block is None:
            return
        typeflag = block[156:157]
        size = member_size(block, url=url, at=at)
        if typeflag in _META:
            ext = ext or _Extended(at)
            ext.check(url, typeflag, at, size)
            ext.add(typeflag, _member_data(src, size, url, at, _name(block, ext), keep=True), url, at)
            continue
        if ext is not None and "size" in ext.pax:
            size = pax_size(ext.pax["size"], url=url, at=at)
        name, member_start = _name(block, ext), (at if ext is None else ext.first)
        ext = None
        last_name = name
        name = name[2:] if name.startswith("./") else name
        problem = _problem(typeflag, name, member_start, size, max_sample_bytes)
        if problem is not None:
            exc = MemberError(f"shard {url!r}: {problem}. Remove it from the shard, or pass a handler that skips it.")
            if handler is None or not handler(exc):
                raise exc
        wanted = problem is None and typeflag in _REGULAR
        keep = keep_data(name) if callable(keep_data) and wanted else keep_data is True and wanted
        data = _member_data(src, size, url, at, name, keep=keep)
        if wanted:
            yield member_start, name, data


class _Extended:
    """The pax records and GNU long name read for the member that follows them, and their size."""

    __slots__ = ("first", "long_name", "pax", "size")

    def __init__(self, first: int) -> None:
        self.first = first  # offset of the first header of the member they belong to
        self.long_name: str | None = None
        self.pax: dict[str, str] = {}
        self.size = 0

    def check(self, url: str, typeflag: bytes, at: int, size: int) -> None:
        """Refuse extended headers past :data:`MAX_META_BYTES` before their data is read."""
        self.size += BLOCK + size
        if self.size > MAX_META_BYTES:
            raise ShardFormatError(
                f"shard {url!r}: the {_META_KINDS[typeflag]} at byte {at} ({size} bytes) brings the extended headers "
                f"of one member to {self.size} bytes, over the limit of {MAX_META_BYTES}: the shard is damaged or "
                f"hostile. Re-create it, or remove it from the dataset."
            )

    def add(self, typeflag: bytes, data: bytes, url: str, at: int) -> None:
        if typeflag == b"L":
            self.long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif typeflag == b"x":
            self.pax.update(pax_records(data, url=url, at=at))


def _next_header(
    src: ChunkReader, url: str, last_name: str | None, *, ending_ok: bool, on_end: Callable[[int], None] | None
) -> bytes | None:
    """The next header block; None at the end-of-archive block (``on_end`` is told) or where a run may end."""
    at = src.offset
    block = src.take(BLOCK)
    if last_name is None and block.startswith(GZIP_MAGIC):
        raise ShardFormatError(f"shard {url!r} is gzip-compressed, not a tar: {gzip_advice(url)}")
    if len(block) < BLOCK:
        if not block and ending_ok:
            return None
        where = "inside a header" if block else "without the end-of-archive block"
        raise ShardFormatError(
            f"shard {url!r} ends at byte {src.offset}{_after(last_name)}, {where}: it is truncated. "
            f"Re-fetch it or re-run `streamio verify` on its dataset."
        )
    if block == _ZERO_BLOCK:
        if on_end is not None:
            on_end(at)
        return None
    if not checksum_ok(block):
        raise ShardFormatError(
            f"shard {url!r}: the 512 bytes at offset {at}{_after(last_name)} are not a valid tar header (bad "
            f"checksum): the shard is damaged or not a tar file"
        )
    return block


def _after(last_name: str | None) -> str:
    return f" after member {last_name!r}" if last_name else ""


def _problem(typeflag: bytes, name: str, start: int, size: int, limit: int) -> str | None:
    """Why the member must not be read (a handler may skip it), or None."""
    if typeflag == b"5":
        return None  # a directory: skipped, nothing to read
    if typeflag not in _REGULAR:
        kind = _UNSAFE_TYPES.get(typeflag, f"type {typeflag!r}")
        return f"member {name!r} at byte {start} is a {kind}; only regular files are read"
    reason = unsafe_reason(name)
    if reason:
        return f"member {name!r} at byte {start} is unsafe to read: {reason}"
    if size > limit:
        return (
            f"member {name!r} at byte {start} declares {size} bytes, more than the {limit} a sample may hold "
            f"(max_sample_bytes)"
        )
    return None


class MemberHead(bytes):
    """The first bytes of a member's data; :attr:`size` is the whole member's (``iter_members(keep_data=f)``)."""
    size: int


def _member_data(src: ChunkReader, size: int, url: str, at: int, name: str, *, keep: bool | int) -> bytes:
    """The member's data (padding passed over): all (``keep=True``), ``b""`` or a :class:`MemberHead` of ``keep``."""
    pad, want = -size % BLOCK, size if keep is True else min(int(keep), size)
    data = src.take(want) if want else b""
    got = len(data) + (src.skip(size - want) if len(data) == want else 0)
    if got < size or (pad and src.skip(pad) < pad):
        raise ShardFormatError(
            f"shard {url!r} ends at byte {src.offset} inside member {name!r} "
            f"(header at {at}, {size} bytes announced): it is truncated. Re-fetch it or re-run `streamio verify`."
        )
    if isinstance(keep, bool):
        return data
    head = MemberHead(data)
    head.size = size
    return head


def _name(block: bytes, ext: _Extended | None) -> str:
    if ext is not None:
        if "path" in ext.pax:
            return ext.pax["path"]
        if ext.long_name is not None:
            return ext.long_name
    name = block[0:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix field (GNU uses these bytes otherwise)
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")
